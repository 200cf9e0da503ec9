"""Cluster test task: an Estimator job under estimator_ext.train_and_evaluate, settings from flags.

The --epochsync_* flags are defined (hooks.config.flags), so EpochSyncRunConfig takes its defaults from
them. Every task writes <model_dir>/summary-<task>.json with what train_and_evaluate returned.

  --model=linear      examples/estimator_train.py's model_fn and input_fns (custom model_fn)
  --model=wide_deep   a canned DNNLinearCombinedRegressor (two optimizers in one step, the head
                      increments global_step): an id column, its embedding partitioned over 2 ps
  --early_stopping_patience=1 --early_stopping_min_delta=0.1   in-loop evaluation, early stop
  --optimizers=canned_defaults|names_and_callables   wide_deep's optimizers as instances at
                      the canned defaults (Ftrl 0.005, Adagrad 0.001), or as the name "Ftrl" and a
                      callable (Adagrad 0.001 decayed by 1.0 on global_step): the same training
  --tf_random_seed=N --step_sleep_secs=S   the same initial variables each run; a pause per step
  --evaluator_timeout_secs=15         EpochSyncRunConfig(evaluator_timeout_secs)
  --unit_batches=5,1,3               the linear job's input through a work queue
                      (estimator_ext.work_units): units of those sizes in batches, row ranges of
                      one array (examples.estimator_data.shard_arrays(999, ...))
  --warm_start_from=<checkpoint> [--warm_start_vars=.*]   tf.estimator.WarmStartSettings: a
                      list of scopes over GLOBAL_VARIABLES (as stock); without the flag, the
                      default regex over TRAINABLE_VARIABLES
"""

import json
import os
import time

from absl import app
from absl import flags
import numpy as np
import tensorflow as tf

import estimator_ext
from examples import estimator_data
from examples import estimator_train
from hooks.workqueue import WorkUnit
from hooks.config import flags as epochsync_flags  # pylint: disable=unused-import; the --epochsync_* flags

_MODEL = flags.DEFINE_enum("model", "linear", ["linear", "wide_deep"], "Which Estimator.")
_PATIENCE = flags.DEFINE_integer("early_stopping_patience", 0, "0: no early stopping.")
_MIN_DELTA = flags.DEFINE_float("early_stopping_min_delta", 0.0, "EarlyStopping(min_delta).")
_OPTIMIZERS = flags.DEFINE_enum(
    "optimizers", "instances", ["instances", "canned_defaults", "names_and_callables"],
    "wide_deep's optimizers: Ftrl/Adagrad instances at 0.05, at the canned defaults, or as a name "
    "and a callable.")
_IN_LOOP = flags.DEFINE_bool("in_loop_eval", False, "The chief evaluates every epoch.")
_UNIT_BATCHES = flags.DEFINE_list("unit_batches", [], "The linear job's units (batches each) "
                                  "through a work queue, instead of its static shards.")
_WARM_FROM = flags.DEFINE_string("warm_start_from", None, "WarmStartSettings' checkpoint.")
_WARM_VARS = flags.DEFINE_list("warm_start_vars", None, "WarmStartSettings' vars_to_warm_start "
                               "as a list of scopes; default: the stock regex '.*'.")

_SEED = flags.DEFINE_integer("tf_random_seed", None, "RunConfig(tf_random_seed): the same "
                             "initial variables in every run.")
_STEP_SLEEP = flags.DEFINE_float("step_sleep_secs", 0.0, "Each training task sleeps this long "
                                 "after each step (a kill can land inside an epoch).")
_START_DELAY = flags.DEFINE_float("start_delay_secs", 0.0, "This task starts this late (a pod "
                                  "scheduled late).", lower_bound=0.0)
_EVAL_TIMEOUT = flags.DEFINE_float("evaluator_timeout_secs", 7200.0,
                                   "EpochSyncRunConfig(evaluator_timeout_secs).")

FLAGS = flags.FLAGS


class _SleepAfterStep(tf.compat.v1.train.SessionRunHook):

  def after_run(self, run_context, run_values):
    time.sleep(_STEP_SLEEP.value)
VOCAB, EMBEDDING_DIM, BATCH_SIZE = 20, 4, 8


def unit_train_input_fn(config):
  """The linear job's epoch as work units: row ranges of one array, one per --unit_batches."""
  sizes = [int(n) for n in _UNIT_BATCHES.value]
  x, y = estimator_data.shard_arrays(999, sum(sizes))
  batch = estimator_data.BATCH_SIZE
  starts = np.cumsum([0] + sizes[:-1]) * batch
  units = [WorkUnit("", int(s), int(s) + n * batch) for s, n in zip(starts, sizes)]

  def unit_fn(unit):
    return tf.data.Dataset.from_tensor_slices((x, y)).skip(unit.start).take(unit.count).batch(batch)

  return estimator_ext.work_units(units, unit_fn, config)


