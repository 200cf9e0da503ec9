"""One task of the step-overhead benchmark: an MLP or a CTR-style model, sync or async SGD.

--variant=stock:       tf.compat.v1.train.SyncReplicasOptimizer (num_tokens=0), plain iterator.
--variant=ours:        WorkerDoneSyncReplicasOptimizer with EpochInput and the epoch-sync hooks.
--variant=ours-units:  the same, the input from a work queue (hooks.workqueue): every worker's
                       batches, concatenated, cut into units of --unit_batches batches; each
                       worker trains until the queue is empty (about as many steps).
--variant=ours-bare:   our optimizer and its hook on a plain iterator, no epoch hooks.
--variant=async:       plain (asynchronous) SGD, plain iterator, no hooks.
--variant=async-hooks: plain SGD with EpochInput and the epoch-sync hooks.
--model=mlp:           a 3-layer MLP, width -> hidden -> width (--params picks the size).
--save_steps=N --model_dir=D: the chief saves every N steps (stock: CheckpointSaverHook; ours:
                       a mid-epoch checkpoint between two aggregations; bench.save_stall).
--model=ctr:           an embedding table partitioned over every ps task (sparse gradients)
                       and a dense tower on the looked-up ids.

Every worker has the same number of batches (stock would hang on uneven shards). Each task
writes the wall time of every `sess.run(train_op)` to <output_dir>/<task>.json, with its CPU
time over the measured steps and, with --trace_step, the op timings of one traced step.

Typical usage (what bench.step_overhead starts on every task of a LocalCluster):
  python -m bench.sync_task --variant=ours --model=mlp --params=1M --output_dir=/tmp/o
"""

import collections
import dataclasses
import itertools
import json
import os
import time

from absl import app
from absl import flags
import numpy as np
import tensorflow as tf

from bench import task_common
from bench.common import MLP_SIZES
from hooks.session import creators as session_lib
from hooks.data.epoch_input import EpochInput
from hooks.session.wiring import epoch_sync_hooks
from hooks.sync.optimizer import WorkerDoneSyncReplicasOptimizer
from hooks.workqueue import WorkUnit, work_queue_input

__all__ = ["VARIANTS"]

VARIANTS = ("stock", "ours", "ours-units", "ours-bare", "async", "async-hooks")

_VARIANT = flags.DEFINE_enum("variant", "ours", VARIANTS, "What to run (see the module doc).")
_MODEL = flags.DEFINE_enum("model", "mlp", ["mlp", "ctr"], "mlp (dense) or ctr (sparse).")
_PARAMS = flags.DEFINE_enum("params", "1M", list(MLP_SIZES), "MLP size preset.")
_STEPS = flags.DEFINE_integer("steps", 60, "Batches per worker (= synchronous steps).")
_BATCH = flags.DEFINE_integer("batch_size", 64, "Examples per batch.")
_WARMUP = flags.DEFINE_integer("warmup", 10, "Leading steps left out of the CPU time.")
_VOCAB = flags.DEFINE_integer("vocab", 200_000, "ctr: embedding rows (split over the ps tasks).")
_EMB_DIM = flags.DEFINE_integer("emb_dim", 16, "ctr: embedding width.")
_SLOTS = flags.DEFINE_integer("slots", 16, "ctr: sparse ids per example.")
_TRACE_STEP = flags.DEFINE_integer("trace_step", -1, "Trace this step (FULL_TRACE); -1: none.")
_TIME_HOOKS = flags.DEFINE_bool("time_hooks", False, "Time every hook's before_run/after_run.")
_OUTPUT_DIR = flags.DEFINE_string("output_dir", None, "Where each task writes its timings.")
_SAVE_STEPS = flags.DEFINE_integer("save_steps", 0, "The chief saves a checkpoint into "
                                   "--model_dir every this many steps (0: never): stock with a "
                                   "CheckpointSaverHook, ours with a mid-epoch save.")
