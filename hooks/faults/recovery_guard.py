"""Keeps TensorFlow's own MonitoredSession from recovering an epoch-synchronized task silently.

MonitoredSession answers UNAVAILABLE/ABORTED by re-creating its session, in a loop no hook
sees: against a dead ps its CreateSession fails every few milliseconds forever, and a worker
whose chief died waits in WorkerSessionCreator's 30 s poll for up to `max_wait_secs` (7200 s
in MonitoredTrainingSession). tf-epochsync's own session creators refuse a second session; with
TensorFlow's creators this hook does it: a re-created session raises TaskDiedError (naming the
dead or restarted task) from `after_create_session`, and a watcher thread, which outlives the
session it watches, ends the process when the session's thread is held by TensorFlow's session
recovery (or close) while a task it needs is dead or restarted, or when TensorFlow's first
session creation waits past the start-up timeout for a task it needs that never came up.

Typical usage (epoch_sync_hooks() puts it first):
  guard = RecoveryGuardHook(monitor_for(config), config.task_name, ["ps:0", "worker:0"])
  with tf.compat.v1.train.MonitoredTrainingSession(..., hooks=[guard, start, ...]) as sess: ...
"""

import atexit
import sys
import threading
import time
import weakref
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import tensorflow as tf

from hooks import log as logging
from hooks.errors import EpochSyncError, StartupTimeoutError
from hooks.faults.liveness import LivenessMonitor
from hooks.faults.waiting import run_options
from hooks.faults.lost_session import describe_lost_session, lost_session_log
from hooks.faults.process_exit import exit_after, exit_process, where
from hooks.faults.step_retry import retry_duplicate_steps
from hooks.faults.stuck_step import StuckStepWatchdog

__all__ = ["RecoveryGuardHook", "GRACE_SECS", "EXIT_STATUS"]

GRACE_SECS = 2.0  # After a death is found, the session's thread has this long to end by itself.
EXIT_STATUS = 1
_POLL_SECS = 0.1
_READ_STEP_TIMEOUT_SECS = 2.0  # the global step read for the lost session's WARNING
_RECREATED = "when TensorFlow's MonitoredSession re-created its lost session"
_GUARDS: "weakref.WeakSet[RecoveryGuardHook]" = weakref.WeakSet()  # armed by a MonitoredSession
_SPINNING = ("in TensorFlow's session recovery (MonitoredSession re-creating or closing its "
             "session)")


