"""The ps-side graphs of WorkerDoneSyncReplicasOptimizer: the chief's aggregation and the reset.

Both run on the ps tasks in one piece; hooks.sync.optimizer builds the worker's step and calls
these. Markers are (worker id, kind, local_step); a kind is the marker's weight in the count
of gradients: GRAD 1, DONE 0, STOP a negative number no count of GRADs makes up.

Typical usage (inside WorkerDoneSyncReplicasOptimizer.apply_gradients):
  aggregate = aggregate_op(opt, num_workers, divide_by_initial, num_active, markers, tokens,
                           accums, step)
"""

from typing import List, Optional, Sequence, Tuple

import tensorflow as tf

from hooks.data import step_gate

__all__ = ["GRAD", "DONE", "STOP", "aggregate_op", "reset_op", "take_markers", "apply_step"]

_v1 = tf.compat.v1
GRAD, DONE, STOP = 1, 0, -2**20  # Marker kinds; STOP ends the chief's loop (tokens.end()).


def aggregate_op(opt: _v1.train.Optimizer, num_workers: int, divide_by_initial: bool,
                 num_active: tf.Tensor, markers, tokens: Sequence, accums: List[Tuple],
                 step: tf.Variable, extra_step: Optional[tf.Variable] = None,
                 begun: Optional[tf.Variable] = None) -> tf.Tensor:
  """One run: dequeue one step's markers, apply the mean of its gradients, hand out tokens.

  Returns g, the number of GRAD markers: > 0 a step was applied, 0 the epoch is over (every
  active worker sent DONE), < 0 a STOP marker came (nothing changed). `num_active`, an int32
  variable on the ps, says how many markers to dequeue: a step sets it to its g (a DONE sender
  leaves the epoch), the chief's count_epoch_op back to num_workers. Besides each token
  queue's handle and enqueue, the op count does not depend on the number of workers. `step`
  numbers the steps (global_step or the own sync_step); `extra_step`, if any, is a global_step
  that is incremented too. `begun`, an int64 variable beside `step`, counts the runs that
  started on every ps (before any marker is taken): one behind is a run TensorFlow lost
  (hooks.sync.aggregation_loop).
  """
  ids, kinds, steps = take_markers([var.device for _, var in accums], step, begun, markers,
                                    num_active)
  with tf.device(step.device):
    # Tokens per worker (0 or 1, in worker order), and their sum g (negative with a STOP).
    counts = tf.math.unsorted_segment_sum(kinds, ids, num_workers)
    axis = tf.constant(0)
    g = tf.raw_ops.Sum(input=counts, axis=axis)
    g_vector = tf.raw_ops.Sum(input=counts, axis=axis, keep_dims=True)
    has_grads = tf.greater(g, axis)
    # A hand-built Switch/Merge, not tf.cond: cond_v2 cannot capture the sparse accumulators'
    # ref handles. Every op of the update depends on g_on, so all are dead when it is skipped.
    g_off, g_on = tf.raw_ops.Switch(data=g, pred=has_grads)
    _, steps_on = tf.raw_ops.Switch(data=steps, pred=has_grads)  # No STOP marker among them.
    # The next step's markers come from this step's GRAD senders (a DONE sender left the epoch);
    # at an epoch's end the chief's count_epoch_op sets all workers again.
    next_active = _v1.assign(num_active, g_on)
    step_now = tf.cast(step, tf.int64)
    # A GRAD or DONE marker of this step carries step_now (a DONE one: its sender's last token).
    # A gradient with another local_step was dropped by its accumulator: take_grad(g) would wait.
    check = tf.raw_ops.Assert(condition=tf.reduce_all(tf.equal(steps_on, step_now), axis), data=[
        "WorkerDoneSyncReplicasOptimizer: stale gradient(s), dropped by the accumulators: every "
        "worker must run graph_keys.EPOCH_START_OPS at each epoch start. The step's markers "
        "(worker ids; kinds, 1 = GRAD, 0 = DONE; local_steps), then the step:", ids, kinds,
        steps_on, step_now], summarize=64)
  with tf.control_dependencies([check]):
    taken = _mean_gradients(accums, g_on, num_workers, divide_by_initial)
  new_step = apply_step(opt, taken, step, extra_step)
  with tf.device(step.device):
    # One token per GRAD sender: g copies of the new step, split by worker in worker order.
    pieces = tf.split(tf.fill(g_vector, new_step), counts, axis=axis, num=num_workers)
    enqueued = [q.enqueue_many(piece) for piece, q in zip(pieces, tokens)]
    # A Merge waits for its control inputs, dead (skipped) or not, and is not killed by them.
    with tf.control_dependencies(enqueued + [next_active]):
      return tf.raw_ops.Merge(inputs=[g_off, g_on]).output