_MODEL_DIR = flags.DEFINE_string("model_dir", None, "Where --save_steps saves go.")
_UNIT_BATCHES = flags.DEFINE_integer("unit_batches", 15, "ours-units: batches per work unit.",
                                     lower_bound=1)

_v1 = tf.compat.v1


def _rows(worker_id: int):
  """The examples of `worker_id`'s shard: (features, labels) arrays of --steps batches."""
  rng = np.random.default_rng(worker_id)
  n = _STEPS.value * _BATCH.value
  if _MODEL.value == "ctr":
    ids = rng.zipf(1.2, size=(n, _SLOTS.value)) % _VOCAB.value  # Skewed, as CTR ids are.
    return ids.astype(np.int64), rng.integers(0, 2, size=(n, 1)).astype(np.float32)
  x = rng.normal(size=(n, MLP_SIZES[_PARAMS.value][0])).astype(np.float32)
  return x, x


def _dataset(worker_id: int) -> tf.data.Dataset:
  return tf.data.Dataset.from_tensor_slices(_rows(worker_id)).batch(_BATCH.value)


def _work_queue_input(config, settings):
  """ours-units: every worker's rows, concatenated, in units of --unit_batches batches."""
  shards = [_rows(w) for w in range(config.num_workers)]
  rows = tuple(tf.constant(np.concatenate(parts)) for parts in zip(*shards))
  size = _UNIT_BATCHES.value * _BATCH.value
  total = int(rows[1].shape[0])
  units = [WorkUnit("", start, min(start + size, total)) for start in range(0, total, size)]

  def unit_fn(unit):  # the unit's rows sliced out (O(unit), not a skip over the rows before)
    sliced = tuple(part[unit.start:unit.start + unit.count] for part in rows)
    return tf.data.Dataset.from_tensor_slices(sliced).batch(_BATCH.value)
  return work_queue_input(units, unit_fn, 1, config.num_workers, config.worker_id,
                          config.task_name, settings=settings)


def _loss(x, y, num_ps: int):
  if _MODEL.value == "ctr":
    emb = _v1.get_variable("emb", [_VOCAB.value, _EMB_DIM.value],
                           initializer=_v1.random_normal_initializer(stddev=0.01),
                           partitioner=_v1.fixed_size_partitioner(num_ps))
    rows = tf.nn.embedding_lookup(emb, x)  # [batch, slots, dim]: sparse gradients
    h = tf.reshape(rows, [-1, _SLOTS.value * _EMB_DIM.value])
    h = _v1.layers.dense(h, 256, activation=tf.nn.relu, name="tower1")
    h = _v1.layers.dense(h, 64, activation=tf.nn.relu, name="tower2")
    logits = _v1.layers.dense(h, 1, name="logit")
    return tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=y, logits=logits))
  width, hidden = MLP_SIZES[_PARAMS.value]
  h = _v1.layers.dense(x, hidden, activation=tf.nn.relu, name="hidden")
  out = _v1.layers.dense(h, width, name="out")
  return tf.reduce_mean(tf.square(out - y))


def _trace_summary(run_metadata) -> dict:
  """Per device: the traced step's ops as (name, start_us, duration_us), by start time."""
  devices = {}
  for dev in run_metadata.step_stats.dev_stats:
    nodes = sorted(dev.node_stats, key=lambda n: n.all_start_micros)
    if not nodes:
      continue
    t0 = nodes[0].all_start_micros
    devices[dev.device] = [(n.node_name, n.all_start_micros - t0, n.all_end_rel_micros)
                           for n in nodes]
  return devices


