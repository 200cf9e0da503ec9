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
_MODEL = flags.DEFINE_enum("model", "linear", ["linear", "embedding"],
                           "linear: dense gradients; embedding: a table partitioned over the "
                           "ps tasks, sparse gradients.")
_FEATURES = flags.DEFINE_integer("features", 16, "Input features (linear) or vocabulary size "
                                 "(embedding).", lower_bound=1)
_LEARNING_RATE = flags.DEFINE_float("learning_rate", 0.05, "Plain SGD learning rate.")
_MODEL_DIR = flags.DEFINE_string("model_dir", None, "Checkpoints, the epoch audit and each "
                                 "task's summary JSON.")

_v1 = tf.compat.v1
EMBEDDING_DIM = 4


def shard_arrays(model: str, worker_id: int, num_batches: int, batch_size: int,
                 features: int):
  """The deterministic (inputs, labels) of one worker's shard, labels of shape [examples].

  linear: inputs are features [examples, features]; embedding: inputs are ids in
  [0, features) (a CTR-style sparse feature, several ids repeat within a batch).
  """
  rng = np.random.default_rng(1000 + worker_id)
  n = num_batches * batch_size
  if model == "embedding":
    ids = rng.integers(0, features, size=n)
    return ids.astype(np.int64), (0.2 * ids - 1.0).astype(np.float32)
  true_w = np.linspace(-1.0, 1.0, features, dtype=np.float32)
  x = rng.normal(size=(n, features)).astype(np.float32)
  return x, x @ true_w + np.float32(0.5)


def shard_dataset(model: str, worker_id: int, num_batches: int, batch_size: int,
                  features: int):
  """One pass over one worker's shard, batched; never repeated."""
  inputs, labels = shard_arrays(model, worker_id, num_batches, batch_size, features)
  return tf.data.Dataset.from_tensor_slices((inputs, labels)).batch(batch_size)


def model_loss(model: str, inputs, labels, features: int, num_ps: int):
  """Mean squared error of a linear model, or of an embedding table partitioned over the ps."""
  b = _v1.get_variable("b", [], initializer=_v1.zeros_initializer())
  if model == "embedding":
    emb = _v1.get_variable("emb", [features, EMBEDDING_DIM], initializer=_v1.zeros_initializer(),
                           partitioner=_v1.fixed_size_partitioner(num_ps))
    prediction = tf.reduce_sum(tf.nn.embedding_lookup(emb, inputs), axis=1) + b  # sparse grads
  else:
    w = _v1.get_variable("w", [features], initializer=_v1.zeros_initializer())
    prediction = tf.linalg.matvec(inputs, w) + b
  return tf.reduce_mean(tf.square(prediction - labels))


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
    dataset = shard_dataset(_MODEL.value, config.worker_id, num_batches, _BATCH_SIZE.value,
                            _FEATURES.value)
    epoch_input = EpochInput(dataset, settings.num_epochs, config.task_name)
    x, y = epoch_input.get_next()
    loss = model_loss(_MODEL.value, x, y, _FEATURES.value, config.num_ps)
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