def wide_deep_arrays(shard_id, num_batches):
  """({"id": ids [n, 1]}, y [n, 1]) of one shard: y = 0.1 * id - 1, ids repeat within a batch."""
  rng = np.random.default_rng(2000 + shard_id)
  ids = rng.integers(0, VOCAB, size=(num_batches * BATCH_SIZE, 1)).astype(np.int64)
  return {"id": ids}, (0.1 * ids - 1.0).astype(np.float32)


def wide_deep_train_input_fn(config):
  shards = [int(n) for n in FLAGS.shard_batches]  # examples/estimator_train.py's flag
  features, labels = wide_deep_arrays(config.worker_id, shards[config.worker_id % len(shards)])
  return tf.data.Dataset.from_tensor_slices((features, labels)).batch(BATCH_SIZE)


def wide_deep_eval_input_fn():
  features, labels = wide_deep_arrays(100, 3)
  return tf.data.Dataset.from_tensor_slices((features, labels)).batch(BATCH_SIZE)


def wide_deep(config):
  ids = tf.compat.v1.feature_column.categorical_column_with_identity("id", VOCAB)
  v1 = tf.compat.v1
  linear_opt, dnn_opt = {
      "instances": (v1.train.FtrlOptimizer(0.05), v1.train.AdagradOptimizer(0.05)),
      # The canned wide & deep's defaults: Ftrl min(0.005, 1/sqrt(1 column)), Adagrad 0.001.
      "canned_defaults": (v1.train.FtrlOptimizer(0.005), v1.train.AdagradOptimizer(0.001)),
      "names_and_callables": ("Ftrl", lambda: v1.train.AdagradOptimizer(
          v1.train.exponential_decay(0.001, v1.train.get_global_step(), 1, decay_rate=1.0))),
  }[_OPTIMIZERS.value]
  return tf.compat.v1.estimator.DNNLinearCombinedRegressor(
      linear_feature_columns=[ids],
      linear_optimizer=estimator_ext.sync_optimizer(linear_opt),
      dnn_feature_columns=[tf.compat.v1.feature_column.embedding_column(ids, EMBEDDING_DIM)],
      dnn_optimizer=estimator_ext.sync_optimizer(dnn_opt),
      dnn_hidden_units=[8], input_layer_partitioner=tf.compat.v1.fixed_size_partitioner(2),
      config=config)


def main(argv):
  del argv
  time.sleep(_START_DELAY.value)
  stopping = (estimator_ext.EarlyStopping(metric="loss", patience=_PATIENCE.value,
                                          min_delta=_MIN_DELTA.value)
              if _PATIENCE.value else None)
  config = estimator_ext.EpochSyncRunConfig(
      FLAGS.model_dir, early_stopping=stopping,
      in_loop_eval=_IN_LOOP.value or None, tf_random_seed=_SEED.value,
      evaluator_timeout_secs=_EVAL_TIMEOUT.value)
  warm_start = None
  if _WARM_FROM.value:
    warm_start = tf.estimator.WarmStartSettings(
        _WARM_FROM.value, vars_to_warm_start=_WARM_VARS.value if _WARM_VARS.value else ".*")
  if _MODEL.value == "linear":
    estimator = tf.compat.v1.estimator.Estimator(estimator_train.model_fn, config=config,
                                                 warm_start_from=warm_start)
    train_input_fn, eval_input_fn = estimator_train.train_input_fn, estimator_train.eval_input_fn
    if _UNIT_BATCHES.value:
      train_input_fn = unit_train_input_fn
  else:
    estimator = wide_deep(config)
    train_input_fn, eval_input_fn = wide_deep_train_input_fn, wide_deep_eval_input_fn
  result = estimator_ext.train_and_evaluate(
      estimator, tf.estimator.TrainSpec(
          train_input_fn, hooks=[_SleepAfterStep()] if _STEP_SLEEP.value else []),
      tf.estimator.EvalSpec(eval_input_fn, steps=None))
  metrics, _ = result  # What stock train_and_evaluate returns: the last evaluation's metrics.
  summary = {"task": config.task_name, "metrics": metrics,
             "epochs_trained": result.epochs_trained,
             "stopped_after": result.stopped_after,
             "per_epoch": {str(e): m for e, m in result.per_epoch.items()}}
  path = os.path.join(estimator.model_dir, f"summary-{config.task_name.replace(':', '-')}.json")
  with open(path, "w") as f:
    json.dump(summary, f)


if __name__ == "__main__":
  app.run(main)
