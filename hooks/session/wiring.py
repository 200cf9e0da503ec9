"""Builds the right set of epoch-sync hooks for this task from its config and settings.

Typical usage:
  epoch_input = EpochInput(shard, num_epochs=settings.num_epochs, task_name=config.task_name)
  train_op = build(epoch_input.get_next())
  hooks = epoch_sync_hooks(config, epoch_input, settings, model_dir=model_dir)
  with tf.compat.v1.train.MonitoredSession(
      session_creator=session_creator(config, server.target, checkpoint_dir=model_dir),
      hooks=hooks) as sess:
    while not sess.should_stop(): sess.run(train_op)
"""

from typing import Any, List, Optional, Sequence

import tensorflow as tf

from hooks.data import determinism
from hooks.faults import liveness
from hooks.config import setting_sources
from hooks.epoch.barrier import EpochBarrierHook
from hooks.checkpoint.epoch_save import ChiefSaveAfterBarrierHook
from hooks.config.cluster import ClusterConfig
from hooks.sync.aggregation_group import AggregationGroup
from hooks.sync.done_counter import WorkerDoneHook
from hooks.data.epoch_input import EpochInput
from hooks.epoch.summaries import EpochSummaryHook
from hooks.checkpoint.mid_epoch import MidEpochSaveHook
from hooks.checkpoint.mid_epoch_restore import MidEpochRestoreHook
from hooks.checkpoint.mid_epoch_resume import MidEpochResume
from hooks.checkpoint.state_saver import StateSaverHook
from hooks.checkpoint.unit_resume import UnitResumeHook
from hooks.epoch.progress import EpochProgressHook
from hooks.faults.recovery_guard import RecoveryGuardHook
from hooks.faults.step_watch import StepWatch
from hooks.faults.stuck_step import LOST_AFTER_SECS, StuckStepWatchdog
from hooks.epoch.run_start import RunStartHook
from hooks.session import elastic_sync
from hooks.config.settings import EpochSyncSettings
from hooks.elastic import FenceCheckHook, GuestTakeInHook, LostWorkerWatch, Rejoin
from hooks.elastic.addresses import WorkerAddresses
from hooks.errors import ConfigError
from hooks.workqueue.audit import audit_work_queue
from hooks.workqueue.unit_passes import UnitPasses, work_queue_of

__all__ = ["epoch_sync_hooks"]


