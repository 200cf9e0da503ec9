"""A drop-in for tf.compat.v1.train.MonitoredTrainingSession that trains epoch-synchronously.

It takes MonitoredTrainingSession's arguments (same names, order and, where epochs allow, the
same defaults) plus the epoch-sync pieces, and returns the same `MonitoredSession`. Changing a
job is the import plus `epoch_input=` (and the sync optimizer, if any). Differences from stock:

  - workers re-check the chief's initialisation every `poll_secs` (0.5 s), not every 30 s, and
    every task waits for the ps tasks (and a worker for the chief) with a deadline, names a
    dead one (hooks.faults.liveness), and never silently re-creates a lost session;
  - the chief saves once per epoch, after every worker finished it, and (save_checkpoint_secs/
    _steps, as stock's: 600 s by default) mid-epoch checkpoints with every worker's position in
    its shard, which a relaunch resumes exactly (hooks.checkpoint.mid_epoch); a CheckpointSaverHook (it
    would save no position) or a StopAtStepHook is refused;
  - max_wait_secs defaults to --epochsync_startup_timeout_secs, and its timeout names the chief;
  - config without device_filters gets this task's (the ps tasks and itself).

Typical usage:
  with hooks.monitored_training_session(
      master=server.target, is_chief=config.is_chief, checkpoint_dir=model_dir,
      epoch_input=epoch_input, sync_optimizer=opt) as sess:
    while not sess.should_stop(): sess.run(train_op)
"""

import inspect
from typing import Any, List, Optional, Sequence, Tuple

import tensorflow as tf

from hooks import log as logging
from hooks.config.cluster import ClusterConfig
from hooks.data.epoch_input import EpochInput
from hooks.session.wiring import epoch_sync_hooks
from hooks.errors import raise_if_problems
from hooks.config import setting_sources
from hooks.faults import liveness as liveness_lib
from hooks.session.creators import EpochSyncChiefSessionCreator, FastWorkerSessionCreator
from hooks.config.settings import EpochSyncSettings
from hooks.sync.step_counter import SyncStepCounterHook
from hooks.sync.tokens import SafeSyncTokensHook

__all__ = ["monitored_training_session", "USE_DEFAULT"]

_v1 = tf.compat.v1
# Stock's own sentinel ("argument not given"), so that passing it explicitly behaves as stock.
USE_DEFAULT = inspect.signature(
    _v1.train.MonitoredTrainingSession).parameters["save_checkpoint_secs"].default
_WHY_NO_MID_EPOCH = (
    "would save checkpoints in the middle of an epoch without the workers' positions in their "
    "shards: a restart from one re-trains or skips examples. tf-epochsync saves them itself: "
    "pass save_checkpoint_secs or save_checkpoint_steps instead")


