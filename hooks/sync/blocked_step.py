"""Ends this task's synchronous step when its session must stop while the step waits.

A step waits for its token in a run without a deadline (hooks.faults.waiting: only a 7-day
backstop), and TensorFlow cannot cancel a running step: closing the session would wait for
it. So a stop (a timeout, a dead task, a failed aggregation) enqueues an ABORT token into this
task's token queue, which ends the step; the hook's next after_run() raises the stop's error.
If the token queue's ps does not take the token (frozen, partitioned), or the step does not end
on it (a run TensorFlow rejected on one partition and never cancelled on another:
docs/reliability.md), the process ends 10 s later with an ERROR that says why, so that the job
can be restarted from its newest checkpoint.

Typical usage (inside SafeSyncTokensHook):
  ender = BlockedStepEnder("worker:1", step_watch)
  ender.step_started(threading.get_ident())         # before_run of a step
  ender.stop(session, coord, error, abort_step_op)  # from the watchdog or the aggregation
  if ender.error is not None: raise ender.error      # after_run
"""

import threading
import time
from typing import Optional

import tensorflow as tf

from hooks import log as logging
from hooks.faults import process_exit
from hooks.faults.step_watch import StepWatch
from hooks.faults.waiting import run_options

__all__ = ["BlockedStepEnder", "run_bounded"]

EXIT_GRACE_SECS = 10.0  # After a stop whose ABORT token could not be delivered or did not help.
_RUN_TIMEOUT_SECS = 2.0  # The ABORT token's enqueue (and other runs that must not block).


def run_bounded(session, op, task_name: str, what: str) -> bool:
  """Runs `op` with a 2 s deadline; False (and a WARNING saying what failed) if it did not."""
  try:
    session.run(op, options=run_options(_RUN_TIMEOUT_SECS))
    return True
  except tf.errors.OpError as e:
    logging.warning("%s: could not %s: %s", task_name, what, e.message)
    return False


class BlockedStepEnder:
  """See the module docstring. `error` is the stop's error until the next session."""

  def __init__(self, task_name: str, step: StepWatch):
    self.task_name, self._step = task_name, step
    self.error: Optional[Exception] = None
    self._thread: Optional[int] = None

  def step_started(self, thread_id: int) -> None:
    """The thread that runs the step (the one a step that never ends would hold)."""
    self._thread = thread_id

  def stop(self, session, coord, error: Exception, abort_step_op) -> None:
    """Stops `coord` with `error` and ends the step blocked on its token (ABORT token)."""
    self.error = error
    coord.request_stop((type(error), error, None))
    if not run_bounded(session, abort_step_op, self.task_name, "end the blocked step"):
      # Nothing can end the step's run before its 7-day backstop: the process ends instead.
      logging.error("%s: %s; the step's ps does not take the ABORT token, so this process ends "
                    "in %.0f s (exit status 1)", self.task_name, error, EXIT_GRACE_SECS)
      process_exit.exit_after(EXIT_GRACE_SECS)
    elif self._step.waited() is not None and self._thread is not None:
      threading.Thread(target=self._exit_unless_step_ends, args=(error, self._thread),
                       daemon=True, name="epochsync-step-end").start()

  def end_if_blocked(self, session, abort_step_op) -> None:
    """The session stopped for another's error (a second sync optimizer's hook, whose step
    waits for both optimizers' tokens) while the step waits: this token queue ends it too."""
    if self.error is None and self._step.waited() is not None:
      run_bounded(session, abort_step_op, self.task_name, "end the blocked step")

  def _exit_unless_step_ends(self, error: Exception, thread_id: int) -> None:
    """The step took its ABORT token or was never waiting for one: a run TensorFlow rejected
    on one partition and never cancelled on another waits for ever (docs/reliability.md)."""
    deadline = time.monotonic() + EXIT_GRACE_SECS
    while time.monotonic() < deadline:
      if self._step.waited() is None or not process_exit.in_session_run(thread_id):
        return
      time.sleep(0.1)
    logging.error("%s: %s; the step did not end on its ABORT token (TensorFlow cannot end a run "
                  "it rejected as a duplicate request on one task and did not cancel on "
                  "another), so this process ends (exit status 1); restart the job from its "
                  "model_dir", self.task_name, error)
    process_exit.exit_process(1)
