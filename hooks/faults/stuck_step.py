"""Finds a training step that TensorFlow lost, runs it again, and ends a step that never ends.

TensorFlow loses a run now and then: one of its RunGraph requests is rejected as a duplicate
(docs/reliability.md, "A step rejected as a duplicate request") and the cancellation never
reaches the run's other partitions, which wait for ever; nothing ends such a run (closing the
session waits for it). The watchdog finds it two ways:

- **Lost** (every job): each step also sets a local marker to its number, the first thing its
  partition on this task does once every gated task's partition started (EpochInput's step
  gate: hooks.data.step_gate). A step still running after `lost_after_secs` whose marker is
  behind never started here or on a gated task: TensorFlow rejected that part and lost the
  cancellation of the rest, and nothing of the step ran (every stateful op of a step waits for
  the gate).
  The step's run is on a runner thread (hooks.faults.step_runner): the watchdog leaves it
  behind, with a WARNING, and the step runs again, up to `MAX_LOST` times; then, or if the
  step ran on the caller's thread, it logs an ERROR naming the step and ends the process
  (exit status 1), and the restarted job resumes from its newest checkpoint. A step whose
  marker is set is only slow and is left alone, and so is the first step of each kind (its
  fetches and feeds): TensorFlow partitions and registers its graph on every task before it
  starts any partition, which can take long for a large graph.
- **Too long** (an asynchronous job, `watch` given): an asynchronous step waits for no other
  task, so one still running at `step_timeout_secs` is lost too; a WARNING comes after
  `warn_after_secs`, then every `log_every_secs`, and at the timeout the process ends.

Typical usage (RecoveryGuardHook does it: build in begin(), before_step() in before_run()):
  watchdog = StuckStepWatchdog("worker:1", watch=StepWatch(600, 60, 30))
  watchdog.build("/job:worker/task:1"); watchdog.bind(session); watchdog.start()
  run_args = watchdog.before_step()
  with watchdog.step():
    watchdog.run(lambda: session.run(train_op))  # LostRunError: run the step again
"""

import contextlib
import threading
import time
from typing import Any, Callable, Hashable, Iterator, Optional

import tensorflow as tf

from hooks import graph_keys
from hooks import log as logging
from hooks.faults.process_exit import exit_process
from hooks.faults.step_runner import (LostRunError, RunCall, StepRunner, leave_behind,
                                      runs_left_behind)
from hooks.faults.step_watch import StepWatch
from hooks.faults.waiting import run_options

__all__ = ["StuckStepWatchdog", "LostRunError", "EXIT_STATUS", "LOST_AFTER_SECS", "MAX_LOST"]