def epoch_sync_hooks(config: ClusterConfig, epoch_input: EpochInput,
                     settings: Optional[EpochSyncSettings] = None,
                     model_dir: Optional[str] = None,
                     listeners: Sequence[tf.compat.v1.train.CheckpointSaverListener] = (),
                     sync_hook: Optional[tf.compat.v1.train.SessionRunHook] = None,
                     summary_dir: Optional[str] = None, save_graph_def: bool = True
                     ) -> List[tf.compat.v1.train.SessionRunHook]:
  """The hooks of one training task, in the order they must run.

  The chief also gets the per-epoch save, the mid-epoch saves (`settings.save_checkpoint_secs`
  or `_steps`, hooks.checkpoint.mid_epoch; in synchronous mode only when `sync_hook` is given)
  and the per-epoch TensorBoard scalars (when `model_dir` is set) and writes the audit; every
  task resumes a mid-epoch checkpoint's position (`MidEpochResume`) and logs its progress
  (`EpochProgressHook`). The barrier and `sync_hook` probe the tasks they wait for
  (`hooks.faults.liveness`), so a dead task ends every wait within seconds with TaskDiedError,
  whatever the timeouts.
  A RecoveryGuardHook goes first (with TensorFlow's own session creators it refuses a
  re-created session and ends a task whose session recovery spins on a dead task), then on the
  chief a MidEpochRestoreHook (with TensorFlow's own ChiefSessionCreator, which restores only
  epoch checkpoints, it restores a newer mid-epoch one) and, with a work queue, the
  UnitResumeHook (units the checkpoint holds in part are handed out again after the batches it
  holds), then a RunStartHook (the chief cleans
  what an earlier run left on the ps tasks, the workers wait for it), then `sync_hook` (the
  sync optimizer's `make_session_run_hook`), so the chief's gradient aggregation runs before
  any epoch work; `epoch_input.hook` goes last.

  Args:
    config: this task's `ClusterConfig` (a chief or worker task).
    epoch_input: the `EpochInput` the model reads from.
    settings: `EpochSyncSettings` (timeouts); default `hooks.config.flags.settings_from_flags()`
      (the --epochsync_* flags, else the EPOCHSYNC_* variables, else the defaults).
    model_dir: `str`, checkpoints and the audit; None: neither.
    listeners: `CheckpointSaverListener`s called around each epoch checkpoint.
    sync_hook: the synchronous optimizer's session hook, if one is used; with several sync
      optimizers, an `AggregationGroup` of their hooks (mid-epoch saves see all after a step).
    summary_dir: `str`, where the chief's per-epoch scalars go (in `epochsync/`); default
      model_dir.
    save_graph_def: `bool`, the chief writes graph.pbtxt and a .meta file per checkpoint.

  Raises:
    ConfigError: if the config is not a training task's or a hook rejects its arguments.
  """
  if settings is None:  # As everywhere: the flags, else the EPOCHSYNC_* variables, else defaults.
    from hooks.config import flags as epochsync_flags  # pylint: disable=g-import-not-at-top
    settings = epochsync_flags.settings_from_flags()
  if config.is_chief:
    setting_sources.log_sources_once(settings, config.task_name)
  common = dict(num_workers=config.num_workers, worker_id=config.worker_id,
                worker_names=config.worker_names)
  monitor = liveness.monitor_for(config)
  done = WorkerDoneHook(epoch_input, **common)
  barrier = EpochBarrierHook(
      epoch_input, **common, timeout_secs=settings.barrier_timeout_secs,
      startup_timeout_secs=settings.startup_timeout_secs,
      warn_after_secs=settings.warn_after_secs, log_every_secs=settings.log_every_secs,
      audit_dir=model_dir, liveness=monitor)
  queue = _wire_work_queue(config, epoch_input, monitor, barrier, settings)
  on_lost = None
  if settings.elastic:  # Only the chief acts on a lost worker; no task waits for another worker.
    _check_elastic(queue, settings, sync_hook)
    monitor.expendable = frozenset(config.worker_names[1:])
    if sync_hook is not None:
      on_lost = elastic_sync.wire(queue, sync_hook, settings.step_timeout_secs)
  if hasattr(sync_hook, "use_liveness"):
    sync_hook.use_liveness(monitor, lambda: epoch_input.hook.epoch)
  rejoin, spare_ids = None, _spare_ids(config, settings)
  spare = config.worker_id in spare_ids  # (or an optional worker: it joins from its start too)
  optional = settings.elastic and (settings.optional_workers > 0 or _grows(config))
  if optional:
    barrier.stand_ins.absent_kind = "optional"
  # (a job that may grow) where the workers beyond the launch's cluster listen
  addresses = WorkerAddresses("/job:ps/task:0") if _grows(config) else None
  if settings.elastic and not config.is_chief:
    guest = None if sync_hook is None else elastic_sync.GuestJoin(sync_hook, config.worker_id)
    own = config.target[len("grpc://"):]
    # An optional worker joins at once: no spare stands by for a lost worker (spares=0).
    rejoin = Rejoin(queue, barrier, guest=guest, spares=0 if optional else len(spare_ids),
                    num_epochs=epoch_input.num_epochs, spare=spare,
                    optional=optional and spare, announce=(
                        lambda session: addresses.write(session, config.worker_id, own))
                    if config.beyond_launch else None)
  start = RunStartHook(config.is_chief, config.worker_names[0], monitor,
                       task_name=config.task_name,
                       startup_timeout_secs=settings.startup_timeout_secs,
                       worker_id=config.worker_id, num_workers=config.num_workers,
                       rejoin=rejoin, spare=spare)
  # TensorFlow's session creation waits for the ps tasks, and a worker's for the chief too.
  needed = [n for n in sorted(monitor.addresses) if n.startswith("ps:")]
  needed += [] if config.is_chief else [config.worker_names[0]]
  guard = RecoveryGuardHook(monitor, config.task_name,
                            sorted(set(monitor.addresses) - monitor.expendable),
                            startup_timeout_secs=settings.startup_timeout_secs, needed=needed,
                            stuck_step=_stuck_step_watchdog(config, settings, sync_hook))
  hooks: List[tf.compat.v1.train.SessionRunHook] = [guard]
  if config.is_chief:  # The Scaffold's saver restores another worker count's state fresh.
    hooks.append(StateSaverHook(model_dir))
  if config.is_chief and model_dir:  # Before the run starts: the workers then read its state.
    hooks.append(MidEpochRestoreHook(model_dir, config.num_workers))
    if queue is not None:
      hooks.append(UnitResumeHook(epoch_input, model_dir, barrier, config.worker_names))
  hooks.append(start)
  if isinstance(sync_hook, AggregationGroup):  # Several sync optimizers (e.g. wide & deep).
    hooks += sync_hook.hooks
  elif sync_hook:
    hooks.append(sync_hook)
  secs, steps = settings.save_checkpoint_secs, settings.save_checkpoint_steps
  sync = sync_hook if hasattr(sync_hook, "on_aggregated") else None
  # Synchronous training saves between two aggregations: only with the optimizer's hook here.
  mid_epoch = bool(model_dir and (secs or steps) and (sync is not None or not settings.sync))
  if mid_epoch:  # A resume skips by position: the order must be the same on a rerun.
    determinism.warn_if_nondeterministic(epoch_input.dataset, config.task_name)
  count_applied = (mid_epoch or settings.elastic) and sync is None
  resume = MidEpochResume(epoch_input, **common, count_applied=count_applied)
  if settings.elastic and not config.is_chief:  # A replaced lost worker ends before the barrier.
    hooks.append(FenceCheckHook(queue, rejoin))
  hooks += [done, barrier, resume]
  if settings.elastic and config.is_chief:
    hooks.append(LostWorkerWatch(queue, barrier, monitor, worker_names=config.worker_names,
                                 stalled_after_secs=_stalled_after(settings, sync_hook),
                                 on_lost=on_lost, membership=None if sync_hook is None else
                                 sync_hook.optimizer.sync_ops.guest.membership,
                                 spare_ids=spare_ids, num_epochs=epoch_input.num_epochs,
                                 optional=optional, addresses=addresses))
  if config.is_chief and model_dir:
    hooks.append(ChiefSaveAfterBarrierHook(barrier, model_dir, listeners=listeners,
                                           save_graph_def=save_graph_def))
    if mid_epoch:  # Between two aggregations (sync), or after the chief's steps (async).
      hooks.append(MidEpochSaveHook(
          epoch_input, barrier, model_dir, secs, steps, sync,
          positions=queue.claims.ops.accepted if settings.elastic and sync else None))
  if config.is_chief and (summary_dir or model_dir):  # After the save: it reports its step.
    hooks.append(EpochSummaryHook(barrier, summary_dir or model_dir))
  hooks.append(EpochProgressHook(epoch_input, every_secs=settings.progress_secs))
  if rejoin is not None and sync_hook is not None:  # Just before the epoch starts.
    hooks.append(GuestTakeInHook(rejoin, monitor, config.worker_names[0],
                                 settings.startup_timeout_secs))
  return hooks + [epoch_input.hook]


