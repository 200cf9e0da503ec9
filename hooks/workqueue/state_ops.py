"""The work queue's shared pieces: its answers' codes and the helpers its runs are built from.

Every run on the queue's state (hooks.workqueue.queue_graph's claim, hooks.workqueue.
elastic_graph's gate, reclaim and join) executes inside the same `tf.CriticalSection` and writes
the whole state with one assign, built from these helpers.

Typical usage:
  result = execute_unrecorded(lock, lambda: ...)      # a run inside the queue's lock
  owner = put(parts["owner"], unit, worker, take)      # a field with one entry changed
"""

import tensorflow as tf

__all__ = ["STALE", "WAIT", "FENCED", "LOST_WRITE", "FENCE_MARK", "ANY", "NONE",
           "execute_unrecorded", "fills", "put"]

_v1 = tf.compat.v1
STALE = -2  # a claim's answer: the queue is already in a later epoch than the claim's
WAIT = -3  # (elastic) none left to hand out, but a unit in flight may come back: claim again
FENCED = -4  # (elastic) the chief found this worker lost and took its unit back
LOST_WRITE = -5  # the queue holds fewer claims of the worker than it was answered: a lost write
FENCE_MARK = -2  # claims[w] <= FENCE_MARK: worker w is fenced (a fresh epoch keeps the mark)
ANY, NONE = -1, -2  # a claim's `wanted`: the next unit of the order, or none (a replay's end)


def execute_unrecorded(lock: tf.CriticalSection, fn):
  """lock.execute(fn), minus the graph collection entry it leaves (the lock runs only this
  fn; the entry cannot be serialized: every meta-graph export would warn about it)."""
  graph = _v1.get_default_graph()
  key = "critical_section_executions"
  before = list(graph.get_collection(key))
  result = lock.execute(fn)
  entries = graph.get_collection_ref(key)
  entries[:] = [e for e in entries if any(e is b for b in before)]
  return result


def fills(value: int, n: int) -> tf.Tensor:
  return tf.fill([n], tf.constant(value, tf.int64))


def put(vector, index, value, when):
  """`vector` with [index] = value where `when` (index clipped at 0 otherwise)."""
  index = tf.maximum(index, 0)
  return tf.where(when, tf.tensor_scatter_nd_update(
      vector, tf.reshape(index, [1, 1]), tf.reshape(value, [1])), vector)
