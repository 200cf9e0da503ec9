"""Ends the process when a training step never comes back from TensorFlow.

TensorFlow loses a run now and then: one of its RunGraph requests is rejected as a duplicate
(docs/reliability.md, "A step rejected as a duplicate request") and the cancellation never
reaches the run's other partitions, which wait for ever; nothing ends such a run (closing the
session waits for it). The watchdog finds it two ways and then logs an ERROR naming the step
and ends the process (exit status 1): the other tasks name it dead within seconds, and the
restarted job resumes from its newest checkpoint.

- **Lost** (every job): each step also sets a local marker to its number, the first thing its
  partition on this task does. A step still running after `lost_after_secs` whose marker is
  behind never started here: TensorFlow rejected this task's part and lost the cancellation of
  the rest. A step whose marker is set is only slow and is left alone, and so is the first step
  of each kind (its fetches and feeds): TensorFlow partitions and registers its graph on every
  task before it starts any partition, which can take long for a large graph.
- **Too long** (an asynchronous job, `watch` given): an asynchronous step waits for no other
  task, so one still running at `step_timeout_secs` is lost too; a WARNING comes after
  `warn_after_secs`, then every `log_every_secs`.

Typical usage (RecoveryGuardHook does it: build in begin(), before_step() in before_run()):
  watchdog = StuckStepWatchdog("worker:1", watch=StepWatch(600, 60, 30))
  watchdog.build("/job:worker/task:1"); watchdog.bind(session); watchdog.start()
  run_args = watchdog.before_step()
  with watchdog.step():
    session.run(train_op)
"""

import contextlib
import threading
import time
from typing import Callable, Hashable, Iterator, Optional

import tensorflow as tf

from hooks import log as logging
from hooks.faults.process_exit import exit_process
from hooks.faults.step_watch import StepWatch
from hooks.faults.waiting import run_options

__all__ = ["StuckStepWatchdog", "EXIT_STATUS", "LOST_AFTER_SECS"]

EXIT_STATUS = 1
LOST_AFTER_SECS = 30.0  # A step's partitions are issued within this (registration included).
_FLAG = "--epochsync_step_timeout_secs"
_PROBE_TIMEOUT_SECS = 5.0
_v1 = tf.compat.v1


class StuckStepWatchdog:
  """See the module docstring. `exit_fn(status)` ends the process (tests inject one)."""

  def __init__(self, task_name: str, watch: Optional[StepWatch] = None,
               lost_after_secs: float = LOST_AFTER_SECS,
               exit_fn: Optional[Callable[[int], None]] = None):
    self.task_name, self._watch = task_name, watch
    self._step_started: Optional[float] = None  # time.monotonic() of the running step's start
    self._lost_after = lost_after_secs
    self._exit = exit_fn or exit_process
    timeouts = [lost_after_secs] + ([watch.timeout_secs] if watch else [])
    self._poll_secs = min([1.0] + [t / 10 for t in timeouts])
    self._number, self._probed = 0, 0
    self._kinds: set = set()  # the kinds of step (fetches, feeds) run before: registered
    self._first_of_kind = False
    self._session = self._mark = self._marker = self._token = None
    self._stop = threading.Event()
    self._thread: Optional[threading.Thread] = None

  def build(self, device: str) -> None:
    """The step marker: a local variable on `device` (this task) that each step sets."""
    with _v1.device(device), tf.name_scope("epochsync_step_marker"):
      self._marker = _v1.Variable(0, trainable=False, dtype=tf.int64, name="started",
                                  collections=[_v1.GraphKeys.LOCAL_VARIABLES], use_resource=False)
      self._token = _v1.placeholder(tf.int64, [], "step")
      self._mark = self._marker.assign(self._token)

  def bind(self, session) -> None:
    """The session the probes read the marker through."""
    self._session = session

  def before_step(self) -> Optional[_v1.train.SessionRunArgs]:
    """The next step's marker: run it with the step (a hook's before_run returns this)."""
    self._number += 1
    if self._mark is None:
      return None
    return _v1.train.SessionRunArgs(self._mark, feed_dict={self._token: self._number})

  @contextlib.contextmanager
  def step(self, kind: Hashable = None) -> Iterator[None]:
    """Watches the run inside the `with` block as the current step, of `kind` (e.g. the names
    of its fetches and feeds; the first step of a kind is not checked for being lost)."""
    self._first_of_kind = kind not in self._kinds
    self._kinds.add(kind)
    self._step_started = time.monotonic()
    if self._watch is not None:
      self._watch.start()
    try:
      yield
    finally:
      self._step_started = None
      if self._watch is not None:
        self._watch.finish()

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

  def _run(self, stop: threading.Event) -> None:
    while not stop.wait(self._poll_secs):
      if self._lost() or self._too_long():
        self._exit(EXIT_STATUS)
        return

  def _lost(self) -> bool:
    """Whether the running step's partition here never started (its marker is behind)."""
    started_at, number = self._step_started, self._number
    waited = None if started_at is None else time.monotonic() - started_at
    if (waited is None or waited < self._lost_after or self._probed == number or
        self._first_of_kind):
      return False
    started = self._read_marker()
    if started is None:
      return False  # The probe failed (a busy task): try again next poll.
    self._probed = number
    if started == number:
      return False  # It started here: only slow (the timeouts bound it).
    logging.error(
        "%s: step %d of this task has been in TensorFlow's session.run for %.0f s and its part "
        "on this task never started: TensorFlow rejected it as a duplicate RunGraph request and "
        "lost the cancellation of its other partitions (see docs/reliability.md), so the run can "
        "never end. This process ends now (exit status %d); restart the job (every task): it "
        "resumes from its newest checkpoint", self.task_name, number, waited, EXIT_STATUS)
    return True

  def _read_marker(self) -> Optional[int]:
    if self._session is None or self._marker is None:
      return None
    try:
      return int(self._session.run(self._marker, options=run_options(_PROBE_TIMEOUT_SECS)))
    except Exception:  # pylint: disable=broad-except
      return None

  def _too_long(self) -> bool:
    """Warns about, or times out, an asynchronous step (`watch`)."""
    due = self._watch.due() if self._watch is not None else None
    if due is None:
      return False
    waited, timed_out = due
    if not timed_out:
      logging.warning("%s: step %d of this task has been in TensorFlow's session.run for "
                      "%.0f s; an asynchronous step waits for no other task (this process "
                      "ends at %.0f s, %s)", self.task_name, self._number, waited,
                      self._watch.timeout_secs, _FLAG)
      return False
    logging.error(
        "%s: step %d of this task has been in TensorFlow's session.run for %.0f s, and an "
        "asynchronous step waits for no other task: TensorFlow lost this run (a RunGraph "
        "rejected as a duplicate whose cancellation never reached the other partitions; "
        "see docs/reliability.md) and nothing can end it, so this process ends now (exit "
        "status %d). Restart the job (every task): it resumes from its newest checkpoint. "
        "If a healthy step can take this long, raise %s", self.task_name, self._number,
        waited, EXIT_STATUS, _FLAG)
    return True