def _wire_work_queue(config: ClusterConfig, epoch_input: EpochInput, monitor: Any,
                     barrier: EpochBarrierHook,
                     settings: EpochSyncSettings) -> Optional[UnitPasses]:
  """A work queue's claims name a dead ps:0 at once; the chief checks and audits its epoch.
  None: a static shard.

  Raises:
    ConfigError: the queue was built for other settings or another worker count than these
      hooks, naming each difference.
  """
  queue = work_queue_of(epoch_input)
  if queue is not None:
    _check_queue_agrees(queue, config, settings)
    queue.claims.liveness = monitor
  if config.is_chief:
    audit_work_queue(epoch_input, barrier, config.worker_names)
  return queue


def _check_queue_agrees(queue: UnitPasses, config: ClusterConfig,
                        settings: EpochSyncSettings) -> None:
  """The queue's graph (its gate, its reclaim, the synchronous step's markers) is what its
  settings built; hooks wired for other settings would act on a queue without them."""
  built = queue.built
  if built is None:
    return
  problems = []
  if built.num_workers != config.num_workers:
    problems.append(f"the work queue was built for num_workers={built.num_workers}, the hooks' "
                    f"cluster has {config.num_workers} (give work_queue_input "
                    "num_workers=config.num_workers)")
  if built.elastic != bool(settings.elastic):
    problems.append(f"the work queue was built with elastic={built.elastic}, the hooks have "
                    f"--epochsync_elastic={str(bool(settings.elastic)).lower()}")
  elif settings.elastic and built.sync != bool(settings.sync):
    problems.append(f"the elastic work queue was built with sync={built.sync}, the hooks have "
                    f"--epochsync_sync={str(bool(settings.sync)).lower()}")
  if problems:
    raise ConfigError(f"{config.task_name}: " + "; ".join(problems) + ": pass the same settings "
                      "to work_queue_input(settings=...) and to the hooks (epoch_sync_hooks, "
                      "hooks.monitored_training_session), or leave both to the flags")


def _grows(config: ClusterConfig) -> bool:
  """True in a job that may grow past its launch (--epochsync_max_workers)."""
  return config.max_workers > config.launch_workers > 0


