"""Blocking `session.run` calls that the caller can log about and give up on without cancelling.

A dequeue cancelled by a `RunOptions` deadline can lose the element it took: the ps has
already removed it from the queue when the cancelled `RecvTensor` drops it. So a wait that
must log or enforce a deadline while it blocks runs the blocking call in a thread of its own,
with a run deadline `grace_secs` after the caller's. The caller ticks (logs) while it waits
and, at its deadline, abandons the call: the job is failing then, so what a late cancellation
drops no longer matters. On the normal path no blocking call is ever cancelled.

Typical usage:
  call = BackgroundRun(session, release_q.dequeue(), deadline=time.monotonic() + 600)
  if not call.wait_until_deadline(tick_secs=30, on_tick=log_who_is_missing):
    raise BarrierTimeoutError(...)       # the deadline passed; the call is abandoned
  value = call.result()
"""

import queue
import threading
import time
from typing import Any, Callable, Optional

import tensorflow as tf

__all__ = ["BackgroundRun", "GRACE_SECS", "MAX_WAIT_SECS", "RunThread", "run_options",
           "run_uncancelled"]

# A background call's own run deadline comes this long after the caller's deadline, so the
# caller always gives up first and only an abandoned call is ever cancelled.
GRACE_SECS = 5.0
# The own deadline of a blocking run whose wait is bounded by the progress of the tasks it
# waits for (hooks.faults.heartbeat) instead: the waiting task gives up earlier, when they stall.
MAX_WAIT_SECS = 7 * 24 * 3600.0


def run_options(timeout_secs: float) -> tf.compat.v1.RunOptions:
  """RunOptions with a deadline of `timeout_secs` (at least 1 ms)."""
  return tf.compat.v1.RunOptions(timeout_in_ms=max(1, int(timeout_secs * 1000)))


def run_uncancelled(session, fetches: Any, feed_dict=None, wait_secs: float = 30.0) -> Any:
  """session.run(fetches) that the caller gives up on after `wait_secs` without cancelling it:
  DeadlineExceededError then, and the run goes on to its end in its thread.

    unit, skip = run_uncancelled(session, claim_op, feeds, wait_secs=30)

  For a run in a `tf.CriticalSection` (the work queue's lock): TensorFlow's lock lets two runs
  in at once after a run waiting for it is cancelled (docs/reliability.md, "The work queue's
  lock"). A caller that runs it again gets its answer from the queue (a claim, a join and a
  reclaim are answered once).
  """
  call = BackgroundRun(session, fetches, time.monotonic() + wait_secs, feed_dict,
                       run_timeout_secs=MAX_WAIT_SECS, name="epochsync-locked-run")
  if not call.wait_until_deadline(tick_secs=wait_secs):
    raise tf.errors.DeadlineExceededError(
        None, None, f"no answer in {wait_secs:.3g} s (the run was left to end: a run in the "
        "work queue's lock is never cancelled)")
  return call.result()


class RunThread:
  """One daemon thread that runs the `session.run` calls handed to it, one after another, with
  no deadline: a caller may stop waiting for one without cancelling it. For a hot path (a
  worker's claims): cheaper than BackgroundRun's thread per run.

    runs = RunThread("epochsync-claim")
    call = runs.submit(session, claim_op, feeds)
    if call.wait(30):
      unit, skip = call.result()

  A call submitted while an earlier one still runs waits for it.
  """

  def __init__(self, name: str, idle_secs: float = 30.0):
    self._calls: "queue.Queue" = queue.Queue()
    self._name, self._idle_secs = name, idle_secs
    self._lock = threading.Lock()
    self._thread: Optional[threading.Thread] = None  # ends after idle_secs without a call

  def submit(self, session, fetches: Any, feed_dict=None) -> "_Call":
    call = _Call()
    with self._lock:
      self._calls.put((call, session, fetches, feed_dict))
      if self._thread is None:
        self._thread = threading.Thread(target=self._serve, daemon=True, name=self._name)
        self._thread.start()
    return call

  def _serve(self) -> None:
    options = run_options(MAX_WAIT_SECS)
    while True:  # Bounded: it ends after idle_secs without a call.
      try:
        call, session, fetches, feed_dict = self._calls.get(timeout=self._idle_secs)
      except queue.Empty:
        with self._lock:
          if self._calls.empty():
            self._thread = None
            return
        continue
      call.run(session, fetches, feed_dict, options)
      del call, session, fetches, feed_dict  # no reference kept while idle


