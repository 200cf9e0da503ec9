"""The session hooks and creator of one Estimator training task, in the order they must run.

Typical usage (estimator_ext.training does this after building the graph):
  hooks, stop, evaluation = session_hooks(estimator, train_spec, eval_spec, config,
                                          epoch_input, spec, sync_opts)
  creator = session_creator(estimator, config, spec.scaffold)   # starts the task's server
  with tf.compat.v1.train.MonitoredSession(session_creator=creator, hooks=hooks) as session: ...
"""

# Estimator's own _device_fn and _session_config (tensorflow-estimator 2.15).
# pylint: disable=protected-access

import copy
from typing import Any, List, Sequence

import tensorflow as tf

from estimator_ext.in_loop import InLoopEvaluation, StopAfterEpochHook
from estimator_ext.run_config import EpochSyncRunConfig
from hooks.checkpoint.epoch_save import ChiefSaveAfterBarrierHook
from hooks.checkpoint.mid_epoch import MidEpochSaveHook
from hooks.checkpoint.mid_epoch_restore import MidEpochRestoreHook
from hooks.checkpoint.mid_epoch_resume import MidEpochResume
from hooks.checkpoint.unit_resume import UnitResumeHook
from hooks.data import determinism
from hooks.data.epoch_input import EpochInput
from hooks.workqueue.audit import audit_work_queue
from hooks.epoch.barrier import EpochBarrierHook
from hooks.epoch.run_start import RunStartHook
from hooks.faults import liveness
from hooks.faults.recovery_guard import RecoveryGuardHook
from hooks.session.creators import EpochSyncChiefSessionCreator, FastWorkerSessionCreator
from hooks.session.wiring import epoch_sync_hooks
from hooks.sync.aggregation_group import AggregationGroup
from hooks.sync.done_counter import WorkerDoneHook
from hooks.sync.step_counter import SyncStepCounterHook

__all__ = ["session_hooks", "session_creator"]

_v1 = tf.compat.v1
_POLL_SECS = 0.5  # A worker re-checks the chief's initialisation this often (TensorFlow: 30 s).


def session_hooks(estimator, train_spec, eval_spec, config: EpochSyncRunConfig,
                   epoch_input: EpochInput, spec, sync_opts):
  """(hooks in order, the StopAfterEpochHook, the chief's InLoopEvaluation or None).

  Order: the run start (in a cluster), the sync optimizers' hooks (the chief's aggregation
  starts first), Estimator's own hooks, the epoch hooks, the early-stop hook, `epoch_input.hook`
  last.
  """
  settings, is_chief, model_dir = config.settings, config.is_chief, estimator.model_dir
  hooks = [opt.make_session_run_hook(
      is_chief, num_tokens=0, step_timeout_secs=settings.step_timeout_secs,
      warn_after_secs=min(settings.warn_after_secs, settings.step_timeout_secs / 2),
      log_every_secs=settings.log_every_secs) for opt in sync_opts]
  sync_hooks = list(hooks)
  if not config.is_local:  # A step waiting on a dead task ends within seconds, naming it.
    monitor = liveness.monitor_for(config.epochsync_cluster)
    for hook in hooks:
      hook.use_liveness(monitor, lambda: epoch_input.hook.epoch)
  if is_chief:
    hooks += list(spec.training_chief_hooks) + _chief_summary_hooks(config, spec, model_dir)
  hooks += list(train_spec.hooks) + [_v1.train.NanTensorHook(spec.loss)]
  if config.log_step_count_steps:
    hooks.append(_v1.train.LoggingTensorHook(
        {"loss": spec.loss, "step": _v1.train.get_global_step()},
        every_n_iter=config.log_step_count_steps))
  hooks += list(spec.training_hooks)
  # The chief's mid-epoch save (settings.save_checkpoint_secs/_steps) happens between two
  # aggregations of the sync hook, where the variables hold whole steps.
  epoch_hooks, barrier, save = _epoch_hooks(config, epoch_input, model_dir,
                                            train_spec.saving_listeners,
                                            _one_sync_hook(sync_hooks))
  stop = StopAfterEpochHook(epoch_input, config.task_name, is_chief,
                            ps_device="" if config.is_local else "/job:ps/task:0")
  evaluation = None
  if is_chief and config.in_loop_eval:  # Registered after the save: chief actions run in order.
    evaluation = InLoopEvaluation(estimator, eval_spec, save, stop, config)
    barrier.add_chief_action(evaluation)
  # The RunStartHook (in a cluster) goes before everything, after the RecoveryGuardHook: the
  # chief must drain what an earlier run left on the ps before its aggregation thread starts.
  first = [h for h in epoch_hooks
           if isinstance(h, (RecoveryGuardHook, MidEpochRestoreHook, UnitResumeHook,
                             RunStartHook))]
  rest = [h for h in epoch_hooks[:-1] if h not in first and h not in sync_hooks]
  return first + hooks + rest + [stop, epoch_input.hook], stop, evaluation