def take_markers(devices, step: tf.Variable, begun: Optional[tf.Variable], markers,
                 num_active: tf.Variable):
  """(ids, kinds, local steps) of one step's `num_active` markers, dequeued on `step`'s task
  once every other ps holding one of `devices` started this run (a run TensorFlow rejected on
  one of them, hooks.faults.step_retry, changed nothing), after `begun` counted the run."""
  started = step_gate.gate_ops(devices, step.device, "aggregation_started")
  with tf.device(step.device), tf.control_dependencies(started):
    started = started + ([begun.assign_add(1).op] if begun is not None else [])
  with tf.device(step.device), tf.control_dependencies(started):
    # The ref itself, dereferenced by the dequeue: no read op (`num_active` is a RefVariable).
    return markers.dequeue_many(num_active._ref())  # pylint: disable=protected-access


def apply_step(opt: _v1.train.Optimizer, taken, step: tf.Variable,
               extra_step: Optional[tf.Variable]) -> tf.Tensor:
  """Applies the step's mean gradients `taken` (numbering it in `step`, and `extra_step` too if
  any); the new step. Dead (skipped) with `taken` when no gradient came."""
  with tf.device(step.device):
    update = opt.apply_gradients(taken, step)
    if extra_step is not None:
      with tf.control_dependencies([update]):
        update = tf.group(update, _v1.assign_add(extra_step, 1))
    with tf.control_dependencies([update]):
      return tf.identity(step)


def _mean_gradients(accums: List[Tuple], g_on: tf.Tensor, num_workers: int,
                    divide_by_initial: bool) -> List[Tuple]:
  """[(the mean of the step's g gradients, variable)], each taken as soon as its g are in."""
  divisor = num_workers if divide_by_initial else g_on
  taken = []
  for accum, var in accums:
    with tf.device(var.device):
      if isinstance(accum, _v1.SparseConditionalAccumulator):
        s = accum.take_indexed_slices_grad(g_on)
        values = tf.math.truediv(s.values, tf.cast(divisor, accum.dtype))  # 2 ops, not 3
        taken.append((tf.IndexedSlices(values, s.indices, s.dense_shape), var))
      elif divide_by_initial:  # A SUM accumulator.
        taken.append((accum.take_grad(g_on) * (1.0 / num_workers), var))
      else:  # A MEAN accumulator: already divided by g.
        taken.append((accum.take_grad(g_on), var))
  return taken


def reset_op(markers, tokens: Sequence, accums: List[Tuple], progress: tf.Variable,
             fresh_value: int) -> tf.Operation:
  """Drains what an earlier run on these ps tasks left: markers, tokens, partial gradients.

  An accumulator is emptied by take_grad(num_accumulated) only when it holds a gradient: a
  take advances its step by one, and chief_init_op's set_global_step(step) would then move it
  back (TensorFlow logs that on the ps), which on a fresh ps would happen in every run.
  """
  with tf.device(markers.queue_ref.device):
    drained = [q.dequeue_many(q.size()) for q in [markers] + list(tokens)]
    fresh = progress.assign(tf.fill(tf.shape(progress), tf.constant(fresh_value, tf.int64)))
  cleared = []
  for accum, _ in accums:
    with tf.device(accum.accumulator_ref.device):
      count = accum.num_accumulated()
      # Switch/Merge as in the aggregation: the take is dead (skipped) when count == 0.
      empty, held = tf.raw_ops.Switch(data=count, pred=count > 0)
      if isinstance(accum, _v1.SparseConditionalAccumulator):
        taken = accum.take_indexed_slices_grad(held).values
      else:
        taken = accum.take_grad(held)
      with tf.control_dependencies([taken]):
        held = tf.identity(held)
      cleared.append(tf.raw_ops.Merge(inputs=[empty, held]).output)
  return tf.group(*tf.nest.flatten(drained), fresh, *cleared, name="reset")