class _Call:
  """One `session.run` in another thread (RunThread's, BackgroundRun's): `run` keeps its value
  or its error; `wait(secs)` -> whether it ended; `result()` its value, or raises its error."""

  def __init__(self):
    self.done = threading.Event()
    self.value: Any = None
    self.error: Optional[BaseException] = None

  def run(self, session, fetches, feed_dict, options) -> None:
    try:
      self.value = session.run(fetches, feed_dict=feed_dict, options=options)
    except BaseException as e:  # pylint: disable=broad-except; handed to result()'s caller
      self.error = e
    finally:
      self.done.set()

  def wait(self, secs: float) -> bool:
    return self.done.wait(secs)

  def result(self) -> Any:
    if self.error is not None:
      raise self.error
    return self.value


class BackgroundRun:
  """One `session.run(fetches)` in a daemon thread, waited on with ticks and a deadline.

    call = BackgroundRun(session, dequeue_op, deadline=time.monotonic() + 600)
    if call.wait_until_deadline(tick_secs=30, on_tick=lambda waited: log(waited)):
      value = call.result()

  Args:
    session: a `tf.compat.v1.Session` (runs from several threads are safe).
    fetches: what to run, as for `session.run`.
    deadline: `float`, the caller's deadline on `clock`.
    feed_dict: as for `session.run`.
    grace_secs: `float`, the run's own deadline is `deadline + grace_secs`.
    clock: `Callable[[], float]`, monotonic seconds (tests inject one).
    name: `str`, the thread's name.
    run_timeout_secs: `float`, the run's own deadline from now when the caller may move its
      deadline later (`extend`); default: `deadline + grace_secs`.
  """

  def __init__(self, session, fetches: Any, deadline: float, feed_dict=None,
               grace_secs: float = GRACE_SECS, clock: Callable[[], float] = time.monotonic,
               name: str = "epochsync-wait", run_timeout_secs: Optional[float] = None):
    self._clock, self._deadline = clock, deadline
    self._call = _Call()
    if run_timeout_secs is None:
      run_timeout_secs = max(0.0, deadline - clock()) + grace_secs
    options = run_options(run_timeout_secs)
    self._thread = threading.Thread(
        target=self._call.run, args=(session, fetches, feed_dict, options), daemon=True,
        name=name)
    self._thread.start()

  def extend(self, deadline: float) -> None:
    """Moves the caller's deadline (e.g. while the tasks it waits for make progress)."""
    self._deadline = deadline

  @property
  def done(self) -> bool:
    return self._call.done.is_set()

  def wait_until_deadline(self, tick_secs: float,
                          on_tick: Callable[[float], None] = lambda waited: None) -> bool:
    """Blocks until the call ends (True) or the deadline passes (False, the call is abandoned).

    Calls `on_tick(seconds waited)` every `tick_secs` while the call runs. An exception from
    `on_tick` propagates (the call is then abandoned too).
    """
    start = self._clock()
    remaining = self._deadline - start
    while remaining > 0 and not self._call.wait(min(tick_secs, remaining)):
      remaining = self._deadline - self._clock()
      if remaining > 0:
        on_tick(self._clock() - start)
    return self._call.done.is_set()

  def result(self) -> Any:
    """The run's value, or re-raises its error; call only after the call ended."""
    if not self._call.done.is_set():
      raise RuntimeError("BackgroundRun.result() called before the run ended")
    return self._call.result()
