"""The chief's aggregation loop: one run of the optimizer's aggregate_op per synchronous step.

Each run takes one step's markers, applies the mean of that step's gradients and hands out the
tokens; a run that returns 0 ends the epoch (every active worker sent DONE), and the chief
then counts the epoch; a negative one (a STOP marker) ends the loop. The run is on the ps
tasks only and stores what it returns there; a second run reads it. A run that TensorFlow
rejected as a duplicate request (hooks.faults.step_retry) therefore changed nothing (it has
no partition on this task, and its markers wait for every ps) and runs again; so does the read.

A run TensorFlow lost (rejected on one ps, its cancellation lost on another: it never returns;
docs/reliability.md) is found by `check_lost()`, which the hook's watchdog thread calls: the
aggregation run counts itself in `begun` once it started on every ps, before it takes any
marker, so one still running after `lost_after_secs` with the count behind ran nothing; the
read of the aggregation only reads. Such a run is left behind with its thread (which, if its
run ever returns, does nothing more), and the caller starts a new thread, whose `run()` goes on
where the loop was, with the same run.

Typical usage (SafeSyncTokensHook's threads on the chief):
  loop = AggregationLoop("worker:0", ops.aggregate_and_store_op, ops.last_aggregate,
                         ops.count_epoch_op, begun=ops.aggregations_begun)
  loop.run(session, coord.should_stop)   # until STOP or a closed marker queue; raises errors
  if loop.check_lost(session): start a thread that calls loop.run(session, should_stop, gen)
"""

import time
from typing import Any, Callable, List, Optional, Tuple

import tensorflow as tf

from hooks import log as logging
from hooks.faults import step_retry
from hooks.faults.process_exit import exit_process
from hooks.faults.step_runner import leave_behind
from hooks.faults.stuck_step import LOST_AFTER_SECS, MAX_LOST
from hooks.faults.waiting import run_options
from hooks.sync.elastic_steps import IDLE_ROUND

__all__ = ["AggregationLoop"]

_AGGREGATE, _READ = "the aggregation run", "the read of the aggregation"
_STALE = object()  # what a left-behind thread's run gives back: it stops
_PROBE_SECS = 5.0


