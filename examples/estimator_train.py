"""One task of the Estimator example job, switched to tf-epochsync (estimator_ext).

examples/estimator_before.py is the same job on stock TensorFlow; docs/estimator.md shows the
diff between the two. `./es demo --api=estimator` starts one process per task (chief, workers,
2 ps, evaluator), each with its TF_CONFIG; every task runs this module.

Typical usage (by hand, one task):
  TF_CONFIG='{"cluster": {...}, "task": {"type": "chief", "index": 0}}' \
      python -m examples.estimator_train --model_dir=/shared/run --num_epochs=3
"""

from absl import app
from absl import flags
import tensorflow as tf

import estimator_ext
from examples.estimator_data import BATCH_SIZE, EVAL_BATCHES, EVAL_SHARD, FEATURES, shard_arrays

_SHARD_BATCHES = flags.DEFINE_list(
    "shard_batches", ["9", "5", "0"], "Batches in each training task's shard, by its id in the "
    "cluster (chief 0, worker:i i+1).")
_NUM_EPOCHS = flags.DEFINE_integer("num_epochs", 3, "Passes over every shard.", lower_bound=1)
_LEARNING_RATE = flags.DEFINE_float("learning_rate", 0.05, "Plain SGD learning rate.")
_MODEL_DIR = flags.DEFINE_string("model_dir", None, "Checkpoints and eval results; storage "
                                 "every task sees.")


def train_input_fn(config):
  """One pass over this task's shard, in batches."""
  shards = [int(n) for n in _SHARD_BATCHES.value]
  shard_id = config.global_id_in_cluster
  x, y = shard_arrays(shard_id, shards[shard_id % len(shards)])
  dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH_SIZE)
  return dataset


def eval_input_fn():
  x, y = shard_arrays(EVAL_SHARD, EVAL_BATCHES)
  return tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH_SIZE)


def model_fn(features, labels, mode):
  """Linear regression, mean squared error, plain SGD."""
  w = tf.compat.v1.get_variable("w", [FEATURES], initializer=tf.compat.v1.zeros_initializer())
  b = tf.compat.v1.get_variable("b", [], initializer=tf.compat.v1.zeros_initializer())
  predictions = tf.linalg.matvec(features, w) + b
  if mode == tf.estimator.ModeKeys.PREDICT:
    return tf.estimator.EstimatorSpec(mode, predictions=predictions)
  loss = tf.reduce_mean(tf.square(predictions - labels))
  if mode == tf.estimator.ModeKeys.EVAL:
    mae = tf.compat.v1.metrics.mean_absolute_error(labels, predictions)
    return tf.estimator.EstimatorSpec(mode, loss=loss, eval_metric_ops={"mae": mae})
  optimizer = tf.compat.v1.train.GradientDescentOptimizer(_LEARNING_RATE.value)
  optimizer = estimator_ext.sync_optimizer(optimizer)
  train_op = optimizer.minimize(loss, global_step=tf.compat.v1.train.get_global_step())
  return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def main(argv):
  del argv
  config = estimator_ext.EpochSyncRunConfig(_MODEL_DIR.value, num_epochs=_NUM_EPOCHS.value)
  estimator = tf.compat.v1.estimator.Estimator(model_fn, config=config)
  train_spec = tf.estimator.TrainSpec(train_input_fn)
  eval_spec = tf.estimator.EvalSpec(eval_input_fn, steps=None, throttle_secs=0)
  estimator_ext.train_and_evaluate(estimator, train_spec, eval_spec)


if __name__ == "__main__":
  app.run(main)
