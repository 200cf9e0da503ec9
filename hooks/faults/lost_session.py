"""Which error made TensorFlow's MonitoredSession drop its session, for the WARNING that says so.

MonitoredSession answers an AbortedError or UnavailableError from a step (or from its stop
check or a session creation) by closing the session and creating another; the error reaches no
hook, only a line TensorFlow logs at INFO ("An error was raised. This may be due to a
preemption ..."), which a job at the default verbosity does not show. `LostSessionLog` keeps
the last such error per thread, so that the one that refuses the re-created session (the
recovery guard, the project's session creators) logs it at WARNING with the task and the step.

Typical usage:
  lost = lost_session_log()                   # one per process, attached to TF's logger
  ...                                         # MonitoredSession re-creates its session
  logging.warning("%s lost its session at step %d: %s", task, step, lost.last_error())
"""

import logging as _logging
import threading
from typing import Optional

from hooks import log as logging

__all__ = ["LostSessionLog", "lost_session_log", "describe_lost_session"]

# The sentences TensorFlow's _RecoverableSession logs before it re-creates its session.
_MARKERS = ("This may be due to a preemption", "A new session will be created")
_ERROR = "Error: "
_LOGGER = "tensorflow"


class LostSessionLog(_logging.Handler):
  """A handler on TensorFlow's logger that keeps, per thread, TensorFlow's last lost-session
  error; it writes nothing.

    lost = lost_session_log()
    error = lost.last_error()   # "Graph execution error: ... received twice ..." or None
  """

  def __init__(self):
    super().__init__(level=_logging.DEBUG)
    self._errors = threading.local()

  def emit(self, record: _logging.LogRecord) -> None:
    try:
      message = record.getMessage()
    except Exception:  # pylint: disable=broad-except
      return
    if any(marker in message for marker in _MARKERS):
      self._errors.last = message.split(_ERROR, 1)[-1].strip()

  def count_step(self) -> None:
    """Counts one step of this thread's session (the recovery guard's before_run)."""
    self._errors.steps = self.steps() + 1

  def steps(self) -> int:
    """Steps counted in this thread since the last clear()."""
    return getattr(self._errors, "steps", 0)

  def last_error(self) -> Optional[str]:
    """TensorFlow's last lost-session error in this thread (None if none was logged)."""
    return getattr(self._errors, "last", None)

  def clear(self) -> None:
    self._errors.last, self._errors.steps = None, 0


_lock = threading.Lock()
_instance: Optional[LostSessionLog] = None


def lost_session_log() -> LostSessionLog:
  """The process's LostSessionLog, attached to TensorFlow's logger on the first call.

  TensorFlow logs the error at INFO: where its logger hides INFO the record is never made and
  `last_error()` stays None (describe_lost_session then says how to show it).
  """
  global _instance
  with _lock:
    if _instance is None:
      _instance = LostSessionLog()
      _logging.getLogger(_LOGGER).addHandler(_instance)
    return _instance


def describe_lost_session(task: str, global_step: Optional[int] = None) -> str:
  """Logs at WARNING what made TensorFlow drop `task`'s session, after how many steps of this
  thread's session (counted by the recovery guard, if it runs); returns the cause's text."""
  lost = lost_session_log()
  error, steps = lost.last_error(), lost.steps()
  cause = (error or "TensorFlow did not log the error: its logger's level hides INFO; "
           "set tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.INFO) to see it")
  where = f" in step {steps} of this task"
  if global_step is not None:
    where += f" (global step {global_step})"
  logging.warning("%s: TensorFlow's MonitoredSession lost its session%s and re-created it; "
                  "the error: %s", task, where, cause)
  return cause
