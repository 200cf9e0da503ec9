"""Ends the process when an asynchronous training step never comes back from TensorFlow.

An asynchronous step waits for no other task: it reads its batch, computes its gradients and
applies them on the ps. A step still inside `session.run` after `step_timeout_secs` is a run
TensorFlow lost: one of its RunGraph requests was rejected as a duplicate and the cancellation
never reached another partition, which now waits for ever (docs/reliability.md, "A step
rejected as a duplicate request"). Nothing ends such a run (closing the session waits for it),
so the watchdog logs a WARNING after `warn_after_secs` (then every `log_every_secs`) and, at
the timeout, an ERROR that names the step, and ends the process with status 1: the other tasks
name it dead within seconds and the restarted job resumes from its newest checkpoint. Before,
such a worker stayed in its run until the chief's barrier timeout (30 min) named it.

Typical usage (epoch_sync_hooks gives one to the RecoveryGuardHook of an asynchronous job):
  watchdog = StuckStepWatchdog("worker:1", StepWatch(600, 60, 30))
  watchdog.start()
  with watchdog.step(17):
    session.run(train_op)
  watchdog.stop()
"""

import contextlib
import threading
from typing import Callable, Iterator, Optional

from hooks import log as logging
from hooks.faults.process_exit import exit_process
from hooks.faults.step_watch import StepWatch

__all__ = ["StuckStepWatchdog", "EXIT_STATUS"]

EXIT_STATUS = 1
_FLAG = "--epochsync_step_timeout_secs"


class StuckStepWatchdog:
  """See the module docstring. `exit_fn(status)` ends the process (tests inject one)."""

  def __init__(self, task_name: str, watch: StepWatch,
               exit_fn: Optional[Callable[[int], None]] = None):
    self.task_name, self._watch = task_name, watch
    self._exit = exit_fn or exit_process
    self._poll_secs = min(1.0, watch.timeout_secs / 10)
    self._number = 0
    self._stop = threading.Event()
    self._thread: Optional[threading.Thread] = None

  def start(self) -> None:
    """Starts the watching thread (once; again after stop())."""
    if self._thread is not None and self._thread.is_alive() and not self._stop.is_set():
      return
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._run, args=(self._stop,), daemon=True,
                                    name=f"epochsync-stuck-step-{self.task_name}")
    self._thread.start()

  def stop(self) -> None:
    self._stop.set()

  @contextlib.contextmanager
  def step(self, number: int) -> Iterator[None]:
    """Watches the run inside the `with` block as step `number` of this task."""
    self._number = number
    self._watch.start()
    try:
      yield
    finally:
      self._watch.finish()

  def _run(self, stop: threading.Event) -> None:
    while not stop.wait(self._poll_secs):
      due = self._watch.due()
      if due is None:
        continue
      waited, timed_out = due
      if not timed_out:
        logging.warning("%s: step %d of this task has been in TensorFlow's session.run for "
                        "%.0f s; an asynchronous step waits for no other task (this process "
                        "ends at %.0f s, %s)", self.task_name, self._number, waited,
                        self._watch.timeout_secs, _FLAG)
        continue
      logging.error(
          "%s: step %d of this task has been in TensorFlow's session.run for %.0f s, and an "
          "asynchronous step waits for no other task: TensorFlow lost this run (a RunGraph "
          "rejected as a duplicate whose cancellation never reached the other partitions; "
          "see docs/reliability.md) and nothing can end it, so this process ends now (exit "
          "status %d). Restart the job (every task): it resumes from its newest checkpoint. "
          "If a healthy step can take this long, raise %s", self.task_name, self._number,
          waited, EXIT_STATUS, _FLAG)
      self._exit(EXIT_STATUS)
      return
