"""The chief's aggregation run of an elastic synchronous job (hooks.sync.elastic_steps).

As hooks.sync.aggregation_graph's aggregate_op, with three differences: the gradients come from
the gradient queues, of the step's GRAD senders only; IDLE markers keep their senders in the
steps without a gradient (a round of them alone applies nothing and returns IDLE_ROUND); and
before the tokens go out, each token receiver owes its next marker, which the lock sends for a
fenced one, and a guest (a relaunched worker) joins the steps (ElasticSteps.after_tokens).

Typical usage (WorkerDoneSyncReplicasOptimizer.apply_gradients, with an elastic queue):
  aggregate = elastic_aggregate_op(opt, steps, num_workers, divide_by_initial, state, queues,
                                   step, extra_step, begun)
"""

from typing import Any, List, Optional, Tuple

import tensorflow as tf

from hooks.sync import gradient_queues
from hooks.sync.aggregation_graph import GRAD, STOP, apply_step, take_markers
from hooks.sync.elastic_steps import IDLE, IDLE_ROUND, ElasticSteps

__all__ = ["elastic_aggregate_op"]

_v1 = tf.compat.v1


def elastic_aggregate_op(opt: _v1.train.Optimizer, steps: ElasticSteps, num_workers: int,
                         divide_by_initial: bool, state: Any,
                         queues: List[gradient_queues.GradientQueue], step: tf.Variable,
                         extra_step: Optional[tf.Variable] = None,
                         begun: Optional[tf.Variable] = None) -> tf.Tensor:
  """One run: one step's markers, the mean of its senders' gradients, the tokens.

  Returns g > 0 (a step applied), 0 (the epoch is over: every active worker sent DONE),
  IDLE_ROUND (IDLE markers only: nothing applied, tokens of the same step), or < IDLE_ROUND (a
  STOP marker: nothing changed). `state`: the optimizer's PsState.
  """
  num_active = state.num_active
  ids, kinds, marked = take_markers([q.var.device for q in queues], step, begun, state.markers,
                                    num_active)
  with tf.device(step.device):
    axis = tf.constant(0)
    grads_of = tf.math.unsorted_segment_sum(tf.cast(tf.equal(kinds, GRAD), tf.int32), ids,
                                            num_workers)
    idle_of = tf.math.unsorted_segment_sum(tf.cast(tf.equal(kinds, IDLE), tf.int32), ids,
                                           num_workers)
    stopped = tf.reduce_any(tf.equal(kinds, STOP))
    g = tf.raw_ops.Sum(input=grads_of, axis=axis)
    idles = tf.raw_ops.Sum(input=idle_of, axis=axis)
    result = tf.where(stopped, tf.constant(STOP, tf.int32),
                      tf.where(tf.logical_and(tf.equal(g, 0), idles > 0),
                               tf.constant(IDLE_ROUND, tf.int32), g))
    has_grads = tf.logical_and(g > 0, tf.logical_not(stopped))
    g_off, g_on = tf.raw_ops.Switch(data=g, pred=has_grads)
    step_now = tf.cast(step, tf.int64)
    check = tf.raw_ops.Assert(
        condition=tf.logical_or(stopped, tf.reduce_all(tf.equal(marked, step_now), axis)),
        data=["WorkerDoneSyncReplicasOptimizer (elastic): a marker of another step. The step's "
              "markers (worker ids; kinds, 1 = GRAD, 0 = DONE, 2 = IDLE; local_steps), then the "
              "step:", ids, kinds, marked, step_now], summarize=64)
  divisor = num_workers if divide_by_initial else g_on
  with tf.control_dependencies([check]):
    taken = gradient_queues.mean(queues, grads_of, step_now, g_on, divisor)
  new_step = apply_step(opt, taken, step, extra_step)
  with tf.device(step.device):  # Every op of the run on the ps: none on the chief's task.
    applied = tf.cast(new_step, tf.int64)
    unchanged, _ = tf.raw_ops.Switch(data=step_now, pred=has_grads)
    token = tf.raw_ops.Merge(inputs=[unchanged, applied]).output  # the step the tokens carry
    live = tf.logical_not(stopped)
    receivers = tf.where(live, grads_of + idle_of, tf.zeros_like(grads_of))
    applied_of = tf.where(has_grads, grads_of, tf.zeros_like(grads_of))
    guests = steps.after_tokens(receivers, token, applied_of)  # their markers come too
    with tf.control_dependencies([guests]):
      # One token per receiver, in worker order; none after a STOP marker.
      pieces = tf.split(tf.fill(tf.reshape(tf.reduce_sum(receivers), [1]), token), receivers,
                        axis=axis, num=num_workers)
      enqueued = [q.enqueue_many(tf.cast(piece, q.dtypes[0]))
                  for piece, q in zip(pieces, state.tokens)]
      next_active = _v1.assign(num_active, tf.reduce_sum(receivers) + guests)
    result_off, result_on = tf.raw_ops.Switch(data=result, pred=has_grads)
    # A Merge waits for its control inputs, dead (skipped) or not, and is not killed by them.
    with tf.control_dependencies(enqueued + [next_active]):
      return tf.raw_ops.Merge(inputs=[result_off, result_on]).output