class _TimedSession:
  """Wraps the session a hook gets: times its runs (and callables) by fetch; traces run #k."""

  def __init__(self, session, totals, trace_call: int, traces):
    self._session, self._totals = session, totals
    self._trace_call, self._traces = trace_call, traces

  def __getattr__(self, name):
    return getattr(self._session, name)

  def _timed(self, key, run, kwargs):
    calls = self._totals[key]
    metadata = None
    if len(calls) == self._trace_call and "options" not in kwargs:
      metadata = _v1.RunMetadata()
      kwargs = dict(kwargs, options=_v1.RunOptions(trace_level=_v1.RunOptions.FULL_TRACE),
                    run_metadata=metadata)
    start = time.perf_counter()
    try:
      return run(**kwargs)
    finally:
      calls.append(time.perf_counter() - start)
      if metadata is not None:
        self._traces[key] = _trace_summary(metadata)

  def run(self, fetches, feed_dict=None, options=None, run_metadata=None):
    key = "run " + ",".join(getattr(f, "name", str(f)) for f in tf.nest.flatten(fetches))[:80]
    kwargs = dict(feed_dict=feed_dict)
    if options is not None:
      kwargs.update(options=options, run_metadata=run_metadata)
    return self._timed(key, lambda **kw: self._session.run(fetches, **kw), kwargs)

  def make_callable(self, fetches, feed_list=None, accept_options=False):
    key = "callable " + ",".join(getattr(f, "name", str(f))
                                 for f in tf.nest.flatten(fetches))[:80]
    call = self._session.make_callable(fetches, feed_list, accept_options=True)
    return lambda *args, **kwargs: self._timed(key, lambda **kw: call(*args, **kw), kwargs)


class _TimedHook(_v1.train.SessionRunHook):
  """Delegates to `hook`, adds up the wall time of its before_run and after_run and of the
  session runs it (and its threads) make."""

  def __init__(self, hook, totals, trace_call: int = -1, traces=None):
    self._hook, self._totals = hook, totals
    self._trace_call, self._traces = trace_call, traces
    self._name = type(hook).__name__

  def begin(self):
    self._hook.begin()

  def after_create_session(self, session, coord):
    self._hook.after_create_session(
        _TimedSession(session, self._totals, self._trace_call, self._traces), coord)

  def before_run(self, run_context):
    start = time.perf_counter()
    try:
      return self._hook.before_run(run_context)
    finally:
      self._totals[self._name + ".before_run"].append(time.perf_counter() - start)

  def after_run(self, run_context, run_values):
    start = time.perf_counter()
    try:
      self._hook.after_run(run_context, run_values)
    finally:
      self._totals[self._name + ".after_run"].append(time.perf_counter() - start)

  def end(self, session):
    self._hook.end(session)


def _start_together(sess, started, num_workers: int, timeout_secs: float = 120.0) -> None:
  """Counts this task in and polls (every 10 ms, bounded) until every worker counted in."""
  count_in, read = started
  sess.run(count_in)
  deadline = time.monotonic() + timeout_secs
  while sess.run(read) < num_workers:
    if time.monotonic() > deadline:
      raise TimeoutError(f"not every worker started within {timeout_secs} s")
    time.sleep(0.01)