EXIT_STATUS = 1
LOST_AFTER_SECS = 30.0  # A step's partitions are issued within this (registration included).
MAX_LOST = 3  # times one step's run is left behind and run again before the process ends
_FLAG = "--epochsync_step_timeout_secs"
_PROBE_TIMEOUT_SECS = 5.0
# A poll this much later than due: the process did not run meanwhile (SIGSTOP, a pause of the
# whole process). That time is not the step's: its clock restarts (an elastic job's chief may
# have fenced this worker meanwhile; its next step then fails at the work queue's gate).
_FROZEN_GAP_SECS = 5.0
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
    self._number, self._attempt, self._probed = 0, 0, None
    self._lost_runs = 0  # runs of the current step left behind
    self._runner = StepRunner(task_name, self._came_back)
    self._call: Optional[RunCall] = None
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
    # Set once every gated task's part of the step started too (hooks.data.step_gate).
    graph = _v1.get_default_graph()
    graph.add_to_collection(graph_keys.STEP_MARKERS, self._mark.op)
    gates = graph.get_collection(graph_keys.STEP_GATES)
    if gates:
      self._mark.op._add_control_inputs(gates)  # pylint: disable=protected-access

  def bind(self, session) -> None:
    """The session the probes read the marker through."""
    self._session = session

  def before_step(self) -> Optional[_v1.train.SessionRunArgs]:
    """The next step's marker: run it with the step (a hook's before_run returns this)."""
    self._number += 1
    self._lost_runs = 0
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

  def run(self, fn: Callable[[], Any]) -> Any:
    """fn() (the step's session.run, inside `step()`) on the runner thread: its result or error,
    or LostRunError if the run was lost and left behind (nothing of the step ran: run it again)."""
    self._attempt += 1
    self._step_started = time.monotonic()  # each run of the step is judged from its own start
    call = self._call = self._runner.submit(fn)
    try:
      return call.wait_for_run()
    finally:
      self._call = None

  @property
  def lost_runs_left_behind(self) -> int:
    """Runs of the bound session left behind so far (step_runner.runs_left_behind)."""
    return runs_left_behind(self._session)

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
    self._runner.stop()

  def _run(self, stop: threading.Event) -> None:
    polled = time.monotonic()
    while not stop.wait(self._poll_secs):
      now = time.monotonic()
      gap, polled = now - polled - self._poll_secs, now
      if gap >= _FROZEN_GAP_SECS:
        self._restart_clock(gap)
      waited = self._lost()
      if (waited is not None and not self._leave_behind(waited)) or self._too_long():
        self._exit(EXIT_STATUS)
        return

  def _restart_clock(self, gap: float) -> None:
    """The process did not run for `gap` seconds: the running step's clock restarts."""
    logging.info("%s did not run for %.0f s (frozen: SIGSTOP, a pause of the whole process); "
                 "the running step's clock restarts", self.task_name, gap)
    if self._step_started is not None:
      self._step_started = time.monotonic()
    if self._watch is not None:
      self._watch.touch()

  def _lost(self) -> Optional[float]:
    """How long the running step has waited if its partition here never started (its marker
    is behind), else None."""
    started_at, number, attempt = self._step_started, self._number, self._attempt
    waited = None if started_at is None else time.monotonic() - started_at
    if (waited is None or waited < self._lost_after or self._probed == (number, attempt) or
        self._first_of_kind):
      return None
    started = self._read_marker()
    if started is None:
      return None  # The probe failed (a busy task): try again next poll.
    self._probed = (number, attempt)
    if started == number:
      return None  # It started here: only slow (the timeouts bound it).
    return waited

  def _leave_behind(self, waited: float) -> bool:
    """Abandons the lost run so that the step runs again; False if the process must end."""
    what = (f"{self.task_name}: step {self._number} of this task has been in TensorFlow's "
            f"session.run for {waited:.0f} s and its part on this task never started, or "
            "waits for a ps part that never did: TensorFlow rejected that part as a duplicate "
            "RunGraph request and lost the cancellation of the others (see "
            "docs/reliability.md), so the run can never end")
    call = self._call
    if call is not None and self._lost_runs < MAX_LOST:
      self._lost_runs += 1
      if call.abandon(what):
        leave_behind(self._session)
        logging.warning("%s. Nothing of the step ran (every stateful op of it waits for "
                        "those parts), so it runs again (retry %d of %d); the lost run stays "
                        "blocked in TensorFlow until the process ends", what, self._lost_runs,
                        MAX_LOST)
      return True
    logging.error("%s. %s; this process ends now (exit status %d): restart the job (every "
                  "task), it resumes from its newest checkpoint", what,
                  f"The step was lost {MAX_LOST + 1} times" if call is not None else
                  "The run is on the training loop's thread", EXIT_STATUS)
    return False

  def _came_back(self, call: RunCall, value: Any, error: Optional[BaseException]) -> None:
    """A run left behind returned after all (the runner thread's callback)."""
    del call, value
    if error is not None:
      logging.info("%s: a step's run left behind as lost ended with %s: %s", self.task_name,
                   type(error).__name__, getattr(error, "message", error))
      return
    logging.error("%s: a step's run left behind as lost (its part on this task had not started "
                  "after %.0f s) came back done, after the step ran again: the step may be in "
                  "the model twice, so this process ends now (exit status %d); restart the job "
                  "(every task), it resumes from its newest checkpoint", self.task_name,
                  self._lost_after, EXIT_STATUS)
    self._exit(EXIT_STATUS)

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
