"""Cluster test task: synchronous SGD on fixed uneven shards, epochs run by a manual loop.

Each task trains its shard of tests/tasks/sync_data.py (no shuffling) with
WorkerDoneSyncReplicasOptimizer (or stock SyncReplicasOptimizer with --optimizer=stock: one pass,
no DONE markers) and writes <output_dir>/<task>.json; the chief adds the final params and
global_step. The epoch loop is TEST-ONLY: instead of the epoch barrier hooks, every task waits
(bounded) at start until all tasks have a session, and after its DONE markers until the chief's
aggregation has consumed the epoch's last marker (completed_epochs), then runs EPOCH_START_OPS.

Typical usage (what tests/test_sync_optimizer.py starts on every task of a LocalCluster):
  python tests/tasks/sync_linear.py --shard_batches=7,4,1 --epochsync_num_epochs=2 --output_dir=/tmp/o
"""

import json
import os
import time

from absl import app
from absl import flags
from absl import logging
import tensorflow as tf

import sync_data
from hooks.config import cluster as cluster_lib
from hooks.config import flags as epochsync_flags
from hooks import graph_keys
from hooks.session import creators as session_lib
from hooks.sync.optimizer import WorkerDoneSyncReplicasOptimizer

_SHARDS = flags.DEFINE_list("shard_batches", ["7", "4", "1"], "Batches per worker, by worker_id.")
_BATCH = flags.DEFINE_integer("batch_size", 4, "Examples per batch.")
_MODEL = flags.DEFINE_enum("model", "linear", ["linear", "embedding"],
                           "linear: y = x.w + b; embedding: y = sum(emb[id]) + b, emb split over "
                           "the ps tasks (sparse gradients).")
_OPTIMIZER = flags.DEFINE_enum("optimizer", "ours", ["ours", "stock"], "Which SyncReplicas.")
_OUTPUT_DIR = flags.DEFINE_string("output_dir", None, "Where <task>.json is written.")
_DIE_AFTER = flags.DEFINE_integer("die_after_steps", 0, "Exit with code 7 after this many "
                                  "steps (a crash mid-epoch); 0: never.")
_DIE_IN_STEP = flags.DEFINE_integer("die_in_step", 0, "Exit with code 7 in the middle of this "
                                   "step (1-based): after its GRAD marker was sent, before its "
                                   "gradient was; 0: never.")
_SKIP_START = flags.DEFINE_bool("skip_epoch_start_ops", False, "Misuse on purpose: never run "
                                "EPOCH_START_OPS, so a worker that sat out steps goes stale.")
_WAIT_SECS = flags.DEFINE_float("wait_timeout_secs", 60, "Bound of the test-only waits.")

_v1 = tf.compat.v1


def _wait_until(predicate, what: str) -> None:
  """Polls `predicate` every 20 ms for at most --wait_timeout_secs."""
  deadline = time.monotonic() + _WAIT_SECS.value
  while not predicate():
    if time.monotonic() > deadline:
      raise TimeoutError(f"gave up after {_WAIT_SECS.value} s waiting for {what}")
    time.sleep(0.02)


def _die_in_step(x, task_name):
  """x, through a py_func that ends the process during step --die_in_step, mid-computation."""
  steps = []

  def maybe_die(value):
    steps.append(1)
    if len(steps) == _DIE_IN_STEP.value:
      time.sleep(1.0)  # Meanwhile the ps runs this step's marker enqueue (it needs no gradient).
      logging.info("%s exits on purpose in the middle of step %d (--die_in_step)", task_name,
                   len(steps))
      logging.flush()
      os._exit(7)  # pylint: disable=protected-access
    return value

  out = _v1.py_func(maybe_die, [x], tf.float32, stateful=True)
  out.set_shape(x.shape)
  return out


