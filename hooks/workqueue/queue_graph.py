"""The work queue's state on ps:0 and its one run, the claim: saved with the model, exactly once.

The state is one int64 vector on ps:0 (in every checkpoint): the epoch it belongs to, the
epoch's order of the units (a permutation drawn from the seed and the epoch, or the units'
order), the next position to hand out, and per unit its owner, the owner's batch count when it
took the unit, and its batches and examples once the owner finished it; per worker, how many
claims it made this epoch and the unit of its last one.

A claim is one run on ps:0 alone (its feeds travel in the request, its result in the answer:
no partition on the worker), inside a `tf.CriticalSection`, so claims never interleave:
  - the first claim of a new epoch starts the epoch's queue (order, next 0, no owners);
  - the claim records the unit the worker finished (batches, examples), then hands out the next
    unit of the order (-1: none left), as the worker's claim number `seq`;
  - a claim whose `seq` was already answered (its answer was lost: a deadline, a rejected
    request) answers the same unit again and changes nothing.
A claim computes the whole new state from the old and writes it with one assign, so a claim
cancelled by its deadline (TensorFlow stops a cancelled run between two ops) changed all of it
or nothing, and its retry learns which: no unit is lost or handed out twice.

Typical usage (hooks.workqueue.claims runs it):
  ops = build(num_units=64, num_workers=4, seed=7, shuffle=True, ps_device="/job:ps/task:0")
  unit = session.run(ops.claim, {ops.epoch: 0, ops.worker: 1, ops.seq: 0, ops.at_batch: 0,
                                 ops.finished: -1, ops.finished_batches: 0,
                                 ops.finished_examples: 0})
"""

import dataclasses
import functools
from typing import Dict

import tensorflow as tf

from hooks import graph_keys

__all__ = ["QueueOps", "build", "STALE"]

_v1 = tf.compat.v1
STALE = -2  # a claim's answer: the queue is already in a later epoch than the claim's


@dataclasses.dataclass(frozen=True)
class QueueOps:
  """The claim's placeholders and result, and the chief's read of the whole state."""
  epoch: tf.Tensor
  worker: tf.Tensor
  seq: tf.Tensor
  at_batch: tf.Tensor
  finished: tf.Tensor
  finished_batches: tf.Tensor
  finished_examples: tf.Tensor
  claim: tf.Tensor           # int64: the unit handed out, -1 none left, STALE
  state: Dict[str, tf.Tensor]  # epoch, order, next, owner, first_batch, batches, examples


def _execute_unrecorded(lock: tf.CriticalSection, fn):
  """lock.execute(fn), minus the graph collection entry it leaves (the lock runs only this
  fn; the entry cannot be serialized: every meta-graph export would warn about it)."""
  graph = _v1.get_default_graph()
  key = "critical_section_executions"
  before = list(graph.get_collection(key))
  result = lock.execute(fn)
  entries = graph.get_collection_ref(key)
  entries[:] = [e for e in entries if any(e is b for b in before)]
  return result


_FIELDS = ("order", "owner", "first_batch", "batches", "examples")  # one int64 per unit each


def build(num_units: int, num_workers: int, seed: int, shuffle: bool,
          ps_device: str) -> QueueOps:
  """The queue's variable on `ps_device` and its claim, for `num_units` units."""
  u, w = num_units, num_workers
  with _v1.device(ps_device), tf.name_scope("epochsync_workqueue"):
    # One vector: [epoch, next, order[u], owner[u], first_batch[u], batches[u], examples[u],
    # claims[w], last[w]]. A claim writes it with one assign: a claim cancelled half-way (its
    # deadline) changed all of it or nothing.
    state = _v1.get_variable(
        "epochsync/workqueue/state", [2 + 5 * u + 2 * w], tf.int64,
        _v1.constant_initializer(-1), trainable=False, use_resource=True)
    _v1.add_to_collection(graph_keys.STATE_VARIABLES, state)
    feeds = {name: _v1.placeholder(tf.int64, [], name) for name in (
        "epoch", "worker", "seq", "at_batch", "finished", "finished_batches",
        "finished_examples")}
    lock = tf.CriticalSection(name="lock", shared_name="epochsync_workqueue_lock")
    order_of = functools.partial(_order, u, seed, shuffle)
    result = _execute_unrecorded(lock, lambda: _claim(state, feeds, u, w, order_of))
    now = state.read_value()
    parts = dict(zip(_FIELDS, tf.split(now[2:2 + 5 * u], 5)))
    read = {"epoch": now[0], "next": now[1], **parts}
  return QueueOps(claim=result, state=read, **feeds)


def _order(u: int, seed: int, shuffle: bool, epoch: tf.Tensor) -> tf.Tensor:
  """The epoch's order of the units: a permutation drawn from (seed, epoch), or 0..u-1."""
  if not shuffle:
    return tf.range(u, dtype=tf.int64)
  keys = tf.random.stateless_uniform([u], tf.stack([tf.constant(seed, tf.int64), epoch]),
                                     dtype=tf.float64)
  return tf.cast(tf.argsort(keys, stable=True), tf.int64)


def _fills(value: int, n: int) -> tf.Tensor:
  return tf.fill([n], tf.constant(value, tf.int64))


def _put(vector, index, value, when):
  """`vector` with [index] = value where `when` (index clipped at 0 otherwise)."""
  index = tf.maximum(index, 0)
  return tf.where(when, tf.tensor_scatter_nd_update(
      vector, tf.reshape(index, [1, 1]), tf.reshape(value, [1])), vector)


def _claim(state, feeds, u: int, w: int, order_of) -> tf.Tensor:
  """The claim's graph (inside the lock): the new state from the old, one assign, the answer."""
  old = state.read_value()
  epoch = feeds["epoch"]
  fresh = old[0] < epoch  # the epoch's first claim starts its queue
  started = tf.concat([tf.stack([epoch, tf.constant(0, tf.int64)]), order_of(epoch),
                       _fills(-1, u), _fills(0, u), _fills(-1, u), _fills(-1, u), _fills(0, w),
                       _fills(-1, w)], 0)
  now = tf.where(fresh, started, old)
  parts = dict(zip(_FIELDS, tf.split(now[2:2 + 5 * u], 5)))
  claims, last = now[2 + 5 * u:2 + 5 * u + w], now[2 + 5 * u + w:]
  worker, position = feeds["worker"], now[1]
  stale = now[0] > epoch
  new = tf.logical_and(tf.equal(claims[worker], feeds["seq"]), tf.logical_not(stale))
  finished = tf.logical_and(new, feeds["finished"] >= 0)
  has_unit = position < u
  unit = tf.where(has_unit, tf.gather(parts["order"], tf.minimum(position, u - 1)),
                  tf.constant(-1, tf.int64))
  take = tf.logical_and(new, has_unit)
  written = tf.concat([
      tf.stack([now[0], tf.where(take, position + 1, position)]), parts["order"],
      _put(parts["owner"], unit, worker, take),
      _put(parts["first_batch"], unit, feeds["at_batch"], take),
      _put(parts["batches"], feeds["finished"], feeds["finished_batches"], finished),
      _put(parts["examples"], feeds["finished"], feeds["finished_examples"], finished),
      _put(claims, worker, feeds["seq"] + 1, new), _put(last, worker, unit, new)], 0)
  answer = tf.where(stale, tf.constant(STALE, tf.int64), tf.where(new, unit, last[worker]))
  with tf.control_dependencies([state.assign(written)]):
    return tf.identity(answer)