def _spare_ids(config: ClusterConfig, settings: EpochSyncSettings) -> range:
  """The worker ids of the spares, or of the optional workers (elastic): the launch's last
  --epochsync_spare_workers (--epochsync_optional_workers), and every slot past the launch
  (--epochsync_max_workers)."""
  if _grows(config) and not settings.elastic:
    raise ConfigError(
        f"--epochsync_max_workers={config.max_workers} needs --epochsync_elastic: a worker "
        "beyond the launch joins the running job, which only an elastic job takes in; turn "
        "elastic on, or unset --epochsync_max_workers")
  if _grows(config) and settings.spare_workers:
    raise ConfigError(
        f"--epochsync_max_workers={config.max_workers} with --epochsync_spare_workers="
        f"{settings.spare_workers}: a worker beyond the launch joins at once, a spare stands by; "
        "a job has one or the other: set --epochsync_spare_workers=0, or unset "
        "--epochsync_max_workers")
  flag, count = (("spare_workers", settings.spare_workers) if settings.spare_workers else
                 ("optional_workers", settings.optional_workers))
  count = count if settings.elastic else 0
  launch = config.launch_workers or config.num_workers
  if count >= launch:
    raise ConfigError(
        f"--epochsync_{flag}={count} leaves no task to train among the {launch} chief and "
        f"worker tasks the job launches with: the chief is never a spare or optional; give at "
        f"most {launch - 1}, or more worker tasks")
  return range(launch - count, config.num_workers)


def _stalled_after(settings: EpochSyncSettings, sync_hook: Any) -> float:
  """How long a worker may answer no probe before the chief treats it as lost (frozen): the
  step timeout; half of it in synchronous training, whose steps wait for the frozen worker's
  marker until the chief sends it, and time out at the step timeout."""
  return settings.step_timeout_secs / (2 if sync_hook is not None else 1)


def _check_elastic(queue: Optional[UnitPasses], settings: EpochSyncSettings,
                   sync_hook: Any) -> None:
  """Elastic training takes a lost worker's unit back: it needs a work queue, built for the
  job's kind of training (docs/elastic.md)."""
  if queue is None:
    raise ConfigError("--epochsync_elastic needs a work queue: a lost worker's unit goes back to "
                      "it. Build the input with hooks.workqueue.work_queue_input (or "
                      "estimator_ext.work_units), or turn elastic off")
  synchronous = sync_hook is not None
  if synchronous != bool(settings.sync):
    raise ConfigError(
        f"--epochsync_elastic with --epochsync_sync={str(settings.sync).lower()} but "
        f"{'a' if synchronous else 'no'} sync optimizer: the work queue (built from the "
        "settings) and the training must agree; pass the same settings to the input and the "
        "hooks, and a sync optimizer exactly when --epochsync_sync is true")
  optimizers = len(getattr(sync_hook, "hooks", [sync_hook]))
  if synchronous and optimizers != 1:
    raise ConfigError(f"--epochsync_elastic takes one sync optimizer, not {optimizers} (each "
                      "would count a step's batch): train the model asynchronously "
                      "(--epochsync_sync=false), or turn elastic off")
  if synchronous and not getattr(getattr(sync_hook, "optimizer", None), "sync_ops", None):
    raise ConfigError("--epochsync_elastic: build the sync optimizer's train_op (minimize) "
                      "before the hooks")
  if synchronous and sync_hook.optimizer.sync_ops.idle_op is None:
    raise ConfigError("--epochsync_elastic with a sync optimizer built before the work queue "
                      "input: build the input first (hooks.workqueue.work_queue_input), then "
                      "the model and its optimizer, with the same settings")


def _stuck_step_watchdog(config: ClusterConfig, settings: EpochSyncSettings,
                         sync_hook: Any) -> Optional[StuckStepWatchdog]:
  """Every step TensorFlow lost runs again, found within a quarter of the step timeout (the
  others' steps wait for it that long); an asynchronous step past the step timeout ends the
  process: it waits for no other task. (A synchronous step waits for the others;
  SafeSyncTokensHook's watchdog bounds that wait.)"""
  timeout = settings.step_timeout_secs
  lost_after = min(LOST_AFTER_SECS, timeout / 4)
  if settings.sync or sync_hook is not None:
    return StuckStepWatchdog(config.task_name, lost_after_secs=lost_after)
  return StuckStepWatchdog(config.task_name, StepWatch(
      timeout, min(settings.warn_after_secs, timeout / 2), settings.log_every_secs),
                           lost_after_secs=lost_after)
