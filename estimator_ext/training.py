"""train_and_evaluate with the stock signature: num_epochs epochs in one session per task.

Each chief/worker task builds the Estimator's training graph (as `Estimator.train` does) on an
`EpochInput` over the one pass its `train_spec.input_fn` returns, adds the epoch hooks
(`hooks.session.wiring.epoch_sync_hooks`) and the synchronous optimizers' hooks, and trains every
epoch in one `MonitoredSession`; the chief saves one checkpoint per epoch after the barrier and,
with in-loop evaluation, evaluates it before releasing the workers. The `evaluator` task
evaluates every epoch checkpoint once, in order; `ps` tasks serve. Without a TF_CONFIG cluster
one process trains, saves and evaluates every epoch (local mode).

Typical usage:
  config = estimator_ext.EpochSyncRunConfig(model_dir=model_dir, num_epochs=3)
  estimator = tf.compat.v1.estimator.Estimator(model_fn, config=config)
  metrics, exports = estimator_ext.train_and_evaluate(estimator, train_spec, eval_spec)
"""

# Estimator's own internals build the training graph exactly as Estimator.train does:
# _call_input_fn, _call_model_fn, _create_and_assert_global_step, _device_fn, _session_config,
# _warm_start_settings (tensorflow-estimator 2.15, its last release).
# pylint: disable=protected-access

import os
import re
import tempfile
from typing import Any, Dict, List, Optional, Sequence

import tensorflow as tf
from tensorflow.python.training import training_util  # pylint: disable=g-direct-tensorflow-import
from tensorflow_estimator.python.estimator import util as estimator_util

from estimator_ext import eval_log
from estimator_ext import evaluator as evaluator_lib
from estimator_ext import exit_record
from estimator_ext import optimizer as optimizer_lib
from estimator_ext import warm_start as warm_start_lib
from estimator_ext.in_loop import InLoopEvaluation, StopAfterEpochHook
from estimator_ext.run_config import EpochSyncRunConfig
from hooks.data import determinism
from hooks.faults import liveness
from hooks import log as logging
from hooks.sync.aggregation_group import AggregationGroup
from hooks.epoch.barrier import EpochBarrierHook
from hooks.checkpoint.epoch_save import ChiefSaveAfterBarrierHook
from hooks.sync.done_counter import WorkerDoneHook
from hooks.data.epoch_input import EpochInput
from hooks.session.wiring import epoch_sync_hooks
from hooks.checkpoint.mid_epoch import MidEpochSaveHook
from hooks.checkpoint.mid_epoch_restore import MidEpochRestoreHook
from hooks.checkpoint.mid_epoch_resume import MidEpochResume
from hooks.faults.recovery_guard import RecoveryGuardHook
from hooks.epoch.run_start import RunStartHook
from hooks.errors import ConfigError, raise_if_problems
from hooks.session.creators import EpochSyncChiefSessionCreator, FastWorkerSessionCreator
from hooks.sync.step_counter import SyncStepCounterHook

__all__ = ["train_and_evaluate", "EpochResults", "shard"]

_v1 = tf.compat.v1
_TRAIN = tf.estimator.ModeKeys.TRAIN
_POLL_SECS = 0.5  # A worker re-checks the chief's initialisation this often (TensorFlow: 30 s).


class EpochResults(tuple):
  """(metrics, export_results) of the last evaluated epoch, as stock train_and_evaluate returns.

  Also: `per_epoch` {epoch: metrics} for every epoch this task evaluated (also in an earlier
  run), `exports_per_epoch`, `epochs_trained` (by this task in this run) and `stopped_after`
  (the epoch training stopped early after, or None).

      metrics, exports = estimator_ext.train_and_evaluate(estimator, train_spec, eval_spec)
      losses = [m["loss"] for m in result.per_epoch.values()]
  """

  def __new__(cls, per_epoch: Dict[int, Dict[str, Any]], exports_per_epoch: Dict[int, Any],
              epochs_trained: Sequence[int] = (), stopped_after: Optional[int] = None):
    last = max(per_epoch) if per_epoch else None
    self = super().__new__(cls, (per_epoch.get(last), exports_per_epoch.get(last, [])))
    self.per_epoch = dict(sorted(per_epoch.items()))
    self.exports_per_epoch = dict(exports_per_epoch)
    self.epochs_trained = list(epochs_trained)
    self.stopped_after = stopped_after
    return self