def monitored_training_session(
    master: str = "", is_chief: bool = True, checkpoint_dir: Optional[str] = None,
    scaffold: Optional[_v1.train.Scaffold] = None,
    hooks: Optional[Sequence[_v1.train.SessionRunHook]] = None,
    chief_only_hooks: Optional[Sequence[_v1.train.SessionRunHook]] = None,
    save_checkpoint_secs: Any = USE_DEFAULT, save_summaries_steps: Any = USE_DEFAULT,
    save_summaries_secs: Any = USE_DEFAULT, config: Optional[_v1.ConfigProto] = None,
    stop_grace_period_secs: float = 120, log_step_count_steps: int = 100,
    max_wait_secs: Any = USE_DEFAULT, save_checkpoint_steps: Any = USE_DEFAULT,
    summary_dir: Optional[str] = None, save_graph_def: bool = True, *,
    epoch_input: EpochInput, settings: Optional[EpochSyncSettings] = None,
    sync_optimizer: Any = None, sync_hook: Optional[SafeSyncTokensHook] = None,
    cluster: Optional[ClusterConfig] = None,
    listeners: Sequence[_v1.train.CheckpointSaverListener] = (),
    poll_secs: float = 0.5) -> _v1.train.MonitoredSession:
  """MonitoredTrainingSession with epoch-synchronous training; returns a MonitoredSession.

  Use it where you call tf.compat.v1.train.MonitoredTrainingSession in a between-graph
  parameter-server job. The loop stays `while not sess.should_stop(): sess.run(train_op)`;
  the session stops by itself after `settings.num_epochs` epochs.

    with monitored_training_session(master=server.target, is_chief=config.is_chief,
                                    checkpoint_dir=model_dir, hooks=my_hooks,
                                    epoch_input=epoch_input, sync_optimizer=opt) as sess:
      while not sess.should_stop(): sess.run(train_op)

  Args:
    master ... save_graph_def: as tf.compat.v1.train.MonitoredTrainingSession, except:
      save_checkpoint_secs / save_checkpoint_steps: the period of the mid-epoch checkpoints
        (None or 0: none); neither given: settings.save_checkpoint_secs/_steps (600 s);
      max_wait_secs: a task's wait for the tasks it needs (a worker's for the chief's
        initialisation, the chief's for the ps tasks); default settings.startup_timeout_secs;
      config: a ConfigProto without device_filters gets `cluster.device_filters`; None:
        `cluster.session_config()`.
      The chief's checkpoint_dir also gets the epoch audit and, in `<summary_dir>/epochsync`,
      the per-epoch TensorBoard scalars. master must be this task's server target.
    epoch_input: the `EpochInput` the model reads from (required).
    settings: `EpochSyncSettings`; default `hooks.config.flags.settings_from_flags()` (the
      --epochsync_* flags, else the EPOCHSYNC_* variables, else the defaults).
    sync_optimizer: a `WorkerDoneSyncReplicasOptimizer` whose minimize() was called; its hook
      is made here. Or pass its hook as `sync_hook`, or in `hooks` (found there).
    sync_hook: the optimizer's `make_session_run_hook(is_chief, num_tokens=0)`.
    cluster: this task's `ClusterConfig`; default `hooks.config.flags.cluster_from_flags()`
      (TF_CONFIG, else the cluster flags).
    listeners: `CheckpointSaverListener`s around each epoch checkpoint (e.g. evaluation).
    poll_secs: `float`, how often a worker re-checks the chief's initialisation.

  Raises:
    ConfigError: listing every problem (mid-epoch checkpoints, is_chief or the optimizer's
      worker disagreeing with the cluster, a stock SyncReplicasOptimizer hook, ...) with its fix.
  """
  raise_if_problems(_argument_problems(epoch_input, settings, master),
                    "monitored_training_session arguments")

  if settings is None or cluster is None:
    from hooks.config import flags as epochsync_flags  # pylint: disable=g-import-not-at-top
    settings = settings or epochsync_flags.settings_from_flags()
    cluster = cluster or epochsync_flags.cluster_from_flags()
  settings = _with_save_period(settings, save_checkpoint_secs, save_checkpoint_steps)
  hooks, chief_only_hooks = list(hooks or []), list(chief_only_hooks or [])
  problems = _cluster_problems(cluster, is_chief)
  sync_hook, more = _sync_hook(cluster, settings, sync_optimizer, sync_hook, hooks,
                               chief_only_hooks)
  problems += more + _hook_problems(hooks + chief_only_hooks)
  raise_if_problems(problems, "monitored_training_session arguments")

  save_summaries_steps, save_summaries_secs = _summary_period(save_summaries_steps,
                                                             save_summaries_secs)
  if max_wait_secs is USE_DEFAULT:
    max_wait_secs = settings.startup_timeout_secs
  scaffold = scaffold or _v1.train.Scaffold()
  session_config = _with_device_filters(config, cluster)
  summary_dir = summary_dir or checkpoint_dir

  epoch_hooks = epoch_sync_hooks(cluster, epoch_input, settings, model_dir=checkpoint_dir,
                                 listeners=listeners, sync_hook=sync_hook,
                                 summary_dir=summary_dir, save_graph_def=save_graph_def)
  driver = epoch_hooks.pop()  # epoch_input.hook: runs last, after every other after_run
  monitor = liveness_lib.monitor_for(cluster)  # the same monitor as the epoch hooks' 
  all_hooks = epoch_hooks
  if cluster.is_chief:
    all_hooks += chief_only_hooks + _summary_hooks(scaffold, summary_dir, log_step_count_steps,
                                                   save_summaries_steps, save_summaries_secs)
    creator = EpochSyncChiefSessionCreator(
        scaffold=scaffold, master=master, config=session_config, checkpoint_dir=checkpoint_dir,
        liveness=monitor, startup_timeout_secs=max_wait_secs, task_name=cluster.task_name,
        worker_names=cluster.worker_names)
  else:
    creator = FastWorkerSessionCreator(
        scaffold=scaffold, master=master, config=session_config, max_wait_secs=max_wait_secs,
        poll_secs=poll_secs, task_name=cluster.task_name, chief_name=cluster.worker_names[0],
        liveness=monitor, worker_names=cluster.worker_names)
  all_hooks += hooks + [driver]
  logging.info("%s: epoch-synchronous MonitoredTrainingSession, %d epochs, %d hooks: %s",
               cluster.task_name, settings.num_epochs, len(all_hooks),
               ", ".join(type(h).__name__ for h in all_hooks))
  return _v1.train.MonitoredSession(session_creator=creator, hooks=all_hooks,
                                    stop_grace_period_secs=stop_grace_period_secs)


