"""When the running synchronous step started, and whether it is due a WARNING or its timeout.

SafeSyncTokensHook's bookkeeping between the main thread (which starts and finishes steps) and
its watchdog thread (which asks what is due); thread-safe.

Typical usage:
  watch = StepWatch(step_timeout_secs=600, warn_after_secs=60, log_every_secs=30)
  watch.start()                 # before_run of a step (main thread)
  due = watch.due()             # watchdog: None, or (waited_secs, timed_out), timeout once
  watch.finish()                # after_run
"""

import threading
import time
import warnings
from typing import Any, Callable, Optional, Sequence, Tuple

import tensorflow as tf

from hooks import log as logging
from hooks.errors import StepTimeoutError
from hooks.faults.heartbeat import ProgressWatch
from hooks.faults.step_diagnostics import describe_step

__all__ = ["StepWatch", "follow_progress", "warn_or_time_out"]


class StepWatch:
  """A step's start time, its WARNING period and its timeout (which fires once per step).

  The durations are checked by the hook that owns it (sync_args.raise_if_bad_hook_arguments).
  """

  def __init__(self, step_timeout_secs: float, warn_after_secs: float, log_every_secs: float,
               clock: Callable[[], float] = time.monotonic):
    if warn_after_secs >= step_timeout_secs:
      warnings.warn(f"warn_after_secs={warn_after_secs} >= step_timeout_secs={step_timeout_secs}:"
                    " a stuck step fails before any warning", stacklevel=4)
    self.timeout_secs, self.warn_after_secs = float(step_timeout_secs), float(warn_after_secs)
    self._log_every, self._clock = float(log_every_secs), clock
    self._lock = threading.Lock()
    self._started: Optional[float] = None
    self._next_warn: Optional[float] = None

  def start(self) -> None:
    with self._lock:
      self._started, self._next_warn = self._clock(), None

  def touch(self) -> None:
    """The tasks the running step waits for made progress: its clock restarts from now."""
    with self._lock:
      if self._started is not None:
        self._started, self._next_warn = self._clock(), None

  def finish(self) -> None:
    with self._lock:
      self._started = None

  def waited(self) -> Optional[float]:
    """Seconds the running step has waited, None between steps."""
    with self._lock:
      started = self._started
    return None if started is None else self._clock() - started

  def due(self) -> Optional[Tuple[float, bool]]:
    """(waited, timed_out) when a WARNING (every log_every_secs) or the timeout is due."""
    now = self._clock()
    with self._lock:
      if self._started is None:
        return None
      waited = now - self._started
      if waited >= self.timeout_secs:
        self._started = None  # Fire once.
        return waited, True
      if waited < self.warn_after_secs or (self._next_warn is not None and now < self._next_warn):
        return None
      self._next_warn = now + self._log_every
      return waited, False


def follow_progress(step: StepWatch, watch: Optional[ProgressWatch], rows: Callable[[], Any],
                    names: Sequence[str], after_secs: float) -> Optional[ProgressWatch]:
  """Once the running step has waited `after_secs`: when a task of `names` moved (its heartbeat
  row from `rows()`; e.g. the chief saves a mid-epoch checkpoint between two aggregations), the
  step's clock restarts. Returns the watch to pass next time (None between steps).

    watch = follow_progress(step, watch, read_rows, ["worker:0", "worker:1"], 1.0)
  """
  waited = step.waited()
  if waited is None or waited < after_secs:
    return None

  def read():
    try:
      return rows()
    except tf.errors.OpError:
      return None

  if watch is None:
    return ProgressWatch(read, names)
  moved_at = watch.moved_at
  watch.observe(range(len(names)))
  if watch.moved_at != moved_at:
    step.touch()
  return watch


def warn_or_time_out(step: StepWatch, coord, read: Callable[[], Tuple[int, Sequence[int]]],
                     names: Sequence[str], task_name: str) -> Optional[StepTimeoutError]:
  """Warns about or times out the running step; `read` returns (global_step, progress).

  The step's time counts from its start or the last progress of another task. Returns the
  StepTimeoutError it stopped `coord` with, if it timed out.
  """
  due = step.due()
  if due is None:
    return None
  waited, timed_out = due
  number, summary, missing = describe_step(read, names)
  if not timed_out:
    logging.warning("%s has waited %.0f s for step %s: %s", task_name, waited, number, summary)
    return None
  error = StepTimeoutError(f"step {number} timed out after {waited:.0f} s on {task_name}: "
                           f"{summary}", missing)
  logging.error("%s", error)
  coord.request_stop((StepTimeoutError, error, None))
  return error