def shard(dataset: tf.data.Dataset, config: EpochSyncRunConfig) -> tf.data.Dataset:
  """This training task's shard of `dataset`: element i goes to worker id i % num_workers.

      def train_input_fn(config):
        return estimator_ext.shard(tf.data.TFRecordDataset(files), config).map(parse).batch(64)

  Shard before shuffling and batching; shards may be uneven (or empty). Raises ConfigError on a
  task that trains nothing (ps, evaluator).
  """
  if getattr(config, "worker_id", None) is None:
    raise ConfigError(f"shard: {getattr(config, 'task_name', 'this task')} is not a training task "
                      "with an EpochSyncRunConfig; call it from train_spec.input_fn(config)")
  return dataset.shard(config.num_workers, config.worker_id)


def _is_estimator_temp_dir(path: str) -> bool:
  """True for the directory Estimator makes (tempfile.mkdtemp()) when it was given no model_dir."""
  return (os.path.dirname(os.path.abspath(path)) == os.path.abspath(tempfile.gettempdir()) and
          re.fullmatch(r"tmp[a-z0-9_]{8}", os.path.basename(path)) is not None)


def _check_arguments(estimator, train_spec, eval_spec) -> EpochSyncRunConfig:
  """Every problem of the three arguments, raised at once before anything starts."""
  problems = []
  if not isinstance(estimator, _v1.estimator.Estimator):
    raise ConfigError(f"estimator={estimator!r} must be a tf.estimator.Estimator")
  config = estimator.config
  if not isinstance(config, EpochSyncRunConfig):
    problems.append(f"the estimator's config is a {type(config).__name__}: build the Estimator "
                    "with config=estimator_ext.EpochSyncRunConfig(model_dir=..., num_epochs=...)")
  if not isinstance(train_spec, tf.estimator.TrainSpec):
    problems.append(f"train_spec={train_spec!r} must be a tf.estimator.TrainSpec")
  elif train_spec.max_steps is not None:
    problems.append(f"TrainSpec(max_steps={train_spec.max_steps}): training ends after "
                    "num_epochs epochs, every worker reading its whole shard once per epoch; "
                    "remove max_steps (set EpochSyncRunConfig(num_epochs=...))")
  if not isinstance(eval_spec, tf.estimator.EvalSpec):
    problems.append(f"eval_spec={eval_spec!r} must be a tf.estimator.EvalSpec")
  if (isinstance(config, EpochSyncRunConfig) and not config.is_local and
      not config._epochsync_model_dir_given and
      _is_estimator_temp_dir(estimator.model_dir)):
    problems.append(f"model_dir is missing in a distributed job: Estimator fell back to its own "
                    f"temporary directory {estimator.model_dir}, which no other task sees; pass "
                    "model_dir= (storage every task sees) to EpochSyncRunConfig or the Estimator, "
                    'or set TF_CONFIG["model_dir"]')
  raise_if_problems(problems, "train_and_evaluate arguments")
  return config


def _check_dataset(estimator, train_spec, task: str) -> None:
  """Calls train_spec.input_fn once in a scratch graph: it must return one finite pass."""
  with tf.Graph().as_default():
    result = estimator._call_input_fn(train_spec.input_fn, _TRAIN)
    if not isinstance(result, tf.data.Dataset):
      raise ConfigError(
          f"train_spec.input_fn returned a {type(result).__name__} on {task}: it must return a "
          "tf.data.Dataset holding one pass over this worker's shard (not repeated), so that the "
          "end of each epoch is known")
    with _v1.Session() as session:
      cardinality = int(session.run(result.cardinality()))
  if cardinality == tf.data.INFINITE_CARDINALITY:
    raise ConfigError(
        f"train_spec.input_fn returned an infinite (repeated) dataset on {task}: return one pass "
        "over this worker's shard; remove .repeat(), EpochSyncRunConfig(num_epochs=...) repeats "
        "it once per epoch")


