"""One task of the Estimator example job on stock TensorFlow: the "before" of docs/estimator.md.

Every worker reads its shard num_epochs times (`repeat`) and stops at the end of its data; the
chief saves every 10 minutes. examples/estimator_train.py is this job switched to tf-epochsync.

Typical usage (by hand, one task, or without TF_CONFIG in one process):
  python -m examples.estimator_before --model_dir=/tmp/before --num_epochs=2
"""

from absl import app
from absl import flags
import tensorflow as tf

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
  return dataset.repeat(_NUM_EPOCHS.value)


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
  train_op = optimizer.minimize(loss, global_step=tf.compat.v1.train.get_global_step())
  return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def main(argv):
  del argv
  config = tf.estimator.RunConfig(_MODEL_DIR.value)
  estimator = tf.compat.v1.estimator.Estimator(model_fn, config=config)
  train_spec = tf.estimator.TrainSpec(train_input_fn)
  eval_spec = tf.estimator.EvalSpec(eval_input_fn, steps=None, throttle_secs=0)
  tf.estimator.train_and_evaluate(estimator, train_spec, eval_spec)


if __name__ == "__main__":
  app.run(main)
