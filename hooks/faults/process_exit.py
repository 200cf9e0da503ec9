"""Where a thread is (TensorFlow's session recovery or not), and how RecoveryGuardHook ends a process.

Typical usage (hooks.faults.recovery_guard's watcher thread):
  in_tf, in_monitored = where(sys._current_frames()[main_thread_id])
  if in_tf and dead: exit_process(1)
"""

import faulthandler
import os
import sys
from typing import Tuple

from hooks import log as logging
from hooks.faults.step_runner import WAITING_FRAME

__all__ = ["where", "in_session_run", "exit_after", "exit_process"]

_HOOKS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # hooks/
# TensorFlow's session recovery and close: _RecoverableSession._create_session (its retry loop,
# also the first creation) and the closes. The creators it calls are not listed: ours (in
# hooks/) have their own checks, TensorFlow's are below _create_session.
_TF_RECOVERY = {("monitored_session.py", name) for name in ("_create_session", "close",
                                                            "_close_internal")}


def where(frame) -> Tuple[bool, bool]:
  """(TensorFlow's recovery holds the thread, the thread is inside a MonitoredSession at all).

  The innermost frame that is either tf-epochsync's (hooks/) or TensorFlow's recovery decides
  the first: our creators and hooks have their own checks.
  """
  in_tf, decided, in_monitored = False, False, False
  while frame is not None:
    path = frame.f_code.co_filename
    in_monitored = in_monitored or path.endswith("monitored_session.py")
    if not decided:
      if path.startswith(_HOOKS_DIR):
        decided = True
      elif (os.path.basename(path), frame.f_code.co_name) in _TF_RECOVERY:
        in_tf = decided = True
    frame = frame.f_back
  return in_tf, in_monitored


def in_session_run(thread_id: int) -> bool:
  """Whether thread `thread_id` is blocked in (or running) a TensorFlow session.run, or waits
  for one on a runner thread (hooks.faults.step_runner)."""
  frame = sys._current_frames().get(thread_id)  # pylint: disable=protected-access
  while frame is not None:
    if frame.f_code.co_name in ("_call_tf_sessionrun", WAITING_FRAME):
      return True
    frame = frame.f_back
  return False


def exit_after(secs: float) -> None:
  """Ends the process with status 1 in `secs` unless it ended by then (even in finalization)."""
  faulthandler.dump_traceback_later(secs, exit=True, file=open(os.devnull, "w"))  # pylint: disable=consider-using-with


def exit_process(status: int) -> None:
  """Flushes the logs and ends the process at once (the session's thread cannot be woken)."""
  logging.flush()
  for stream in (sys.stdout, sys.stderr):
    try:
      stream.flush()
    except Exception:  # pylint: disable=broad-except
      pass
  os._exit(status)  # pylint: disable=protected-access