def _no_saver_hooks(hooks: Sequence[Any], where: str) -> List[str]:
  return [f"{where} has a {type(h).__name__}: it would save mid-epoch while workers train, "
          "whereas the chief saves each epoch after the barrier and mid-epoch where the model "
          "holds whole steps; remove it (for periodic saves pass EpochSyncRunConfig("
          "save_checkpoints_secs=... or save_checkpoints_steps=...); TrainSpec("
          "saving_listeners=...) run around each epoch save)"
          for h in hooks if isinstance(h, _v1.train.CheckpointSaverHook)]


def _serve_ps(config: EpochSyncRunConfig) -> None:
  cluster = config.epochsync_cluster
  server = tf.distribute.Server(cluster.cluster_spec(), job_name=cluster.task_type,
                                task_index=cluster.task_index, protocol=config.protocol or "grpc",
                                start=True)
  logging.info("%s serving at %s", cluster.task_name, server.target)
  server.join()


def _results(estimator, eval_spec, task: str, exports: Dict[int, Any],
             epochs_trained: Sequence[int] = (), stopped_after: Optional[int] = None
             ) -> EpochResults:
  lines = eval_log.read_eval_log(estimator.model_dir, task, eval_spec.name)
  for line in lines:
    exports.setdefault(line["epoch"], line.get("exports", []))
  return EpochResults({line["epoch"]: line["metrics"] for line in lines}, exports, epochs_trained,
                      stopped_after)


def train_and_evaluate(estimator: tf.estimator.Estimator, train_spec: tf.estimator.TrainSpec,
                       eval_spec: tf.estimator.EvalSpec) -> Optional[EpochResults]:
  """Trains `config.settings.num_epochs` epochs and evaluates every epoch; the stock signature.

  The estimator's config must be an `EpochSyncRunConfig`. `train_spec.input_fn` returns ONE pass
  over this worker's shard as a tf.data.Dataset (shard it with `estimator_ext.shard`, or by
  `config.worker_id` / `config.num_workers`); `max_steps` must be None. `eval_spec.steps`,
  `name`, `hooks` and `exporters` are used; `throttle_secs` and `start_delay_secs` are not (every
  epoch is evaluated, once).

      config = estimator_ext.EpochSyncRunConfig(model_dir=model_dir, num_epochs=3)
      estimator = tf.compat.v1.estimator.Estimator(model_fn, config=config)
      metrics, exports = estimator_ext.train_and_evaluate(estimator, train_spec, eval_spec)

  Returns:
    `EpochResults`: the last evaluated epoch's (metrics, export_results) as stock returns, with
    `per_epoch` metrics for every epoch this task evaluated (local mode, an in-loop chief, the
    evaluator); (None, []) with `epochs_trained` on other training tasks; ps tasks never return.

  Raises:
    ConfigError: before any session, for a config that is not an EpochSyncRunConfig, max_steps,
      a missing model_dir in a distributed job, an input_fn that returns no Dataset or an infinite
      one, sync on without a sync_optimizer, or a CheckpointSaverHook; on the evaluator, settings
      that disagree with the chief's.
    SyncTimeoutError: a barrier, step, start-up or evaluator wait expired (names who is missing).
  """
  config = _check_arguments(estimator, train_spec, eval_spec)
  if not config.is_local and config.task_type == "ps":
    _serve_ps(config)
    return None
  if config.task_name == "evaluator:0":
    evaluator_lib.run_evaluator(estimator, eval_spec, config,
                                liveness=evaluator_lib.chief_monitor(config))
    return _results(estimator, eval_spec, config.task_name, {})
  if config.is_local:
    return _train(estimator, train_spec, eval_spec, config)
  # The evaluator learns from model_dir that this task failed, also before its server is up.
  exit_record.clear(estimator.model_dir, config.task_name)
  try:
    return _train(estimator, train_spec, eval_spec, config)
  except Exception as e:
    exit_record.write(estimator.model_dir, config.task_name, e)
    raise


