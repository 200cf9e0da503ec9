"""Retries a step that TensorFlow's own task rejected as a duplicate RunGraph request.

TensorFlow gives every RunGraph request of a step an id from a thread-local random generator
seeded with 32 random bits, and the master runs each step on a new thread, so the ids of a
step repeat those of an earlier step once in ~10^5 runs (a birthday collision of the seeds);
each task rejects a request id it saw among its last 100,000 with ABORTED "The same RunGraph
(Worker) request was received twice", before running anything of that partition. When the
partition rejected is this task's own, nothing stateful of the step ran: this task's input
was not read (its look-ahead queue is in that partition) and the ps partitions wait for its
gradients until the master cancels them. Such a step is run again (new ids); any other
rejection (only a ps's partition: this task's own partition may have read a batch) is left to
the recovery guard, which names it.

Typical usage (RecoveryGuardHook.after_create_session does it):
  retry_duplicate_steps(session, "worker:1")
"""

import re
import sys
from typing import Callable

import tensorflow as tf

from hooks import log as logging

__all__ = ["retry_duplicate_steps", "rejected_by_own_task", "MAX_RETRIES"]

MAX_RETRIES = 3
# The step's error: ABORTED, or CANCELLED when another partition's cancellation is reported first.
_REPORTED_AS = (tf.errors.AbortedError, tf.errors.CancelledError)
_MONITORED = "monitored_session.py"  # a step: session.run called by MonitoredSession itself


def rejected_by_own_task(error: Exception, task_name: str) -> bool:
  """Whether `error` says `task_name`'s own partition rejected its RunGraph as a duplicate."""
  if not isinstance(error, _REPORTED_AS):
    return False
  job, index = task_name.split(":")
  own = re.compile(rf"From /job:{re.escape(job)}/replica:\d+/task:{index}:\s*The same RunGraph "
                   r"\(Worker\) request was received twice")
  return bool(own.search(getattr(error, "message", str(error))))


def retry_duplicate_steps(session, task_name: str) -> None:
  """Wraps `session.run` (this session object only): a MonitoredSession step whose own
  partition was rejected as a duplicate request is logged at WARNING and run again, up to
  MAX_RETRIES times; every other run, and every other error, passes through unchanged."""
  run = session.run
  if getattr(run, "_epochsync_retrying", False):
    return
  steps = [0]

  def run_retrying(*args, **kwargs):
    step = sys._getframe(1).f_code.co_filename.endswith(_MONITORED)  # pylint: disable=protected-access
    if not step:
      return run(*args, **kwargs)
    steps[0] += 1
    for attempt in range(MAX_RETRIES + 1):
      try:
        return run(*args, **kwargs)
      except _REPORTED_AS as e:
        if attempt == MAX_RETRIES or not rejected_by_own_task(e, task_name):
          raise
        logging.warning(
            "%s: step %d of this task was rejected by its own task as a duplicate RunGraph "
            "request (TensorFlow drew the request ids of an earlier step); nothing of the step "
            "ran here, so it runs again (retry %d of %d). The error: %s", task_name, steps[0],
            attempt + 1, MAX_RETRIES, getattr(e, "message", e))
    raise AssertionError("unreachable")

  run_retrying._epochsync_retrying = True  # pylint: disable=protected-access
  session.run = run_retrying