def main(argv):
  del argv
  config, settings, server = task_common.start_task()
  variant, n = _VARIANT.value, config.num_workers
  epoch_hooks = variant in ("ours", "ours-units", "async-hooks")
  sync = variant in ("stock", "ours", "ours-units", "ours-bare")
  sgd = _v1.train.GradientDescentOptimizer(0.01)
  with _v1.device(_v1.train.replica_device_setter(
      worker_device=config.job_device, cluster=config.cluster_spec())):
    global_step = _v1.train.get_or_create_global_step()
    if variant == "ours-units":
      epoch_input = _work_queue_input(config, settings)
      x, y = epoch_input.get_next()
    elif epoch_hooks:
      epoch_input = EpochInput(_dataset(config.worker_id), 1, config.task_name)
      x, y = epoch_input.get_next()
    else:
      x, y = _v1.data.make_one_shot_iterator(_dataset(config.worker_id)).get_next()
    if variant == "stock":
      opt = _v1.train.SyncReplicasOptimizer(sgd, replicas_to_aggregate=n, total_num_replicas=n)
    elif sync:
      opt = WorkerDoneSyncReplicasOptimizer(sgd, n, config.worker_id,
                                            worker_names=config.worker_names)
    else:
      opt = sgd
    train_op = opt.minimize(_loss(x, y, config.num_ps), global_step=global_step)
    if not sync:  # Asynchronous: fetch the step this update produced, as the sync train_ops do.
      with tf.control_dependencies([train_op]):
        train_op = tf.identity(global_step)
  sync_hook = opt.make_session_run_hook(config.is_chief, num_tokens=0) if sync else None
  saves = dict(save_checkpoint_secs=0, save_checkpoint_steps=_SAVE_STEPS.value)
  if epoch_hooks:
    hooks = epoch_sync_hooks(config, epoch_input, dataclasses.replace(settings, **saves),
                             sync_hook=sync_hook, model_dir=_MODEL_DIR.value)
  else:
    hooks = [sync_hook] if sync_hook else []
    if _SAVE_STEPS.value and config.is_chief:
      hooks.append(_v1.train.CheckpointSaverHook(_MODEL_DIR.value, save_steps=_SAVE_STEPS.value))
  hook_secs, hook_traces = collections.defaultdict(list), {}
  if _TIME_HOOKS.value:
    hooks = [_TimedHook(h, hook_secs, _TRACE_STEP.value, hook_traces) for h in hooks]
  if not epoch_hooks:  # Start together, as the epoch hooks' start barrier makes the others.
    with _v1.device("/job:ps/task:0"):
      started = _v1.get_variable("bench_started", [], tf.int64, _v1.zeros_initializer(),
                                 trainable=False)
      started = (started.assign_add(1), started.read_value())
  creator = session_lib.session_creator(config, master=server.target)
  times, tokens, cpu = [], [], None
  trace = None
  sess = _v1.train.MonitoredSession(session_creator=creator, hooks=hooks)
  if not epoch_hooks:
    _start_together(sess, started, n)
  # ours-units: a worker trains until the queue has no unit left for it (the hooks stop it).
  steps = itertools.count() if variant == "ours-units" else range(_STEPS.value)
  for step in steps:
    if variant == "ours-units" and sess.should_stop():
      break
    if step == _WARMUP.value:
      cpu, wall, window_start = time.process_time(), time.perf_counter(), time.time()
    kwargs = {}
    if step == _TRACE_STEP.value:
      kwargs = dict(options=_v1.RunOptions(trace_level=_v1.RunOptions.FULL_TRACE),
                    run_metadata=_v1.RunMetadata())
    start = time.perf_counter()
    tokens.append(int(sess.run(train_op, **kwargs)))  # the step's token (sync) or global step
    times.append(time.perf_counter() - start)
    if kwargs:
      trace = _trace_summary(kwargs["run_metadata"])
  cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
  window = (window_start, time.time())  # The measured steps, on the clock bench's sampler uses.
  params = sum(int(np.prod(v.shape)) for v in _v1.trainable_variables())
  path = os.path.join(_OUTPUT_DIR.value, config.task_name.replace(":", "-") + ".json")
  measured = len(times) - _WARMUP.value
  with open(path, "w") as f:
    json.dump({"task": config.task_name, "variant": variant, "model": _MODEL.value,
               "params": params, "tokens": tokens, "step_secs": times,
               "cpu_secs_per_step": cpu / measured, "wall_secs_per_step": wall / measured,
               "window": window, "measured_steps": measured,
               "hook_secs": {k: v[_WARMUP.value:-1] for k, v in hook_secs.items()},
               "hook_calls": {k: len(v) for k, v in hook_secs.items()},
               "trace": trace, "hook_traces": hook_traces}, f)
  # Stock's chief queue runner stays blocked in take_grad after the last step, and its
  # MonitoredSession.close() would wait stop_grace_period_secs; the timings are written,
  # so every variant leaves the same way.
  os._exit(0)


if __name__ == "__main__":
  app.run(main)
