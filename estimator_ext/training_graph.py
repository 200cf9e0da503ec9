"""The Estimator's training graph on an EpochInput, as Estimator.train builds it.

Typical usage (estimator_ext.training does this on every chief/worker task):
  check_dataset(estimator, train_spec, config.task_name)   # one finite pass, before any server
  with tf.Graph().as_default() as graph, graph.device(estimator._device_fn):
    epoch_input, spec, sync_opts = build_graph(estimator, train_spec, config, graph, sync=True)
"""

# Estimator's own internals build the training graph exactly as Estimator.train does:
# _call_input_fn, _call_model_fn, _create_and_assert_global_step, _warm_start_settings
# (tensorflow-estimator 2.15, its last release).
# pylint: disable=protected-access

from typing import Any, List, Sequence

import tensorflow as tf
from tensorflow.python.training import training_util  # pylint: disable=g-direct-tensorflow-import
from tensorflow_estimator.python.estimator import util as estimator_util

from estimator_ext import optimizer as optimizer_lib
from estimator_ext import warm_start as warm_start_lib
from estimator_ext.run_config import EpochSyncRunConfig
from hooks import log as logging
from hooks.data.epoch_input import EpochInput
from hooks.errors import ConfigError, raise_if_problems
from hooks.workqueue.input import PS_DEVICE, WorkQueueSpec

__all__ = ["build_graph", "check_dataset"]

_v1 = tf.compat.v1
_TRAIN = tf.estimator.ModeKeys.TRAIN


def check_dataset(estimator, train_spec, task: str) -> None:
  """Calls train_spec.input_fn once in a scratch graph: it must return one finite pass."""
  with tf.Graph().as_default():
    result = estimator._call_input_fn(train_spec.input_fn, _TRAIN)
    if isinstance(result, WorkQueueSpec):  # its first unit must be one finite pass
      raise_if_problems(result.problems(), f"work units of {task}")
      result = result.first_unit_dataset()
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


def build_graph(estimator, train_spec, config: EpochSyncRunConfig, graph: tf.Graph, sync: bool):
  """(epoch_input, EstimatorSpec, sync optimizers): Estimator.train's graph on an EpochInput.

  Raises:
    ConfigError: a CheckpointSaverHook, or sync on without a synchronous optimizer.
  """
  settings, task = config.settings, config.task_name
  _v1.random.set_random_seed(config.tf_random_seed)
  estimator._create_and_assert_global_step(graph)
  training_util._get_or_create_global_step_read(graph)
  dataset = estimator._call_input_fn(train_spec.input_fn, _TRAIN)
  if isinstance(dataset, WorkQueueSpec):  # estimator_ext.work_units: units from a queue
    epoch_input = dataset.epoch_input(settings.num_epochs, config.num_workers, config.worker_id,
                                      task, "" if config.is_local else PS_DEVICE, settings)
  else:
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
