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

# Estimator's own _device_fn (tensorflow-estimator 2.15); the graph: training_graph.py, the
# session's hooks and creator: task_hooks.py.
# pylint: disable=protected-access

import os
import re
import tempfile
from typing import Any, Callable, Dict, Optional, Sequence

import tensorflow as tf

from estimator_ext import eval_log
from estimator_ext import evaluator as evaluator_lib
from estimator_ext import exit_record
from estimator_ext import task_hooks
from estimator_ext import training_graph
from estimator_ext.run_config import EpochSyncRunConfig
from hooks import log as logging
from hooks.errors import ConfigError, raise_if_problems
from hooks.workqueue.input import WorkQueueSpec
from hooks.workqueue.units import UnitTensors, WorkUnit

__all__ = ["train_and_evaluate", "EpochResults", "shard", "work_units"]

_v1 = tf.compat.v1


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


def work_units(units: Sequence[WorkUnit], unit_fn: Callable[[UnitTensors], tf.data.Dataset],
               config: EpochSyncRunConfig, seed: Optional[int] = None,
               shuffle: Optional[bool] = None,
               records_are_examples: bool = True) -> WorkQueueSpec:
  """The epoch as `units` handed to whichever worker is free, exactly once (docs/workqueue.md).

      def train_input_fn(config):
        units = [hooks.workqueue.WorkUnit(p) for p in sorted(glob.glob("/data/part-*"))]
        return estimator_ext.work_units(units, lambda u: tf.data.TFRecordDataset(u.path)
                                        .map(parse).batch(64), config)

  Every training task returns the same units; `unit_fn` gets one unit's fields as tensors and
  returns its batches (one pass). `seed` and `shuffle` default to the RunConfig's settings
  (--epochsync_unit_seed, --epochsync_unit_shuffle). Raises ConfigError on a task that trains
  nothing (ps, evaluator) and on bad units, naming each problem.
  """
  if getattr(config, "worker_id", None) is None:
    raise ConfigError(f"work_units: {getattr(config, 'task_name', 'this task')} is not a "
                      "training task with an EpochSyncRunConfig; call it from "
                      "train_spec.input_fn(config)")
  spec = WorkQueueSpec(list(units), unit_fn, seed=seed, shuffle=shuffle,
                       records_are_examples=records_are_examples)
  raise_if_problems(spec.problems(), f"work units of {config.task_name}")
  return spec


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
                                liveness=evaluator_lib.chief_monitor(config),
                                progress=evaluator_lib.training_progress(config))
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
  training_graph.check_dataset(estimator, train_spec, task)
  sync = settings.sync and cluster is not None  # One process needs no aggregation.
  how = "in one process" if cluster is None else "synchronously" if sync else "asynchronously"
  logging.info("tf-epochsync: %s trains %d epoch(s) %s in %s", task,  # cluster: run config's line
               settings.num_epochs, how, model_dir)
  with tf.Graph().as_default() as graph, graph.device(estimator._device_fn):
    epoch_input, spec, sync_opts = training_graph.build_graph(estimator, train_spec, config, graph, sync)
    hooks, stop, evaluation = task_hooks.session_hooks(estimator, train_spec, eval_spec, config,
                                             epoch_input, spec, sync_opts)
    # The graph is complete and valid: only now start this task's server and session.
    if config.is_chief:
      evaluator_lib.write_run_record(model_dir, config)
    creator = task_hooks.session_creator(estimator, config, spec.scaffold)
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


