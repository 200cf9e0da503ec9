"""One task of the example job: a linear (or embedding) model trained for N epochs on this worker's shard.

The launcher (`python -m examples.local_cluster`) starts one process per task with its
TF_CONFIG; every task may run this module: a ps task serves, the evaluator evaluates each
epoch checkpoint, the chief and the workers train. It is also what a user's job looks like
with tf-epochsync switched on: the usual graph and loop, `EpochInput` for the input, and
`hooks.monitored_training_session` where `tf.compat.v1.train.MonitoredTrainingSession` was.
The embedding model also counts its feature ids in the first epoch only (`feature_counts`,
e.g. for frequency-based admission), through `epoch_input.epoch_tensor`.

Typical usage (by hand, one task):
  TF_CONFIG='{"cluster": {...}, "task": {"type": "worker", "index": 1}}' \
      python -m examples.train --shard_batches=9,5,0 --model_dir=/tmp/run \
      --epochsync_num_epochs=3
"""

import json
import os
import re
import time
from typing import Callable, Dict, List, Optional, Sequence

from absl import app
from absl import flags
from absl import logging
import numpy as np
import tensorflow as tf

from hooks.config import cluster as cluster_lib
from hooks.config import flags as epochsync_flags
from hooks.data.epoch_input import EpochInput
from hooks.errors import SyncTimeoutError
from hooks.sync.elastic_apply import ElasticOptimizer
from hooks.sync.optimizer import WorkerDoneSyncReplicasOptimizer
from hooks.session.training_session import monitored_training_session
from hooks.workqueue import UnitReplay, WorkUnit, work_queue_input

_SHARD_BATCHES = flags.DEFINE_list(
    "shard_batches", ["9", "5", "0"], "Batches in each training worker's shard, by worker id.")
_UNIT_BATCHES = flags.DEFINE_list(
    "unit_batches", [], "Train through a work queue (hooks.workqueue) instead of static shards: "
    "the epoch's units, by their size in batches; each worker takes the next unit when its "
    "last one ends (replaces --shard_batches).")
_UNIT_REPLAY = flags.DEFINE_string("unit_replay", None, "An audit file (epochsync_epochs.jsonl) "
                                   "whose assignment of units to workers is imposed again.")
_BATCH_SIZE = flags.DEFINE_integer("batch_size", 8, "Examples per batch.", lower_bound=1)
_MODEL = flags.DEFINE_enum("model", "linear", ["linear", "embedding"],
                           "linear: dense gradients; embedding: a table partitioned over the "
                           "ps tasks, sparse gradients.")
_FEATURES = flags.DEFINE_integer("features", 16, "Input features (linear) or vocabulary size "
                                 "(embedding).", lower_bound=1)
_LEARNING_RATE = flags.DEFINE_float("learning_rate", 0.05, "Plain SGD learning rate.")
_MODEL_DIR = flags.DEFINE_string("model_dir", None, "Checkpoints, the epoch audit, TensorBoard "
                                 "events and each task's summary JSON.")
_SUMMARY_STEPS = flags.DEFINE_integer("summary_steps", 10, "The chief writes the loss summary "
                                      "and global_step/sec every this many steps.",
                                      lower_bound=1)
_WORKER_POLL_SECS = flags.DEFINE_float("worker_poll_secs", 0.5, "How often a worker re-checks "
                                       "whether the chief initialised the model (TensorFlow's "
                                       "own MonitoredTrainingSession: 30).")
_EVAL_BATCHES = flags.DEFINE_integer("eval_batches", 4, "Batches of the evaluator's data.",
                                     lower_bound=1)

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


def work_units(unit_batches: Sequence[int], batch_size: int) -> List[WorkUnit]:
  """The units of the work-queue job: consecutive row ranges of `unit_arrays`, one per size."""
  units, start = [], 0
  for batches in unit_batches:
    units.append(WorkUnit("", start, start + batches * batch_size))
    start += batches * batch_size
  return units


def unit_arrays(model: str, unit_batches: Sequence[int], batch_size: int, features: int):
  """The (inputs, labels) every unit is a row range of (as shard_arrays, from one seed)."""
  return shard_arrays(model, 999, sum(unit_batches), batch_size, features)


