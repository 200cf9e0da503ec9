"""The gradient queues of an elastic synchronous step (hooks.sync.elastic_steps).

A `ConditionalAccumulator` cannot drop one worker's gradient once it is in, and a worker that
dies while it sends its gradient (one send per variable) would leave part of it in some. So an
elastic step sends each variable's gradient into a queue on the variable's ps instead, tagged
with its worker and step, and the chief's aggregation takes from each queue what the step's
GRAD senders sent for this step; the rest (a dying worker's part, a woken worker's late
gradient) is dropped. A dense gradient is one element; a sparse one (an embedding's
IndexedSlices) is its ids and rows, padded to the longest of the dequeued ones and masked.

Typical usage (WorkerDoneSyncReplicasOptimizer.apply_gradients, with an elastic queue):
  enqueues, queues = gradient_queues.build(grads_and_vars, name, local_step, worker_id)
  taken = gradient_queues.mean(queues, grads_of_worker, step_now, g_on, divisor)
  reset = gradient_queues.drain(queues)
"""

import dataclasses
from typing import Any, List, Tuple

import tensorflow as tf

__all__ = ["GradientQueue", "build", "mean", "drain"]

_v1 = tf.compat.v1


@dataclasses.dataclass(frozen=True)
class GradientQueue:
  """One variable's queue: (worker, step, gradient) or, sparse, (worker, step, rows, ids,
  values)."""
  queue: Any
  var: tf.Variable
  sparse: bool
  dense_shape: Any = None  # (sparse) the gradient's dense shape


def build(grads_and_vars, name: str, local: tf.Variable, wid: int
          ) -> Tuple[List[Any], List[GradientQueue]]:
  """(the enqueue of each gradient, its GradientQueue), for worker `wid`'s step."""
  enqueues, queues = [], []
  # A copy: a ref variable's own buffer (the local step's, with the queue on the same device:
  # one process) would go into the queue, and the next step's assign would change it there.
  step = tf.raw_ops.DeepCopy(x=tf.cast(local, tf.int64))
  for grad, var in grads_and_vars:
    if grad is None:
      continue
    shared = f"{var.name}/{name}/grad_queue"
    with tf.device(var.device):
      if isinstance(grad, tf.IndexedSlices):
        row = var.shape[1:]
        queue = _v1.PaddingFIFOQueue(-1, [tf.int32, tf.int64, tf.int32, grad.indices.dtype,
                                          grad.dtype],
                                     shapes=[(), (), (), (None,), (None,) + tuple(row)],
                                     shared_name=shared, name="grad_queue")
        rows = tf.shape(grad.indices, out_type=tf.int32)[0]
        enqueues.append(queue.enqueue((tf.constant(wid), step, rows, grad.indices,
                                       grad.values)))
        queues.append(GradientQueue(queue, var, True, grad.dense_shape))
      else:
        queue = tf.queue.FIFOQueue(-1, [tf.int32, tf.int64, grad.dtype],
                                   shapes=[(), (), var.shape], shared_name=shared,
                                   name="grad_queue")
        enqueues.append(queue.enqueue((tf.constant(wid), step, grad)))
        queues.append(GradientQueue(queue, var, False))
  return enqueues, queues


def mean(queues: List[GradientQueue], senders: tf.Tensor, step_now: tf.Tensor,
         g_on: tf.Tensor, divisor: tf.Tensor) -> List[Tuple[Any, tf.Variable]]:
  """[(the mean of the step's gradients, variable)]: of each queue, what it holds from the
  step's GRAD senders (`senders`, per worker) at `step_now`; the rest is dropped. Dead with
  `g_on` (no gradient this step). A sparse mean keeps every sender's rows (repeated ids are
  summed by the optimizer's apply, as a SUM accumulator's merge keeps them)."""
  taken = []
  for q in queues:
    with tf.device(q.var.device):
      with tf.control_dependencies([g_on]):
        size = q.queue.size()
      if q.sparse:
        wids, steps, rows, ids, values = q.queue.dequeue_many(size)
      else:
        wids, steps, grads = q.queue.dequeue_many(size)
      keep = tf.logical_and(tf.gather(senders, wids) > 0, tf.equal(steps, step_now))
      if q.sparse:
        padded = tf.shape(ids, out_type=tf.int32)[1]
        kept = tf.logical_and(keep[:, None], tf.sequence_mask(rows, padded))
        scale = tf.cast(divisor, values.dtype)
        taken.append((tf.IndexedSlices(tf.boolean_mask(values, kept) / scale,
                                       tf.boolean_mask(ids, kept), q.dense_shape), q.var))
      else:
        total = tf.reduce_sum(tf.boolean_mask(grads, keep), axis=0)
        taken.append((total / tf.cast(divisor, grads.dtype), q.var))
  return taken


def drain(queues: List[GradientQueue]) -> List[Any]:
  """The ops that empty the gradient queues (the chief's reset at a run's start)."""
  return [q.queue.dequeue_many(q.queue.size()) for q in queues]
