"""Runs a step's session.run on a thread of its own, so that a run TensorFlow lost can be left
behind and the step run again.

A run that TensorFlow rejected on this task as a duplicate request, and whose cancellation it
lost on the other tasks, never returns, and nothing ends it: neither a deadline nor closing the
session (docs/reliability.md). Blocked in it, the training loop's thread could only end the
process. So the loop hands each step's run to a runner thread and waits for the outcome; when
the StuckStepWatchdog finds the run lost (its part on this task never started, so nothing of
the step ran), it abandons the call: the loop gets `LostRunError` and runs the step again on a
new runner thread. The abandoned thread stays blocked in TensorFlow until the process ends.

Typical usage (StuckStepWatchdog.run does it):
  runner = StepRunner("worker:1", on_late=report)
  call = runner.submit(lambda: session.run(train_op))
  call.abandon("lost")  # from the watchdog's thread: True if the run had not returned
  result = call.wait_for_run()  # the run's result or error, or LostRunError once abandoned
"""

import queue
import threading
from typing import Any, Callable, Optional

import tensorflow as tf

__all__ = ["StepRunner", "RunCall", "LostRunError", "WAITING_FRAME", "leave_behind",
           "runs_left_behind"]

WAITING_FRAME = "wait_for_run"  # the frame a thread waiting for a runner's call is in
_PENDING = object()


class LostRunError(tf.errors.AbortedError):
  """The step's run was abandoned: TensorFlow lost it before its part on this task started."""

  def __init__(self, message: str):
    super().__init__(None, None, message)


class RunCall:
  """One session.run handed to a runner: its outcome, or its abandonment, whichever is first."""

  def __init__(self, fn: Callable[[], Any],
               on_late: Callable[["RunCall", Any, Optional[BaseException]], None]):
    self._fn, self._on_late = fn, on_late
    self._lock = threading.Lock()
    self._done = threading.Lock()  # held until the outcome is in (cheaper to hand over than
    self._done.acquire()           # an Event: a step's run pays for it)
    self._finished = False
    self._value: Any = _PENDING
    self._error: Optional[BaseException] = None
    self.abandoned = False

  def execute(self) -> None:
    """Runs the call (on the runner thread) and records its outcome."""
    value, error = None, None
    try:
      value = self._fn()
    except BaseException as e:  # pylint: disable=broad-except
      error = e
    with self._lock:
      late = self.abandoned
      if not late:
        self._value, self._error, self._finished = value, error, True
        self._done.release()
    if late:
      self._on_late(self, value, error)

  def abandon(self, message: str) -> bool:
    """Makes `result()` raise LostRunError(message); False if the run had already returned."""
    with self._lock:
      if self._finished:
        return False
      self.abandoned = self._finished = True
      self._error = LostRunError(message)
      self._done.release()
      return True

  def wait_for_run(self) -> Any:
    """The run's result; raises its error, or LostRunError if it was abandoned. Bounded by the
    watchdog: the run returns, or is abandoned, or the watchdog ends the process."""
    while not self._done.acquire(timeout=3600.0):
      pass
    if self._error is not None:
      raise self._error
    return self._value


class StepRunner:
  """A daemon thread that runs the calls submitted to it, one at a time; a new thread takes
  over after a call is abandoned (the old one stays blocked in TensorFlow)."""

  def __init__(self, task_name: str,
               on_late: Callable[[RunCall, Any, Optional[BaseException]], None]):
    self._name, self._on_late = f"epochsync-step-run-{task_name}", on_late
    self._calls: Optional["queue.SimpleQueue[RunCall]"] = None
    self._last: Optional[RunCall] = None

  def submit(self, fn: Callable[[], Any]) -> RunCall:
    """Hands `fn` (a session.run) to the runner thread and returns its call."""
    if self._last is not None and self._last.abandoned:
      self._calls = None  # that thread is blocked in the abandoned run: start another
    if self._calls is None:
      self._calls = queue.SimpleQueue()
      threading.Thread(target=_serve, args=(self._calls,), daemon=True, name=self._name).start()
    call = self._last = RunCall(fn, self._on_late)
    self._calls.put(call)
    return call

  def stop(self) -> None:
    """Ends the runner thread once its call (if any) returns."""
    if self._calls is not None:
      self._calls.put(None)
      self._calls = None


def leave_behind(session) -> None:
  """Notes that a run of `session` was left behind, blocked in TensorFlow for good."""
  session._epochsync_left_behind = runs_left_behind(session) + 1  # pylint: disable=protected-access


def runs_left_behind(session) -> int:
  """How many runs of `session` were left behind: closing it would wait for them for ever."""
  return getattr(session, "_epochsync_left_behind", 0)


def _serve(calls: "queue.SimpleQueue[Optional[RunCall]]") -> None:
  call = calls.get()
  while call is not None:  # stop() ends it; an abandoned run keeps it blocked
    call.execute()
    call = calls.get()
