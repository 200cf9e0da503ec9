"""One task of the example job: a linear model trained on this worker's shard.

The launcher (`python -m examples.local_cluster`) starts one process per task with its
TF_CONFIG; ps tasks run hooks.testing.ps_task, every training task runs this module.

Typical usage (by hand, one task):
  TF_CONFIG='{"cluster": {...}, "task": {"type": "worker", "index": 1}}' \
      python -m examples.train --shard_batches=9,5,0 --output_dir=/tmp/run
"""

import json
import os
import time

from absl import app
from absl import flags
from absl import logging
import numpy as np
import tensorflow as tf

from hooks import cluster as cluster_lib
from hooks import session as session_lib

_SHARD_BATCHES = flags.DEFINE_list(
    "shard_batches", ["9", "5", "0"], "Batches in each training worker's shard, by worker id.")
_BATCH_SIZE = flags.DEFINE_integer("batch_size", 8, "Examples per batch.", lower_bound=1)
_FEATURES = flags.DEFINE_integer("features", 16, "Input features of the linear model.",
                                 lower_bound=1)
_LEARNING_RATE = flags.DEFINE_float("learning_rate", 0.05, "Plain SGD learning rate.")
_OUTPUT_DIR = flags.DEFINE_string("output_dir", None, "Where each task writes its summary.")

_v1 = tf.compat.v1


def shard_arrays(worker_id: int, num_batches: int, batch_size: int, features: int):
  """The deterministic (x, y) examples of one worker's shard."""
  rng = np.random.default_rng(1000 + worker_id)
  true_w = np.linspace(-1.0, 1.0, features, dtype=np.float32)[:, None]
  x = rng.normal(size=(num_batches * batch_size, features)).astype(np.float32)
  y = x @ true_w + np.float32(0.5)
  return x, y


def shard_dataset(worker_id: int, num_batches: int, batch_size: int, features: int):
  """One pass over one worker's shard, batched; never repeated."""
  x, y = shard_arrays(worker_id, num_batches, batch_size, features)
  return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch_size)


def linear_model(x, y, features: int):
  """Returns (loss, weights, bias) of a linear regression with mean squared error."""
  w = _v1.get_variable("w", [features, 1], initializer=_v1.zeros_initializer())
  b = _v1.get_variable("b", [1], initializer=_v1.zeros_initializer())
  loss = tf.reduce_mean(tf.square(tf.matmul(x, w) + b - y))
  return loss, w, b


def main(argv):
  del argv
  _v1.disable_v2_behavior()
  config = cluster_lib.ClusterConfig.from_tf_config()
  server = tf.distribute.Server(config.cluster_spec(), job_name=config.task_type,
                                task_index=config.task_index, config=config.session_config())
  shard = [int(n) for n in _SHARD_BATCHES.value]
  num_batches = shard[config.worker_id % len(shard)]
  with _v1.device(_v1.train.replica_device_setter(
      worker_device=config.job_device, cluster=config.cluster_spec())):
    global_step = _v1.train.get_or_create_global_step()
    dataset = shard_dataset(config.worker_id, num_batches, _BATCH_SIZE.value, _FEATURES.value)
    x, y = _v1.data.make_one_shot_iterator(dataset).get_next()
    loss, _, _ = linear_model(x, y, _FEATURES.value)
    train_op = _v1.train.GradientDescentOptimizer(_LEARNING_RATE.value).minimize(
        loss, global_step=global_step)
  creator = session_lib.session_creator(config, master=server.target)
  steps, start = 0, time.monotonic()
  last_loss = float("nan")
  with _v1.train.MonitoredSession(session_creator=creator) as sess:
    while not sess.should_stop():
      try:
        last_loss, _ = sess.run([loss, train_op])
      except tf.errors.OutOfRangeError:
        break
      steps += 1
  summary = {"task": config.task_name, "steps": steps,
             "examples": steps * _BATCH_SIZE.value, "loss": float(last_loss),
             "secs": round(time.monotonic() - start, 2)}
  logging.info("summary %s", json.dumps(summary))
  if _OUTPUT_DIR.value:
    os.makedirs(_OUTPUT_DIR.value, exist_ok=True)
    path = os.path.join(_OUTPUT_DIR.value, config.task_name.replace(":", "-") + ".json")
    with open(path, "w") as f:
      json.dump(summary, f)


if __name__ == "__main__":
  app.run(main)