def _build_model(config):
  """(placeholders, loss, {name: variable}) of --model."""
  if _MODEL.value == "linear":
    x = _v1.placeholder(tf.float32, [None, sync_data.DIM])
    inputs = _die_in_step(x, config.task_name) if _DIE_IN_STEP.value else x
    w = _v1.get_variable("w", [sync_data.DIM], initializer=_v1.zeros_initializer())
    b = _v1.get_variable("b", [], initializer=_v1.zeros_initializer())
    y = _v1.placeholder(tf.float32, [None])
    return (x, y), tf.reduce_mean((tf.linalg.matvec(inputs, w) + b - y) ** 2), {"w": w, "b": b}
  ids = _v1.placeholder(tf.int64, [None])
  emb = _v1.get_variable("emb", [sync_data.VOCAB, sync_data.EMB_DIM],
                         initializer=_v1.zeros_initializer(),
                         partitioner=_v1.fixed_size_partitioner(config.num_ps))
  b = _v1.get_variable("b", [], initializer=_v1.zeros_initializer())
  y = _v1.placeholder(tf.float32, [None])
  rows = _v1.nn.embedding_lookup(emb, ids, partition_strategy="div")
  return (ids, y), tf.reduce_mean((tf.reduce_sum(rows, 1) + b - y) ** 2), {"emb": emb.as_tensor(), "b": b}


def main(argv):
  del argv
  _v1.disable_v2_behavior()
  config = cluster_lib.ClusterConfig.from_tf_config()
  settings = epochsync_flags.settings_from_flags()
  server = tf.distribute.Server(config.cluster_spec(), job_name=config.task_type,
                                task_index=config.task_index)
  make = sync_data.linear_shards if _MODEL.value == "linear" else sync_data.embedding_shards
  shard = make([int(n) for n in _SHARDS.value], _BATCH.value)[config.worker_id]
  n, stock = config.num_workers, _OPTIMIZER.value == "stock"
  with _v1.device(_v1.train.replica_device_setter(cluster=config.cluster_spec(),
                                                  worker_device=config.job_device)):
    global_step = _v1.train.get_or_create_global_step()
    feeds, loss, params = _build_model(config)
    started = _v1.get_variable("sync_test_started", [], tf.int64, _v1.zeros_initializer(),
                               trainable=False)
    sgd = _v1.train.GradientDescentOptimizer(sync_data.LEARNING_RATE)
    if stock:
      opt = _v1.train.SyncReplicasOptimizer(sgd, replicas_to_aggregate=n, total_num_replicas=n)
    else:
      opt = WorkerDoneSyncReplicasOptimizer(
          sgd, n, config.worker_id, settings.divide_by_initial_workers, config.worker_names)
    train_op = opt.minimize(loss, global_step=global_step)
  arrive = started.assign_add(1)
  hook = (opt.make_session_run_hook(config.is_chief, num_tokens=0) if stock else
          opt.make_session_run_hook(config.is_chief, num_tokens=0,
                                    step_timeout_secs=settings.step_timeout_secs,
                                    warn_after_secs=settings.warn_after_secs,
                                    log_every_secs=settings.log_every_secs))
  report = {"task": config.task_name, "examples_per_epoch": [], "steps_per_epoch": []}
  creator = session_lib.session_creator(config, master=server.target)
  with _v1.train.MonitoredSession(session_creator=creator, hooks=[hook]) as sess:
    sess.run(arrive)
    _wait_until(lambda: sess.run(started) >= n, "every task's session")
    total_steps = 0
    for epoch in range(1 if stock else settings.num_epochs):
      start = time.monotonic()
      if not _SKIP_START.value:
        sess.run(_v1.get_collection(graph_keys.EPOCH_START_OPS))
      examples = 0
      for batch in shard:
        sess.run(train_op, dict(zip(feeds, batch)))
        examples, total_steps = examples + len(batch[1]), total_steps + 1
        if total_steps == _DIE_AFTER.value:
          logging.info("%s exits on purpose after %d steps (--die_after_steps)", config.task_name,
                       total_steps)
          logging.flush()
          os._exit(7)  # pylint: disable=protected-access
      if not stock:
        sess.run(_v1.get_collection(graph_keys.DONE_OPS))
        _wait_until(lambda: sess.run(opt.sync_ops.completed_epochs) > epoch, f"epoch {epoch} end")
      report["examples_per_epoch"].append(examples)
      report["steps_per_epoch"].append(len(shard))
      logging.info("%s epoch %d: %d examples, %d steps, %.2f s", config.task_name, epoch, examples,
                   len(shard), time.monotonic() - start)
    if config.is_chief:
      values, step = sess.run([params, global_step])
      report["global_step"] = int(step)
      report["params"] = {k: v.tolist() for k, v in values.items()}
  with open(os.path.join(_OUTPUT_DIR.value, config.task_name.replace(":", "-") + ".json"), "w") as f:
    json.dump(report, f)
  logging.info("%s finished", config.task_name)


if __name__ == "__main__":
  flags.mark_flag_as_required("output_dir")
  app.run(main)
