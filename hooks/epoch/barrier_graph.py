"""The graph of the epoch barrier on ps:0: its state, queues, and the runs of each side.

hooks.epoch.barrier's EpochBarrierHook builds it in begin() and runs it at session time: a worker's
`arrive_and_wait`, the chief's `gather` (then its actions, then `release`) or, without chief
actions, `gather_and_release` in one run. See hooks/epoch/barrier.py for the protocol.

Typical usage (EpochBarrierHook.begin()):
  ops = build(num_workers, worker_id, num_epochs, "/job:ps/task:0")
"""

import dataclasses
from typing import Any, Tuple

import tensorflow as tf

from hooks import graph_keys

__all__ = ["BarrierOps", "build", "REFUSED"]

_v1 = tf.compat.v1
REFUSED = -2  # a release carrying this value: the chief refused the tasks' settings
# (worker id, barrier #, batches, examples, started_at, ended_at, num_workers, num_epochs)
# of one arrival; the last two let the chief refuse workers started with other settings.
_ARRIVAL_DTYPES = [tf.int32, tf.int64, tf.int64, tf.int64, tf.float64, tf.float64, tf.int64,
                   tf.int64]


@dataclasses.dataclass(frozen=True)
class BarrierOps:
  """What the barrier's runs fetch and feed (placeholders: seq ... release_value)."""
  completed: tf.Variable   # epochsync/completed_epochs
  arrived: tf.Variable     # epochsync/arrived_barrier: per worker, the last barrier # it reached
  seq: tf.Tensor
  stats: tf.Tensor         # [batches, examples]
  times: tf.Tensor         # [started_at, ended_at]
  new_completed: tf.Tensor
  zero: tf.Tensor
  release_value: tf.Tensor
  mark_arrived: Any
  arrive_and_wait: tf.Tensor  # A worker: arrive, then the release value.
  next_release: tf.Tensor  # A worker: its next release value (past a stale one, elastic).
  gather: Tuple            # The chief: (arrivals, stored completed epochs).
  release: Tuple           # The chief: (release, global_step at the release).
  gather_and_release: Tuple  # The chief, without actions: both in one run on the ps.
  stand_in_worker: tf.Tensor  # (elastic) a lost worker's id ...
  stand_in_batches: tf.Tensor  # ... and its batches in the model
  stand_in: tf.Tensor      # The chief: arrive for that worker at `seq` unless it did (elastic).


def build(n: int, worker_id: int, num_epochs: int, ps_device: str) -> BarrierOps:
  """The barrier's variables, queues and runs for worker `worker_id` of `n`."""
  with _v1.device(ps_device), tf.name_scope("epochsync_barrier"):
    completed = _v1.get_variable(
        "epochsync/completed_epochs", [], tf.int64, _v1.zeros_initializer(),
        trainable=False, use_resource=False)
    arrived = _v1.get_variable(
        "epochsync/arrived_barrier", [n], tf.int64, _v1.constant_initializer(-1),
        trainable=False, use_resource=False)
    for var in (completed, arrived):
      _v1.add_to_collection(graph_keys.STATE_VARIABLES, var)
    # Unbounded (capacity -1): an enqueue never blocks, so only the dequeues below wait.
    arrive_q = _v1.FIFOQueue(-1, _ARRIVAL_DTYPES, shapes=[[]] * len(_ARRIVAL_DTYPES),
                             shared_name="epochsync_barrier_arrivals", name="arrive_q")
    release_qs = [_v1.FIFOQueue(-1, [tf.int64], shapes=[[]],
                                shared_name=f"epochsync_barrier_releases_{i}",
                                name=f"release_q_{i}") for i in range(n)]
    seq = _v1.placeholder(tf.int64, [], "seq")
    stats = _v1.placeholder(tf.int64, [2], "batches_examples")
    times = _v1.placeholder(tf.float64, [2], "started_ended_at")
    mark_arrived = _v1.scatter_update(arrived, [worker_id], [seq])
    # A worker: one run enqueues its arrival, marks it and then waits for its release.
    arrive = tf.group(
        arrive_q.enqueue([tf.constant(worker_id), seq, stats[0],
                          stats[1], times[0], times[1],
                          tf.constant(n, tf.int64),
                          tf.constant(num_epochs, tf.int64)]),
        mark_arrived)
    with tf.control_dependencies([arrive]):  # The enqueue never blocks; then the dequeue.
      arrive_and_wait = tf.identity(release_qs[worker_id].dequeue())
    # A rejoined worker's queue still holds the releases of the barriers the chief arrived at
    # for it (elastic): its first own arrival takes those first.
    next_release = release_qs[worker_id].dequeue(name="next_release")
    # The chief: one run marks it arrived, takes the n-1 arrivals and then (at an epoch's
    # end) stores the completed epoch, so that the chief actions' checkpoint holds it.
    new_completed = _v1.placeholder(tf.int64, [], "completed")
    arrivals = arrive_q.dequeue_many(n - 1) if n > 1 else []
    with tf.control_dependencies(tf.nest.flatten(arrivals) + [mark_arrived]):
      stored = completed.assign(tf.maximum(completed, new_completed))
    fetched = _packed(arrivals) if n > 1 else []  # 2 tensors to fetch instead of 8
    gather = (fetched, stored)
    # The chief's release reads global_step (for the audit) while everyone is still held.
    zero = _v1.placeholder(tf.int64, [], "zero")
    step = _step_now(zero, "global_step_at_release")
    release_value = _v1.placeholder(tf.int64, [], "release")
    with tf.control_dependencies([step]):
      release = tf.group(*[q.enqueue([release_value]) for q in release_qs[1:]])
    release = (release, step)
    # Without chief actions the chief releases in the gather's own run, on the ps the moment
    # the last arrival is in (no round trip through the chief): every arrival's seq, worker
    # count and num_epochs match and the ids are exactly 1..n-1, or everyone is refused.
    value = _release_value(arrivals, seq, n, num_epochs) if n > 1 else seq
    with tf.control_dependencies([stored]):
      gathered_step = _step_now(zero, "global_step_at_gather")  # after the arrivals, a copy
    with tf.control_dependencies([gathered_step]):
      released = tf.group(*[q.enqueue([value]) for q in release_qs[1:]])
    gather_and_release = (fetched, stored, released, gathered_step)
    _v1.add_to_collection(graph_keys.RESET_OPS, _reset_op(arrive_q, release_qs, arrived, n))
    stand_in_worker = _v1.placeholder(tf.int32, [], "stand_in_worker")
    stand_in_batches = _v1.placeholder(tf.int64, [], "stand_in_batches")
    stand_in = _stand_in(arrive_q, arrived, stand_in_worker, stand_in_batches, seq, n,
                         num_epochs)
  return BarrierOps(completed, arrived, seq, stats, times, new_completed, zero, release_value,
                    mark_arrived, arrive_and_wait, next_release, gather, release, gather_and_release,
                    stand_in_worker, stand_in_batches, stand_in)