def _argument_problems(epoch_input: Any, settings: Any, master: str) -> List[str]:
  problems = []
  if not isinstance(epoch_input, EpochInput):
    problems.append(f"epoch_input={epoch_input!r} must be the EpochInput the model reads from "
                    "(hooks.EpochInput(shard_dataset, num_epochs, task_name))")
  if settings is not None and not isinstance(settings, EpochSyncSettings):
    problems.append(f"settings={settings!r} must be an EpochSyncSettings or None")
  if not master:
    problems.append("master='' would run a local in-process session that cannot reach the ps "
                    "tasks; pass master=server.target (this task's tf.distribute.Server)")
  return problems


def _summary_period(steps: Any, secs: Any) -> Tuple[Any, Any]:
  """MonitoredTrainingSession's defaults: every 100 steps unless either is given."""
  if steps is USE_DEFAULT and secs is USE_DEFAULT:
    return 100, None
  return (None if steps is USE_DEFAULT else steps), (None if secs is USE_DEFAULT else secs)


def _summary_hooks(scaffold, summary_dir: Optional[str], log_step_count_steps: int,
                   save_summaries_steps: Any, save_summaries_secs: Any) -> List[Any]:
  """The chief's step counter and summary saver, as MonitoredTrainingSession adds them."""
  hooks = []
  if summary_dir and log_step_count_steps and log_step_count_steps > 0:
    hooks.append(SyncStepCounterHook(output_dir=summary_dir, every_n_steps=log_step_count_steps))
  if summary_dir and ((save_summaries_steps and save_summaries_steps > 0) or
                      (save_summaries_secs and save_summaries_secs > 0)):
    hooks.append(_v1.train.SummarySaverHook(
        scaffold=scaffold, save_steps=save_summaries_steps, save_secs=save_summaries_secs,
        output_dir=summary_dir))
  return hooks


def _with_save_period(settings: EpochSyncSettings, secs: Any, steps: Any) -> EpochSyncSettings:
  """`settings` with MonitoredTrainingSession's save_checkpoint_secs/_steps, if either is given."""
  if secs is USE_DEFAULT and steps is USE_DEFAULT:
    return settings
  secs, steps = (v if v is not USE_DEFAULT and v is not None and v > 0 else 0
                 for v in (secs, steps))  # As stock: None or <= 0 saves nothing.
  return setting_sources.combine(settings, dict(save_checkpoint_secs=secs,
                                                save_checkpoint_steps=steps),
                                 setting_sources.sources_of(settings))


def _cluster_problems(cluster: Any, is_chief: Any) -> List[str]:
  if not isinstance(cluster, ClusterConfig):
    return [f"cluster={cluster!r} must be a ClusterConfig (hooks.config.flags.cluster_from_flags())"]
  if cluster.is_ps or cluster.is_evaluator:
    return [f"this task is {cluster.task_name}: only chief and worker tasks train; a ps task "
            "runs server.join(), an evaluator evaluates the epoch checkpoints"]
  if bool(is_chief) != cluster.is_chief:
    return [f"is_chief={is_chief!r} but {cluster.source} makes {cluster.worker_names[0]} the "
            f"chief and this task is {cluster.task_name}; pass is_chief=config.is_chief"]
  return []