class AggregationLoop:
  """Counts what it aggregated: `num_updates` (runs that applied gradients) and
  `num_aggregations` (all runs but the last); `generation` is the current thread's."""

  def __init__(self, task_name: str, aggregate_and_store: tf.Operation, last: tf.Tensor,
               count_epoch_op: tf.Tensor,
               listeners: Optional[List[Callable[[Any, int], None]]] = None,
               begun: Optional[tf.Variable] = None, lost_after_secs: float = LOST_AFTER_SECS,
               exit_fn: Optional[Callable[[int], None]] = None):
    self.task_name = task_name
    self._aggregate, self._last, self._count_epoch_op = aggregate_and_store, last, count_epoch_op
    self.num_updates = 0
    self.num_aggregations = 0
    self._listeners = listeners if listeners is not None else []
    self._begun, self._lost_after = begun, lost_after_secs
    self._exit = exit_fn or exit_process
    self.generation = 0
    self._phase = _AGGREGATE  # the run the loop makes next: a new thread resumes there
    self._running: Optional[Tuple[int, float]] = None  # (generation, start) of a run in flight
    self._begun_base: Optional[int] = None
    self._aggregated = 0  # aggregation runs that returned since begun_base was read
    self._probed: Optional[Tuple[int, float]] = None
    self._lost_in_a_row = 0
    self._updates_at_epoch_start = 0

  def on_aggregated(self, fn: Callable[[Any, int], None]) -> None:
    """`fn(session, g)` after each aggregation run (g > 0 a step, 0 the epoch's end)."""
    self._listeners.append(fn)

  def run(self, session, should_stop: Callable[[], bool], generation: int = 0) -> None:
    """Aggregates until a STOP marker, a closed marker queue or `should_stop()`; a thread
    whose `generation` was left behind (check_lost) returns as soon as its run does."""
    aggregate = session.make_callable(self._aggregate)  # As stock's queue runner.
    last = session.make_callable(self._last)
    if self._begun_base is None and self._begun is not None:
      self._begun_base = int(session.run(self._begun))
    try:
      while not should_stop():
        if self._phase == _AGGREGATE:
          if self._run(generation, aggregate, _AGGREGATE) is _STALE:
            return
          self._phase = _READ
        grads = self._run(generation, last, _READ)
        if grads is _STALE:
          return
        self._phase = _AGGREGATE
        if grads == IDLE_ROUND:  # (elastic) IDLE markers only: nothing applied, no step.
          continue
        if grads < 0:
          logging.info("%s: aggregation stopped after %d updates", self.task_name,
                       self.num_updates)
          return
        self._aggregated_one(session, grads)
    except tf.errors.OutOfRangeError:
      if generation == self.generation:
        logging.info("%s: aggregation stopped (marker queue closed) after %d updates",
                     self.task_name, self.num_updates)

  def _aggregated_one(self, session, grads: int) -> None:
    self.num_aggregations += 1
    self.num_updates += int(grads > 0)
    if grads == 0:  # Every active worker sent DONE: the epoch is over.
      epochs = int(session.run(self._count_epoch_op))  # Advanced and read in one run.
      logging.info("%s: epoch %d aggregated in %d synchronous steps", self.task_name,
                   epochs - 1, self.num_updates - self._updates_at_epoch_start)
      self._updates_at_epoch_start = self.num_updates
    for fn in self._listeners:
      fn(session, grads)

  def _run(self, generation: int, fn: Callable[[], Any], what: str) -> Any:
    """fn() (run again when any task rejected it: nothing ran), or _STALE if this thread was
    left behind meanwhile."""
    self._running = (generation, time.monotonic())
    try:
      value = step_retry.run_rerunnable(fn, what, self.task_name)
    except Exception:  # pylint: disable=broad-except
      if generation != self.generation:
        return _STALE  # left behind: its run ended with an error at last (e.g. at close)
      raise
    finally:
      if generation == self.generation:
        self._running = None
    if generation != self.generation:
      if what == _AGGREGATE:
        logging.error("%s: %s left behind as lost came back done, after another thread ran "
                      "it again: a step may be in the model twice, so this process ends now "
                      "(exit status 1); restart the job (every task), it resumes from its "
                      "newest checkpoint", self.task_name, what)
        self._exit(1)
      return _STALE
    self._aggregated += int(what == _AGGREGATE)
    self._lost_in_a_row = 0
    return value

  def check_lost(self, session) -> bool:
    """Whether the run in flight was lost and is now left behind: then the caller starts a
    new thread with `run(session, should_stop, self.generation)`. Called now and then."""
    running = self._running
    if running is None or running[0] != self.generation or self._probed == running:
      return False
    waited = time.monotonic() - running[1]
    if waited < self._lost_after:
      return False
    phase = self._phase
    if phase == _AGGREGATE:
      if self._begun is None or self._begun_base is None:
        return False
      try:
        begun = int(session.run(self._begun, options=run_options(_PROBE_SECS)))
      except Exception:  # pylint: disable=broad-except
        return False  # a busy ps: probe again next time
      self._probed = running
      if begun >= self._begun_base + self._aggregated + 1:
        return False  # it started on every ps: it waits for the workers' markers
    self._probed = running
    what = (f"{self.task_name}: {phase} has been in TensorFlow's session.run for "
            f"{waited:.0f} s and " + ("never started on every ps" if phase == _AGGREGATE else
                                      "never returned (it only reads a variable)") +
            ": TensorFlow rejected a part as a duplicate RunGraph request and lost the "
            "cancellation of the others (see docs/reliability.md), so the run can never end")
    if self._lost_in_a_row >= MAX_LOST:
      logging.error("%s. It was lost %d times; this process ends now (exit status 1): restart "
                    "the job (every task), it resumes from its newest checkpoint", what,
                    MAX_LOST + 1)
      self._exit(1)
      return False
    self._lost_in_a_row += 1
    self.generation += 1
    self._running = None
    leave_behind(session)
    logging.warning("%s. Nothing of it ran, so a new aggregation thread runs it again (retry %d "
                    "of %d); the lost run stays blocked in TensorFlow until the process ends",
                    what, self._lost_in_a_row, MAX_LOST)
    return True
