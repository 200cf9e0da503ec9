"""The chief's aggregation loop: one run of the optimizer's aggregate_op per synchronous step.

Each run takes one step's markers, applies the mean of that step's gradients and hands out the
tokens; a run that returns 0 ends the epoch (every active worker sent DONE), and the chief
then counts the epoch; a negative one (a STOP marker) ends the loop. The run is on the ps
tasks only and stores what it returns there; a second run reads it. A run that TensorFlow
rejected as a duplicate request (hooks.faults.step_retry) therefore changed nothing (it has
no partition on this task, and its markers wait for every ps) and runs again; so does the read.

Typical usage (SafeSyncTokensHook's thread on the chief):
  loop = AggregationLoop("worker:0", ops.aggregate_and_store_op, ops.last_aggregate,
                         ops.count_epoch_op)
  loop.run(session, coord.should_stop)   # until STOP or a closed marker queue; raises errors
"""

from typing import Any, Callable, List, Optional

import tensorflow as tf

from hooks import log as logging
from hooks.faults import step_retry

__all__ = ["AggregationLoop"]


class AggregationLoop:
  """Counts what it aggregated: `num_updates` (runs that applied gradients) and
  `num_aggregations` (all runs but the last)."""

  def __init__(self, task_name: str, aggregate_and_store: tf.Operation, last: tf.Tensor,
               count_epoch_op: tf.Tensor,
               listeners: Optional[List[Callable[[Any, int], None]]] = None):
    self.task_name = task_name
    self._aggregate, self._last, self._count_epoch_op = aggregate_and_store, last, count_epoch_op
    self.num_updates = 0
    self.num_aggregations = 0
    self._listeners = listeners if listeners is not None else []

  def on_aggregated(self, fn: Callable[[Any, int], None]) -> None:
    """`fn(session, g)` after each aggregation run (g > 0 a step, 0 the epoch's end)."""
    self._listeners.append(fn)

  def run(self, session, should_stop: Callable[[], bool]) -> None:
    """Aggregates until a STOP marker, a closed marker queue or `should_stop()`."""
    updates_at_epoch_start = 0
    aggregate = session.make_callable(self._aggregate)  # As stock's queue runner.
    last = session.make_callable(self._last)
    rejected = lambda e: bool(step_retry.rejecting_tasks(e))  # by any task: nothing ran
    try:
      while not should_stop():
        step_retry.run_retrying(aggregate, "the aggregation run", self.task_name, rejected)
        grads = step_retry.run_retrying(last, "the read of the aggregation", self.task_name,
                                        rejected)
        if grads < 0:
          logging.info("%s: aggregation stopped after %d updates", self.task_name,
                       self.num_updates)
          return
        self.num_aggregations += 1
        self.num_updates += int(grads > 0)
        if grads == 0:  # Every active worker sent DONE: the epoch is over.
          epochs = int(session.run(self._count_epoch_op))  # Advanced and read in one run.
          logging.info("%s: epoch %d aggregated in %d synchronous steps", self.task_name,
                       epochs - 1, self.num_updates - updates_at_epoch_start)
          updates_at_epoch_start = self.num_updates
        for fn in self._listeners:
          fn(session, grads)
    except tf.errors.OutOfRangeError:
      logging.info("%s: aggregation stopped (marker queue closed) after %d updates",
                   self.task_name, self.num_updates)