def _stand_in(arrive_q, arrived, worker: tf.Tensor, batches: tf.Tensor, seq: tf.Tensor, n: int,
              num_epochs: int) -> tf.Tensor:
  """Enqueues lost `worker`'s arrival at barrier `seq` (its `batches`, examples -1: unknown)
  unless it arrived there itself, and marks it arrived; whether it enqueued. Only the chief runs
  it, one at a time: the read and the enqueue are not one atomic op, and a lost worker's own
  arrival cannot come any more (it died)."""
  missing = tf.gather(arrived, worker) < seq
  rows = tf.cast(missing, tf.int32)
  fill = lambda value, dtype: tf.fill([rows], tf.cast(value, dtype))
  enqueue = arrive_q.enqueue_many([
      fill(worker, tf.int32), fill(seq, tf.int64), fill(batches, tf.int64), fill(-1, tf.int64),
      fill(0.0, tf.float64), fill(0.0, tf.float64), fill(n, tf.int64), fill(num_epochs, tf.int64)])
  with tf.control_dependencies([enqueue]):
    mark = _v1.scatter_update(arrived, [worker], [tf.maximum(tf.gather(arrived, worker), seq)])
  with tf.control_dependencies([mark]):
    return tf.identity(missing)


def _step_now(zero: tf.Tensor, name: str) -> tf.Tensor:
  """global_step as an int64 copy read when this op runs (within its dependencies), -1 if the
  graph has none. A copy, not tf.identity: an Identity of a ref variable aliases its buffer, so
  the fetched value would be serialized later, with the steps taken since in it. And `+ 0`
  with a fed zero: grappler turns `x + 0` with a constant zero back into an Identity when the
  run's graph has no assign op."""
  global_step = _v1.train.get_global_step()
  if global_step is None:
    return tf.constant(-1, tf.int64, name=name)
  return tf.add(tf.cast(global_step, tf.int64), zero, name=name)


def _release_value(arrivals, seq: tf.Tensor, n: int, num_epochs: int) -> tf.Tensor:
  """`seq` when every arrival's seq, worker count and num_epochs match and the ids are exactly
  1..n-1, else REFUSED (everyone is refused)."""
  ids, seqs, *_, counts, epochs = arrivals
  agree = tf.reduce_all([
      tf.reduce_all(tf.equal(seqs, seq)),
      tf.reduce_all(tf.equal(counts, n)),
      tf.reduce_all(tf.equal(epochs, num_epochs)),
      tf.reduce_all(tf.equal(tf.sort(ids), tf.range(1, n, dtype=ids.dtype)))])
  return tf.where(agree, seq, tf.constant(REFUSED, tf.int64))


def _reset_op(arrive_q, release_qs, arrived: tf.Variable, n: int) -> tf.Operation:
  """Drains what an earlier run on this ps left behind (e.g. an abort release) at start."""
  drains = [q.dequeue_many(q.size()) for q in [arrive_q] + release_qs]
  return tf.group(*tf.nest.flatten(drains),
                  arrived.assign(tf.fill([n], tf.constant(-1, tf.int64))), name="reset")


def _packed(arrivals) -> Tuple[tf.Tensor, tf.Tensor]:
  """The dequeued arrival fields as one [n-1, 6] int64 and one [n-1, 2] float64 tensor.

  Columns: worker id, seq, batches, examples, worker count, num_epochs; started, ended.
  Built on the ps, so the chief's gather fetches two tensors (each fetch is a transfer).
  """
  ids, seqs, batches, examples, started, ended, counts, epochs = arrivals
  ints = tf.stack([tf.cast(ids, tf.int64), seqs, batches, examples, counts, epochs], axis=1)
  return ints, tf.stack([started, ended], axis=1)