def _train(estimator, train_spec, eval_spec, config: EpochSyncRunConfig) -> EpochResults:
  """One chief/worker task (or local mode): builds the graph and trains every epoch."""
  settings, cluster, task = config.settings, config.epochsync_cluster, config.task_name
  model_dir = estimator.model_dir
  _check_dataset(estimator, train_spec, task)
  sync = settings.sync and cluster is not None  # One process needs no aggregation.
  how = "in one process" if cluster is None else "synchronously" if sync else "asynchronously"
  logging.info("tf-epochsync: %s trains %d epoch(s) %s in %s", task,  # cluster: run config's line
               settings.num_epochs, how, model_dir)
  with tf.Graph().as_default() as graph, graph.device(estimator._device_fn):
    epoch_input, spec, sync_opts = _build_graph(estimator, train_spec, config, graph, sync)
    hooks, stop, evaluation = _session_hooks(estimator, train_spec, eval_spec, config,
                                             epoch_input, spec, sync_opts)
    # The graph is complete and valid: only now start this task's server and session.
    if config.is_chief:
      evaluator_lib.write_run_record(model_dir, config)
    creator = _session_creator(estimator, config, spec.scaffold)
    # Naming each synchronous optimizer's train op lets its hook bound the step (the model's
    # train op may be another op, e.g. a canned head's global_step increment).
    fetches = [spec.train_op, spec.loss] + [opt.sync_ops.train_op for opt in sync_opts]
    steps, loss = 0, None
    with _v1.train.MonitoredSession(session_creator=creator, hooks=hooks) as session:
      while not session.should_stop():
        loss = session.run(fetches)[1]
        steps += 1
  trained = [s.epoch for s in epoch_input.hook.history]
  logging.info("tf-epochsync: %s trained epochs %s in %d steps; last loss %s%s", task, trained,
               steps, loss, "" if stop.stopped_after is None else
               f"; stopped early after epoch {stop.stopped_after}")
  exports = dict(evaluation.exports) if evaluation else {}
  return _results(estimator, eval_spec, task, exports, trained, stop.stopped_after)


def _build_graph(estimator, train_spec, config: EpochSyncRunConfig, graph: tf.Graph, sync: bool):
  """(epoch_input, EstimatorSpec, sync optimizers): Estimator.train's graph on an EpochInput.

  Raises:
    ConfigError: a CheckpointSaverHook, or sync on without a synchronous optimizer.
  """
  settings, task = config.settings, config.task_name
  _v1.random.set_random_seed(config.tf_random_seed)
  estimator._create_and_assert_global_step(graph)
  training_util._get_or_create_global_step_read(graph)
  dataset = estimator._call_input_fn(train_spec.input_fn, _TRAIN)
  epoch_input = EpochInput(dataset, settings.num_epochs, task)
  features, labels = estimator_util.parse_iterator_result(epoch_input.get_next())
  optimizer_lib.mark_training_graph(
      graph, sync=sync, num_workers=config.num_workers, worker_id=config.worker_id,
      worker_names=config.worker_names,
      divide_by_initial_workers=settings.divide_by_initial_workers)
  spec = estimator._call_model_fn(features, labels, _TRAIN, config)
  sync_opts = optimizer_lib.sync_optimizers(graph)
  problems = (_no_saver_hooks(train_spec.hooks, "TrainSpec.hooks") +
              _no_saver_hooks(spec.training_hooks, "EstimatorSpec.training_hooks") +
              _no_saver_hooks(spec.training_chief_hooks, "EstimatorSpec.training_chief_hooks"))
  if sync and not sync_opts:
    problems.append("sync is on but model_fn built no synchronous optimizer: wrap its "
                    "optimizer, optimizer = estimator_ext.sync_optimizer(optimizer) (canned "
                    "estimators: pass it as their optimizer), or set sync=False "
                    "(--noepochsync_sync) for asynchronous training")
  raise_if_problems(problems, f"training graph on {task}")
  _finish_graph(estimator, spec, config, estimator.model_dir)
  return epoch_input, spec, sync_opts