class RecoveryGuardHook(tf.compat.v1.train.SessionRunHook):
  """Refuses a re-created session; ends the process if TensorFlow's recovery spins on a death.

    guard = RecoveryGuardHook(monitor_for(config), "worker:1", ["ps:0", "ps:1", "worker:0"])
    hooks = [guard, run_start_hook, ...]     # first: it must see a re-created session first

  Args:
    liveness: the task's `LivenessMonitor`.
    task_name: `str`, this task, for messages.
    watched: task names whose death ends a stuck recovery (epoch_sync_hooks: every task).
      Probed once a period while no session is live (at start-up, in a recovery), so that
      each task's first answer is known before it can die.
    grace_secs: `float`, how long the session's thread may stay in TensorFlow's recovery
      after a death is found before the process is ended.
    exit_fn: `Callable[[int], None]`, ends the process (tests inject one); default os._exit
      after flushing the logs.
    startup_timeout_secs: `float`, how long TensorFlow's first session creation may wait for
      a task of `needed` that never answered before the process is ended.
    needed: the tasks TensorFlow's session creation waits for (default: the ps tasks among
      `watched`; epoch_sync_hooks adds the chief on a worker). A session reached them, so once
      one existed, such a task that is down has died even if no probe here saw it up.
    stuck_step: a `StuckStepWatchdog` that watches every step's run: a step TensorFlow lost
      (and, in an asynchronous job, one past the step timeout) ends the process.
  """

  def __init__(self, liveness: LivenessMonitor, task_name: str, watched: Sequence[str],
               grace_secs: float = GRACE_SECS, exit_fn: Optional[Callable[[int], None]] = None,
               cap_fn: Optional[Callable[[float], None]] = None,
               startup_timeout_secs: float = 600.0, needed: Optional[Sequence[str]] = None,
               stuck_step: Optional[StuckStepWatchdog] = None):
    self._liveness, self._task = liveness, task_name
    self._watched = [n for n in watched if n in liveness.addresses and n != task_name]
    self._needed = [n for n in self._watched if n.startswith("ps:")] if needed is None else [
        n for n in needed if n in self._watched]
    self._grace, self._exit = grace_secs, exit_fn or exit_process
    self._cap, self._startup_timeout = cap_fn or exit_after, startup_timeout_secs
    self._stop = threading.Event()
    self._thread: Optional[threading.Thread] = None
    self._sessions, self._coord = 0, None
    self._global_step, self._lost = None, lost_session_log()
    self._stuck_step = stuck_step

  def begin(self) -> None:
    self._stop_watcher()
    self._sessions, self._coord = 0, None
    self._global_step = tf.compat.v1.train.get_global_step()
    self._lost.clear()
    if self._stuck_step is not None:
      job, index = self._task.split(":")
      self._stuck_step.build(f"/job:{job}/task:{index}")
    if not where(sys._getframe())[1]:  # pylint: disable=protected-access
      return  # not called by a MonitoredSession: there is no recovery to guard
    self._stop = threading.Event()
    _GUARDS.add(self)
    self._thread = threading.Thread(target=self._watch, args=(threading.get_ident(), self._stop),
                                    daemon=True, name=f"epochsync-recovery-guard-{self._task}")
    self._thread.start()

  def after_create_session(self, session, coord) -> None:
    self._sessions += 1
    self._coord = coord
    retry_duplicate_steps(session, self._task, self._stuck_step)
    if self._stuck_step is not None:
      self._stuck_step.bind(session)
      self._stuck_step.start()
    if self._sessions > 1:
      self._stop_watcher()  # this thread raises now: nothing is left to end
      steps = self._lost.steps()
      cause = describe_lost_session(self._task, self._read_global_step(session))
      self._liveness.raise_if_any_died(_RECREATED)
      raise EpochSyncError(
          f"{self._task}: TensorFlow's MonitoredSession re-created its lost session (lost in "
          f"step {steps} of this task), every task still alive with the incarnation it "
          f"had (a transient error: {cause}), and epoch-synchronized training cannot "
          "resume on one task alone: restart the whole job (every task) from the same "
          "model_dir; it resumes from its newest checkpoint")

  def before_run(self, run_context):
    self._lost.count_step()
    return self._stuck_step.before_step() if self._stuck_step is not None else None

  def _read_global_step(self, session) -> Optional[int]:
    """The global step read through the re-created session, or None if it cannot be read."""
    if self._global_step is None:
      return None
    try:
      return int(session.run(self._global_step, options=run_options(_READ_STEP_TIMEOUT_SECS)))
    except Exception:  # pylint: disable=broad-except
      return None

  def end(self, session) -> None:
    # A stop requested with an error (the sync hook's thread found a task dead) that
    # MonitoredSession's should_stop() swallowed also ends the session through end(): the
    # other hooks' end() and the close of a session spanning the dead task follow, so the
    # watcher and the cap at exit stay armed.
    if not _failing(self._coord):
      self._stop_watcher()

  def _stop_watcher(self) -> None:
    self._stop.set()
    if self._stuck_step is not None:
      self._stuck_step.stop()
    _GUARDS.discard(self)

  def at_exit(self) -> None:
    """At interpreter exit after a lost session (no end()), with a task it needs dead: caps
    the teardown at `grace_secs` (Python's teardown of a session whose graph spans a dead ps
    waits for it, 7-9 s measured), by faulthandler's watchdog, which runs without the GIL."""
    if not self._sessions or self._stop.is_set():
      return
    dead = self._liveness.dead(self._watched, known_up=self._needed)
    if dead:
      logging.info("%s exits after losing its session; %s gone: it ends within %g s even if "
                   "TensorFlow's teardown waits for it", self._task,
                   ", ".join(n for n, _ in dead), self._grace)
      self._cap(self._grace)

  # --- the watcher thread --------------------------------------------------------------

  def _watch(self, thread_id: int, stop: threading.Event) -> None:
    """Probes while no session is live; ends the process if a death holds TF's recovery, or
    if TF's first session creation waits past the start-up timeout for a task never seen."""
    dead: List[Tuple[str, str]] = []
    found: Dict[str, float] = {}  # when each dead task was first found dead
    dead_since: Optional[float] = None
    started, next_probe = time.monotonic(), 0.0
    while not stop.wait(_POLL_SECS):
      frame = sys._current_frames().get(thread_id)  # pylint: disable=protected-access
      coord = self._coord
      live = coord is not None and not coord.joined
      in_tf, in_monitored = where(frame) if frame is not None else (False, False)
      if not in_monitored and not live:
        return  # the session was closed for good, or its creation given up
      now = time.monotonic()
      if (in_tf or not live) and now >= next_probe:
        next_probe = now + self._liveness.period_secs
        dead = self._probe_dead()
        for name, _ in dead:
          found.setdefault(name, now)
      if not in_tf or not dead:
        dead_since = None
      elif dead_since is None:
        dead_since = now
      if stop.is_set():
        return
      if dead_since is not None and now - dead_since >= self._grace:
        return self._end_process(dead, found)
      if coord is None and in_tf and now - started >= self._startup_timeout:
        never = self._liveness.never_answered(self._needed)
        if never:
          return self._give_up_at_start(never)

  def _probe_dead(self) -> List[Tuple[str, str]]:
    """The dead tasks; a probe's own failure is logged, never the end of the watcher."""
    try:
      return self._liveness.dead(self._watched, known_up=self._needed if self._sessions else ())
    except Exception as e:  # pylint: disable=broad-except
      logging.warning("%s: probing the tasks failed (%s: %s); probing again in %g s",
                      self._task, type(e).__name__, e, self._liveness.period_secs)
      return []

  def _end_process(self, dead: List[Tuple[str, str]], found: Dict[str, float]) -> None:
    """Names the root cause: a dead ps first (the others fail because of it), else the task
    found dead first (the chief exits after a worker it names), then ends the process."""
    self._stop.set()
    name, why = min(dead, key=lambda d: (not d[0].startswith("ps:"), found.get(d[0], 0), d[0]))
    error = self._liveness.died(name, why, _SPINNING)
    logging.error("%s ends this process with exit status %d (TaskDiedError above): %s is gone "
                  "and TensorFlow would wait for it", self._task, EXIT_STATUS, error.task)
    self._exit(EXIT_STATUS)

  def _give_up_at_start(self, never: List[str]) -> None:
    self._stop.set()
    error = StartupTimeoutError(
        f"{self._task} gave up creating its session after {self._startup_timeout:g} s: "
        f"{', '.join(never)} never came up (TensorFlow's session creation waits for "
        f"{'them' if len(never) > 1 else 'it'} without a deadline); start "
        f"{'them' if len(never) > 1 else 'it'}, check the addresses in TF_CONFIG, or raise "
        "--epochsync_startup_timeout_secs", never)
    logging.error("%s", error)
    logging.error("%s ends this process with exit status %d (StartupTimeoutError above)",
                  self._task, EXIT_STATUS)
    self._exit(EXIT_STATUS)


def _failing(coord) -> bool:
  """Whether the session's coordinator holds an error (raise_requested_exception leaves it)."""
  try:
    if coord is not None:
      coord.raise_requested_exception()
  except Exception:  # pylint: disable=broad-except
    return True
  return False


@atexit.register
def _at_exit() -> None:
  for guard in list(_GUARDS):
    guard.at_exit()
