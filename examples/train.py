"""One task of the example job: a linear model trained for N epochs on this worker's shard.

The launcher (`python -m examples.local_cluster`) starts one process per task with its
TF_CONFIG; ps tasks run hooks.testing.ps_task, every training task runs this module. It
is also what a user's job looks like with tf-epochsync switched on: the usual graph and
loop plus `EpochInput`, `epoch_sync_hooks` and the `--epochsync_*` flags.

Typical usage (by hand, one task):
  TF_CONFIG='{"cluster": {...}, "task": {"type": "worker", "index": 1}}' \
      python -m examples.train --shard_batches=9,5,0 --model_dir=/tmp/run \
      --epochsync_num_epochs=3
"""

import json
import os
import time
from typing import Callable, List, Optional

from absl import app
from absl import flags
from absl import logging
import numpy as np
import tensorflow as tf

from hooks import cluster as cluster_lib
from hooks import flags as epochsync_flags
from hooks import session as session_lib
from hooks.epoch_input import EpochInput
from hooks.epoch_sync import epoch_sync_hooks
from hooks.sync_optimizer import WorkerDoneSyncReplicasOptimizer

_SHARD_BATCHES = flags.DEFINE_list(
    "shard_batches", ["9", "5", "0"], "Batches in each training worker's shard, by worker id.")
_BATCH_SIZE = flags.DEFINE_integer("batch_size", 8, "Examples per batch.", lower_bound=1)
_FEATURES = flags.DEFINE_integer("features", 16, "Input features of the linear model.",
                                 lower_bound=1)
_LEARNING_RATE = flags.DEFINE_float("learning_rate", 0.05, "Plain SGD learning rate.")
_MODEL_DIR = flags.DEFINE_string("model_dir", None, "Checkpoints, the epoch audit and each "
                                 "task's summary JSON.")

_v1 = tf.compat.v1


def shard_arrays(worker_id: int, num_batches: int, batch_size: int, features: int):
  """The deterministic (x, y) examples of one worker's shard; x[:, 0] is a unique example id."""
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


def train(extra_hooks: Callable[[cluster_lib.ClusterConfig, EpochInput], List] = (
    lambda config, epoch_input: [])) -> Optional[dict]:
  """Builds this task's graph and trains every epoch; returns the task's summary.

  `extra_hooks(config, epoch_input)` may add hooks (tests use it to inject faults).
  """
  _v1.disable_v2_behavior()
  config = epochsync_flags.cluster_from_flags()
  settings = epochsync_flags.settings_from_flags()
  server = tf.distribute.Server(config.cluster_spec(), job_name=config.task_type,
                                task_index=config.task_index, config=config.session_config())
  shard = [int(n) for n in _SHARD_BATCHES.value]
  num_batches = shard[config.worker_id % len(shard)]
  with _v1.device(_v1.train.replica_device_setter(
      worker_device=config.job_device, cluster=config.cluster_spec())):
    global_step = _v1.train.get_or_create_global_step()
    dataset = shard_dataset(config.worker_id, num_batches, _BATCH_SIZE.value, _FEATURES.value)
    epoch_input = EpochInput(dataset, settings.num_epochs, config.task_name)
    x, y = epoch_input.get_next()
    loss, _, _ = linear_model(x, y, _FEATURES.value)
    optimizer = _v1.train.GradientDescentOptimizer(_LEARNING_RATE.value)
    if settings.sync:  # --epochsync_sync (default): one update per step from all active workers
      optimizer = WorkerDoneSyncReplicasOptimizer(
          optimizer, config.num_workers, config.worker_id, worker_names=config.worker_names,
          divide_by_initial_workers=settings.divide_by_initial_workers)
    train_op = optimizer.minimize(loss, global_step=global_step)
  sync_hook = optimizer.make_session_run_hook(
      config.is_chief, num_tokens=0, step_timeout_secs=settings.step_timeout_secs,
      warn_after_secs=min(settings.warn_after_secs, settings.step_timeout_secs / 2),
      log_every_secs=settings.log_every_secs) if settings.sync else None
  model_dir = _MODEL_DIR.value
  hooks = epoch_sync_hooks(config, epoch_input, settings, model_dir=model_dir,
                           sync_hook=sync_hook)
  creator = session_lib.session_creator(
      config, master=server.target, checkpoint_dir=model_dir,
      startup_timeout_secs=settings.startup_timeout_secs)
  start, last_loss = time.monotonic(), float("nan")
  with _v1.train.MonitoredSession(session_creator=creator,
                                  hooks=extra_hooks(config, epoch_input) + hooks) as sess:
    while not sess.should_stop():
      last_loss, _ = sess.run([loss, train_op])
  history = epoch_input.hook.history
  summary = {"task": config.task_name, "epochs": [s.epoch for s in history],
             "batches": [s.batches for s in history],
             "examples": [s.examples for s in history],
             "started_at": [s.started_at for s in history],
             "ended_at": [s.ended_at for s in history],
             "loss": float(last_loss), "secs": round(time.monotonic() - start, 2)}
  logging.info("summary %s", json.dumps(summary))
  if model_dir:
    path = os.path.join(model_dir, "summary-" + config.task_name.replace(":", "-") + ".json")
    with open(path, "w") as f:
      json.dump(summary, f)
  return summary


def main(argv):
  del argv
  train()


if __name__ == "__main__":
  app.run(main)