def _sync_hook(cluster: ClusterConfig, settings: EpochSyncSettings, sync_optimizer: Any,
               sync_hook: Any, hooks: List[Any], chief_only_hooks: List[Any]):
  """The sync optimizer's hook (made, given, or taken out of `hooks`), and any problems."""
  found = [h for h in hooks + chief_only_hooks if isinstance(h, SafeSyncTokensHook)]
  for h in found:  # Taken out: it must run first, and on every task.
    (hooks if h in hooks else chief_only_hooks).remove(h)
  given = [what for what, v in (("sync_optimizer", sync_optimizer), ("sync_hook", sync_hook),
                                ("a SafeSyncTokensHook in hooks", found or None)) if v]
  if len(given) > 1 or len(found) > 1:
    return None, [f"the synchronous optimizer is given more than once ({', '.join(given)}); "
                  "pass one of sync_optimizer=opt, sync_hook=opt.make_session_run_hook(...), "
                  "or its hook in hooks"]
  if isinstance(cluster, ClusterConfig) and (cluster.is_ps or cluster.is_evaluator):
    return None, []
  if sync_optimizer is not None:
    from hooks.sync.optimizer import WorkerDoneSyncReplicasOptimizer  # pylint: disable=g-import-not-at-top
    if not isinstance(sync_optimizer, WorkerDoneSyncReplicasOptimizer):
      return None, [f"sync_optimizer={type(sync_optimizer).__name__} must be a "
                    "WorkerDoneSyncReplicasOptimizer (for asynchronous training pass no "
                    "sync_optimizer: a plain optimizer needs no hook)"]
    sync_hook = sync_optimizer.make_session_run_hook(
        cluster.is_chief, num_tokens=0, step_timeout_secs=settings.step_timeout_secs,
        warn_after_secs=min(settings.warn_after_secs, settings.step_timeout_secs / 2),
        log_every_secs=settings.log_every_secs)
  sync_hook = sync_hook or (found[0] if found else None)
  if sync_hook is None:
    return None, []
  if not isinstance(sync_hook, SafeSyncTokensHook):
    return None, [f"sync_hook={type(sync_hook).__name__} must come from "
                  "WorkerDoneSyncReplicasOptimizer.make_session_run_hook()"]
  opt = sync_hook._opt  # pylint: disable=protected-access
  problems = []
  if (opt.num_workers, opt.worker_id) != (cluster.num_workers, cluster.worker_id):
    problems.append(f"the sync optimizer was built for worker_id={opt.worker_id} of "
                    f"num_workers={opt.num_workers}, but this task is {cluster.task_name}, worker "
                    f"{cluster.worker_id} of {cluster.num_workers}; build it with "
                    "config.num_workers and config.worker_id (or from TF_CONFIG)")
  if sync_hook._is_chief != cluster.is_chief:  # pylint: disable=protected-access
    problems.append(f"the sync hook was made with is_chief={sync_hook._is_chief} but this task "  # pylint: disable=protected-access
                    f"is {cluster.task_name}; call make_session_run_hook(config.is_chief)")
  return sync_hook, problems


def _hook_problems(hooks: Sequence[Any]) -> List[str]:
  problems = []
  for h in hooks:
    name = type(h).__name__
    if name == "_SyncReplicasOptimizerHook":
      problems.append("a stock SyncReplicasOptimizer hook is in hooks: it waits for "
                      "replicas_to_aggregate gradients every step and hangs at the end of an epoch "
                      "on uneven shards; use hooks.WorkerDoneSyncReplicasOptimizer (same "
                      "constructor arguments)")
    elif isinstance(h, _v1.train.CheckpointSaverHook):
      problems.append(f"a CheckpointSaverHook is in hooks: it {_WHY_NO_MID_EPOCH}; remove it "
                      "(CheckpointSaverListeners go to listeners=)")
    elif isinstance(h, _v1.train.StopAtStepHook):
      problems.append("a StopAtStepHook is in hooks: a global step would end training in the "
                      "middle of an epoch; remove it, the session stops after num_epochs")
  return problems


def _with_device_filters(config: Optional[_v1.ConfigProto], cluster: ClusterConfig):
  """`config` (copied) with this task's device filters if it has none (and, on a worker beyond
  the launch's cluster, the cluster its session brings: `ClusterConfig.with_propagated_cluster`)."""
  if config is None:
    return cluster.session_config()
  if config.device_filters and not cluster.beyond_launch:
    return config
  out = _v1.ConfigProto()
  out.CopyFrom(config)
  if not config.device_filters:
    out.device_filters.extend(cluster.device_filters)
    logging.info("%s: session config without device_filters: using %s", cluster.task_name,
                 cluster.device_filters)
  return cluster.with_propagated_cluster(out)