def unit_input(model: str, config, settings, unit_batches: Sequence[int]) -> EpochInput:
  """An EpochInput over the work queue of `unit_batches`."""
  inputs, labels = unit_arrays(model, unit_batches, _BATCH_SIZE.value, _FEATURES.value)

  def unit_fn(unit):
    rows = tf.data.Dataset.from_tensor_slices((inputs, labels))
    return rows.skip(unit.start).take(unit.count).batch(_BATCH_SIZE.value)

  replay = _UNIT_REPLAY.value and UnitReplay.from_audit(_UNIT_REPLAY.value, len(unit_batches))
  return work_queue_input(work_units(unit_batches, _BATCH_SIZE.value), unit_fn,
                          settings.num_epochs, config.num_workers, config.worker_id,
                          config.task_name, replay=replay or None, settings=settings)


def first_epoch_counts(ids, epoch_tensor, vocabulary: int):
  """Counts every id in the first epoch only (`feature_counts` on a ps); returns `ids`.

  The count runs in the same step as the batch that carries the ids, so it covers exactly
  the first epoch's examples of every shard; a restart resumes from the newest checkpoint,
  which holds the counts, and later epochs add nothing. A mid-epoch checkpoint of the first
  epoch may also hold the counts of the steps in flight at its save (docs/mts.md, "Mid-epoch
  checkpoints"), which the resumed epoch then counts again.
  """
  counts = _v1.get_variable("feature_counts", [vocabulary], tf.int64, _v1.zeros_initializer(),
                            trainable=False, use_resource=False)

  def _count():
    with tf.control_dependencies([_v1.scatter_add(counts, ids, tf.ones_like(ids),
                                                  use_locking=True)]):
      return tf.identity(ids)

  return tf.cond(tf.equal(epoch_tensor, 0), _count, lambda: tf.identity(ids))


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


class _StartupTimes(_v1.train.SessionRunHook):
  """Records when the session was created and when this task's first step finished."""

  def __init__(self, times: Dict[str, float]):
    self._times = times

  def after_create_session(self, session, coord):
    self._times.setdefault("session_created_at", time.time())

  def after_run(self, run_context, run_values):
    self._times.setdefault("first_step_at", time.time())


def train(extra_hooks: Callable[[cluster_lib.ClusterConfig, EpochInput], List] = (
    lambda config, epoch_input: []),
          listeners: Sequence[_v1.train.CheckpointSaverListener] = ()) -> Optional[dict]:
  """Runs this task: trains every epoch (chief, worker), serves (ps) or evaluates (evaluator).

  `extra_hooks(config, epoch_input)` may add hooks (tests use it to inject faults);
  `listeners` go around the chief's epoch checkpoints.
  Returns a training task's summary (also written to <model_dir>/summary-<task>.json).
  """
  _v1.disable_v2_behavior()
  config = epochsync_flags.cluster_from_flags()
  settings = epochsync_flags.settings_from_flags()
  if config.is_evaluator:
    return evaluate(config, settings)
  server = config.start_server()  # (a worker beyond the launch's cluster boots as a joiner)
  if config.is_ps:
    server.join()
  shard = [int(n) for n in _SHARD_BATCHES.value]
  num_batches = shard[config.worker_id % len(shard)]
  with _v1.device(_v1.train.replica_device_setter(
      worker_device=config.job_device, cluster=config.cluster_spec())):
    global_step = _v1.train.get_or_create_global_step()
    if _UNIT_BATCHES.value:
      epoch_input = unit_input(_MODEL.value, config, settings,
                               [int(n) for n in _UNIT_BATCHES.value])
    else:
      dataset = shard_dataset(_MODEL.value, config.worker_id, num_batches, _BATCH_SIZE.value,
                              _FEATURES.value)
      epoch_input = EpochInput(dataset, settings.num_epochs, config.task_name)
    x, y = epoch_input.get_next()
    if _MODEL.value == "embedding":
      x = first_epoch_counts(x, epoch_input.epoch_tensor, _FEATURES.value)
    loss = model_loss(_MODEL.value, x, y, _FEATURES.value, config.num_ps)
    _v1.summary.scalar("loss", loss)
    optimizer = _v1.train.GradientDescentOptimizer(_LEARNING_RATE.value)
    if not settings.sync and settings.elastic:  # each batch counts once it is applied
      optimizer = ElasticOptimizer(optimizer)
    if settings.sync:  # --epochsync_sync (default): one update per step from all active workers
      optimizer = WorkerDoneSyncReplicasOptimizer(
          optimizer, config.num_workers, config.worker_id, worker_names=config.worker_names,
          divide_by_initial_workers=settings.divide_by_initial_workers)
    train_op = optimizer.minimize(loss, global_step=global_step)
  model_dir = _MODEL_DIR.value
  times: Dict[str, float] = {}
  scaffold = _v1.train.Scaffold(  # init_fn runs on the chief right after it initialised
      init_fn=lambda scaffold, session: times.setdefault("initialised_at", time.time()))
  start, last_loss = time.monotonic(), float("nan")
  with monitored_training_session(
      master=server.target, is_chief=config.is_chief, checkpoint_dir=model_dir,
      scaffold=scaffold, hooks=[_StartupTimes(times)] + extra_hooks(config, epoch_input),
      save_summaries_steps=_SUMMARY_STEPS.value, log_step_count_steps=_SUMMARY_STEPS.value,
      epoch_input=epoch_input, settings=settings, cluster=config, listeners=listeners,
      sync_optimizer=optimizer if settings.sync else None,
      poll_secs=_WORKER_POLL_SECS.value) as sess:
    while not sess.should_stop():
      last_loss, _ = sess.run([loss, train_op])
  history = epoch_input.hook.history
  summary = {"task": config.task_name, "epochs": [s.epoch for s in history],
             "batches": [s.batches for s in history],
             "examples": [s.examples for s in history],
             "started_at": [s.started_at for s in history],
             "ended_at": [s.ended_at for s in history],
             "loss": float(last_loss), "secs": round(time.monotonic() - start, 2), **times}
  return _write_summary(config, summary)