def _session_hooks(estimator, train_spec, eval_spec, config: EpochSyncRunConfig,
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
           if isinstance(h, (RecoveryGuardHook, MidEpochRestoreHook, RunStartHook))]
  rest = [h for h in epoch_hooks[:-1] if h not in first and h not in sync_hooks]
  return first + hooks + rest + [stop, epoch_input.hook], stop, evaluation


def _session_creator(estimator, config: EpochSyncRunConfig, scaffold):
  """Starts this task's server (in a cluster); the chief's or a fast worker's session creator.

  Both are hooks.session.creators's: they wait (bounded) for the tasks they need, name a dead one, and
  never re-create a lost session; they use the Estimator's session config (device filters).
  """
  cluster, master, monitor = config.epochsync_cluster, config.master, None
  startup = config.settings.startup_timeout_secs
  if cluster is not None:
    server = tf.distribute.Server(cluster.cluster_spec(), job_name=cluster.task_type,
                                  task_index=cluster.task_index, config=cluster.session_config(),
                                  protocol=config.protocol or "grpc", start=True)
    master, monitor = server.target, liveness.monitor_for(cluster)
  if config.is_chief:
    return EpochSyncChiefSessionCreator(
        scaffold=scaffold, master=master, config=estimator._session_config,
        checkpoint_dir=estimator.model_dir, liveness=monitor, startup_timeout_secs=startup,
        task_name=config.task_name)
  return FastWorkerSessionCreator(
      scaffold=scaffold, master=master, config=estimator._session_config, max_wait_secs=startup,
      poll_secs=_POLL_SECS, task_name=config.task_name, chief_name=config.worker_names[0],
      liveness=monitor)


def _finish_graph(estimator, spec, config, model_dir: str) -> None:
  """What Estimator._train_with_estimator_spec adds: warm start, loss summary, the saver."""
  warm_start = estimator._warm_start_settings
  if warm_start and not tf.train.latest_checkpoint(model_dir):
    logging.info("Warm-starting with WarmStartSettings: %s", warm_start)
    _v1.train.warm_start(*warm_start_lib.without_epochsync_state(warm_start))
  if not any(x.op.name == "loss" for x in _v1.get_collection(_v1.GraphKeys.SUMMARIES)):
    _v1.summary.scalar("loss", spec.loss)
  _v1.add_to_collection(_v1.GraphKeys.LOSSES, spec.loss)
  if not _v1.get_collection(_v1.GraphKeys.SAVERS):  # The epoch save uses the one saver there.
    _v1.add_to_collection(_v1.GraphKeys.SAVERS, spec.scaffold.saver or _v1.train.Saver(
        sharded=True, max_to_keep=config.keep_checkpoint_max,
        keep_checkpoint_every_n_hours=config.keep_checkpoint_every_n_hours, defer_build=True,
        save_relative_paths=True))


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
  mid_epoch = bool(secs or steps)
  hooks = [WorkerDoneHook(epoch_input, 1, 0, names, ps_device=""), barrier,
           MidEpochResume(epoch_input, 1, 0, names, count_applied=mid_epoch, ps_device=""),
           ChiefSaveAfterBarrierHook(barrier, model_dir, listeners=listeners)]
  if mid_epoch:  # A resume skips by position: the order must be the same on a rerun.
    determinism.warn_if_nondeterministic(epoch_input.dataset, config.task_name)
    hooks.append(MidEpochSaveHook(epoch_input, barrier, model_dir, secs, steps, None,
                                  ps_device=""))
  return hooks + [epoch_input.hook]