def session_creator(estimator, config: EpochSyncRunConfig, scaffold):
  """Starts this task's server (in a cluster); the chief's or a fast worker's session creator.

  Both are hooks.session.creators's: they wait (bounded) for the tasks they need, name a dead one, and
  never re-create a lost session; they use the Estimator's session config (device filters).
  """
  cluster, master, monitor = config.epochsync_cluster, config.master, None
  startup = config.settings.startup_timeout_secs
  session_config = estimator._session_config
  if cluster is not None:
    server = cluster.start_server(protocol=config.protocol or "grpc")
    master, monitor = server.target, liveness.monitor_for(cluster)
    if cluster.beyond_launch:  # (a copy) its session brings its cluster to the ps tasks
      session_config = cluster.with_propagated_cluster(copy.deepcopy(session_config))
  if config.is_chief:
    return EpochSyncChiefSessionCreator(
        scaffold=scaffold, master=master, config=estimator._session_config,
        checkpoint_dir=estimator.model_dir, liveness=monitor, startup_timeout_secs=startup,
        task_name=config.task_name, worker_names=config.worker_names)
  return FastWorkerSessionCreator(
      scaffold=scaffold, master=master, config=session_config, max_wait_secs=startup,
      poll_secs=_POLL_SECS, task_name=config.task_name, chief_name=config.worker_names[0],
      liveness=monitor, worker_names=config.worker_names)


def _chief_summary_hooks(config, spec, model_dir: str) -> List[Any]:
  """What MonitoredTrainingSession adds on the chief: steps/sec and summaries in model_dir."""
  hooks: List[Any] = []
  if config.log_step_count_steps:
    hooks.append(SyncStepCounterHook(output_dir=model_dir,
                                     every_n_steps=config.log_step_count_steps))
  if config.save_summary_steps:
    hooks.append(_v1.train.SummarySaverHook(scaffold=spec.scaffold, output_dir=model_dir,
                                            save_steps=config.save_summary_steps))
  return hooks


def _one_sync_hook(sync_hooks: Sequence[Any]) -> Any:
  """None, the one sync optimizer's hook, or all of them in lockstep (canned wide & deep)."""
  if len(sync_hooks) > 1:
    return AggregationGroup(sync_hooks)
  return sync_hooks[0] if sync_hooks else None


def _epoch_hooks(config: EpochSyncRunConfig, epoch_input: EpochInput, model_dir: str,
                 listeners: Sequence[Any], sync_hook: Any = None):
  """(hooks ending with epoch_input.hook, the barrier, the chief's save hook or None)."""
  settings, cluster = config.settings, config.epochsync_cluster
  if cluster is not None:
    hooks = epoch_sync_hooks(cluster, epoch_input, settings, model_dir=model_dir,
                             listeners=listeners, sync_hook=sync_hook)
  else:
    hooks = _local_hooks(config, epoch_input, model_dir, listeners)
  barrier = next(h for h in hooks if isinstance(h, EpochBarrierHook))
  save = next((h for h in hooks if isinstance(h, ChiefSaveAfterBarrierHook)), None)
  return hooks, barrier, save


def _local_hooks(config: EpochSyncRunConfig, epoch_input: EpochInput, model_dir: str,
                 listeners: Sequence[Any]) -> List[Any]:
  """Local mode: the same hooks for one worker, with their state on this process.

  Mid-epoch checkpoints (save_checkpoints_secs/_steps) are saved after the step that reaches
  the period, with the batches applied so far; a relaunch restores the newest one
  (EpochSyncChiefSessionCreator) and skips those batches, as an asynchronous cluster does
  (one process applies each batch in the run that reads it, so the position is exact).
  """
  settings, names = config.settings, config.worker_names
  barrier = EpochBarrierHook(
      epoch_input, 1, 0, names, timeout_secs=settings.barrier_timeout_secs,
      startup_timeout_secs=settings.startup_timeout_secs,
      warn_after_secs=settings.warn_after_secs, log_every_secs=settings.log_every_secs,
      audit_dir=model_dir, ps_device="")
  secs, steps = settings.save_checkpoint_secs, settings.save_checkpoint_steps
  queue = audit_work_queue(epoch_input, barrier, names)
  mid_epoch = bool(secs or steps)
  resume = [UnitResumeHook(epoch_input, model_dir, barrier, names)] if queue and model_dir else []
  hooks = resume + [WorkerDoneHook(epoch_input, 1, 0, names, ps_device=""), barrier,
           MidEpochResume(epoch_input, 1, 0, names, count_applied=mid_epoch, ps_device=""),
           ChiefSaveAfterBarrierHook(barrier, model_dir, listeners=listeners)]
  if mid_epoch:  # A resume skips by position: the order must be the same on a rerun.
    determinism.warn_if_nondeterministic(epoch_input.dataset, config.task_name)
    hooks.append(MidEpochSaveHook(epoch_input, barrier, model_dir, secs, steps, None,
                                  ps_device=""))
  return hooks + [epoch_input.hook]