def evaluate(config: cluster_lib.ClusterConfig, settings) -> dict:
  """The evaluator: the loss of every new epoch checkpoint on held-out data, until the last.

  It reads `model_dir` only (no server: the evaluator is not part of the training cluster),
  writes the loss to `<model_dir>/eval` for TensorBoard, and gives up (SyncTimeoutError) when
  no new checkpoint came for --epochsync_startup_timeout_secs + --epochsync_barrier_timeout_secs.
  """
  model_dir, last_epoch = _MODEL_DIR.value, settings.num_epochs - 1
  if not model_dir:
    raise ValueError("the evaluator needs --model_dir (the storage the chief saves to)")
  inputs, labels = shard_arrays(_MODEL.value, 10_000, _EVAL_BATCHES.value, _BATCH_SIZE.value,
                                _FEATURES.value)  # held-out: a seed no worker uses
  global_step = _v1.train.get_or_create_global_step()
  loss = model_loss(_MODEL.value, tf.constant(inputs), tf.constant(labels), _FEATURES.value,
                    config.num_ps)
  saver = _v1.train.Saver()
  writer = _v1.summary.FileWriter(os.path.join(model_dir, "eval"))
  evaluated: List[dict] = []
  wait = settings.startup_timeout_secs + settings.barrier_timeout_secs
  with _v1.Session() as session:
    for path in tf.train.checkpoints_iterator(model_dir, min_interval_secs=0.5, timeout=wait):
      match = re.search(r"epoch(\d+)-(\d+)$", path)
      if not match:
        continue
      saver.restore(session, path)
      value, step = session.run([loss, global_step])
      epoch = int(match.group(1))
      writer.add_summary(_v1.Summary(value=[_v1.Summary.Value(tag="loss", simple_value=value)]),
                         int(step))
      writer.flush()
      logging.info("%s: epoch %d checkpoint (global_step %d): loss %.5f", config.task_name,
                   epoch, step, value)
      evaluated.append({"epoch": epoch, "global_step": int(step), "loss": float(value),
                        "checkpoint": path})
      if epoch >= last_epoch:
        break
    else:
      got = evaluated[-1]["epoch"] if evaluated else "none"
      raise SyncTimeoutError(
          f"{config.task_name} waited {wait:g} s for a new epoch checkpoint in {model_dir} "
          f"(last evaluated epoch: {got}, last epoch: {last_epoch}); missing "
          f"{config.worker_names[0]} (check its log, that model_dir is shared storage, or raise "
          "--epochsync_barrier_timeout_secs)", [config.worker_names[0]])
  writer.close()
  return _write_summary(config, {"task": config.task_name, "evaluated": evaluated})


def _write_summary(config: cluster_lib.ClusterConfig, summary: dict) -> dict:
  logging.info("summary %s", json.dumps(summary))
  if _MODEL_DIR.value:
    path = os.path.join(_MODEL_DIR.value,
                        "summary-" + config.task_name.replace(":", "-") + ".json")
    with open(path, "w") as f:
      json.dump(summary, f)
  return summary


def main(argv):
  del argv
  train()


if __name__ == "__main__":
  app.run(main)
