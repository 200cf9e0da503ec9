"""How a task waits at an epoch barrier: a deadline that moves with the others' progress.

While a barrier's blocking run waits in its thread (`hooks.faults.waiting.BackgroundRun`), the
waiting task reads every second who arrived and how far the tasks it waits for are (their
heartbeats), moves the deadline to `timeout` after the last progress of one of them, probes
them (with a liveness monitor), logs who is missing every `log_every_secs`, and at the
deadline raises BarrierTimeoutError naming them.

Typical usage (inside EpochBarrierHook):
  waiter = BarrierWaiter(worker_names, worker_id, heartbeat, liveness, warn_after_secs=60,
                         log_every_secs=30)
  wait = Wait("epoch_end", seq=3, epoch=1, start=time.monotonic(), timeout=1800)
  if not waiter.wait(session, call, wait, arrived_op, on_died=abort):
    waiter.fail(wait, waiter.missing(session, arrived_op, wait.seq))
"""

import dataclasses
import time
from typing import Callable, List, Optional, Sequence

import tensorflow as tf

from hooks import log as logging
from hooks.config.settings import MIN_LOG_EVERY_SECS
from hooks.errors import BarrierTimeoutError, TaskDiedError
from hooks.faults.heartbeat import Heartbeat, ProgressWatch
from hooks.faults.liveness import LivenessMonitor
from hooks.faults.waiting import BackgroundRun, run_options

__all__ = ["BarrierWaiter", "Wait"]

_READ_TIMEOUT_SECS = 5.0  # The read of who arrived, for a log line or an error message.
_ABORT_GRACE_SECS = 2.0  # A worker outwaits its deadline by this much for the chief's abort.
_POLL_SECS = 1.0  # How often a wait reads who arrived and how far the others are.


@dataclasses.dataclass(frozen=True)
class Wait:
  """One task's wait at one barrier: which, and its deadline on the monotonic clock."""
  barrier: str
  seq: int
  epoch: int
  start: float
  timeout: float

  @property
  def deadline(self) -> float:
    return self.start + self.timeout

  @property
  def where(self) -> str:
    return f'at barrier "{self.barrier}" in epoch {self.epoch}'


class BarrierWaiter:
  """One task's waits at the barriers; see the module docstring.

  Args:
    worker_names: task names by worker id; id 0 is the chief.
    worker_id: this task's id.
    heartbeat: this task's `Heartbeat` (its reader gives the others' progress).
    liveness: a `LivenessMonitor`, or None (timeouts only).
    warn_after_secs: a wait without progress longer than this logs WARNING.
    log_every_secs: period of the "still waiting" lines.
  """

  def __init__(self, worker_names: Sequence[str], worker_id: int, heartbeat: Heartbeat,
               liveness: Optional[LivenessMonitor], warn_after_secs: float,
               log_every_secs: float):
    self.worker_names = tuple(worker_names)
    self.task_name = self.worker_names[worker_id]
    self.is_chief = worker_id == 0
    self._heartbeat, self._liveness = heartbeat, liveness
    self._warn_after_secs, self._log_every_secs = warn_after_secs, log_every_secs
    self._watch: Optional[ProgressWatch] = None

  @property
  def abort_grace_secs(self) -> float:
    """How long a worker outwaits its deadline for the chief's abort."""
    return 0.0 if self.is_chief else _ABORT_GRACE_SECS

  def wait(self, session, call: BackgroundRun, wait: Wait, arrived: tf.Tensor,
           on_died: Callable[[], None]) -> bool:
    """Waits for `call`, logging who is missing every log period; False at the deadline.

    Every second it reads who arrived (`arrived`: the barrier each worker last arrived at)
    and how far the tasks it waits for are (the missing ones; a worker also the chief, which
    saves before it releases): whenever one of them moved, the deadline moves to `timeout`
    after that. With a liveness monitor it also probes them; a dead one ends the wait with
    TaskDiedError (after `on_died()`: the chief releases the others with an abort).
    """
    tick = min(self._log_every_secs, _POLL_SECS)
    peers: List[str] = []
    if self._liveness:
      tick = min(tick, self._liveness.period_secs)
      ps = [n for n in sorted(self._liveness.addresses) if n.startswith("ps:")]
      peers = [n for n in self.worker_names if n != self.task_name] if self.is_chief else [
          self.worker_names[0]]
      peers = [n for n in peers + ps if n in self._liveness.addresses]
    next_log = self._log_every_secs
    watch = self._watch = ProgressWatch(self._heartbeat.reader(session), self.worker_names)

    def on_tick(waited: float) -> None:
      nonlocal next_log
      if peers and waited >= self._liveness.period_secs:
        try:
          self._liveness.check(peers, wait.where)
        except TaskDiedError:
          if self.is_chief:
            on_died()
          raise
      missing = self.missing(session, arrived, wait.seq)
      awaited = self._awaited(missing)
      stalled = watch.observe(awaited)
      call.extend(time.monotonic() - stalled + wait.timeout + self.abort_grace_secs)
      if waited >= next_log:
        next_log = waited + self._log_every_secs
        level = logging.WARNING if stalled > self._warn_after_secs else logging.INFO
        logging.log(level, "%s still waiting at %s, epoch %d, after %.0f s (%.0f s without "
                    "progress): %s; %s", self.task_name, wait.barrier, wait.epoch, waited,
                    stalled, self.who(missing), watch.describe(awaited))
    return call.wait_until_deadline(tick, on_tick)

  def _awaited(self, missing: Optional[List[str]]) -> List[int]:
    """The worker ids this wait depends on: the missing ones, and for a worker the chief."""
    names = list(missing or [])
    if not self.is_chief and self.worker_names[0] not in names:
      names.append(self.worker_names[0])
    return [self.worker_names.index(n) for n in names if n != self.task_name]

  def missing(self, session, arrived: tf.Tensor, seq: int) -> Optional[List[str]]:
    """The tasks that have not arrived at barrier `seq`, or None if the ps did not answer."""
    try:
      values = session.run(arrived, options=run_options(_READ_TIMEOUT_SECS))
    except tf.errors.OpError as e:
      logging.warning("%s could not read who arrived from the ps: %s", self.task_name,
                      e.message)
      return None
    return [n for n, s in zip(self.worker_names, values) if s < seq]

  def who(self, missing: Optional[List[str]]) -> str:
    """"2/3 arrived; missing worker:2" (or who the ps did not name, or the release awaited)."""
    n = len(self.worker_names)
    if missing is None:
      return "the ps did not say who arrived (check the ps tasks' logs)"
    return (f"{n - len(missing)}/{n} arrived; "
            + (f"missing {', '.join(missing)}" if missing else
               f"waiting for {self.worker_names[0]} to release them"))

  def fail(self, wait: Wait, missing: Optional[List[str]], why: str = ""):
    """Raises BarrierTimeoutError naming the barrier, the epoch and who is missing."""
    n = len(self.worker_names)
    flag = ("--epochsync_startup_timeout_secs" if wait.barrier == "start"
            else "--epochsync_barrier_timeout_secs")
    named = self._watch.stuck if self._watch is not None else list  # + their last step
    if missing:
      who = (f"{n - len(missing)}/{n} arrived; missing "
             f"{', '.join(named(missing))} (check their logs or raise {flag})")
    elif missing is None:
      who = self.who(missing)
    else:
      who = (f"{n}/{n} arrived; "
             f"{named([self.worker_names[0]])[0]} did not release them (check its log)")
    message = (f'barrier "{wait.barrier}" timed out after {time.monotonic() - wait.start:.0f} s, '
               f"the last {wait.timeout:g} s without progress of the tasks it waits for "
               f"(limit {wait.timeout:g} s) in epoch {wait.epoch} on {self.task_name}: {why}{who}")
    logging.error(message)
    raise BarrierTimeoutError(message, missing or ())


def timing_problems(timeout_secs: float, startup_timeout_secs: float, warn_after_secs: float,
                    log_every_secs: float) -> List[str]:
  """What is wrong with the barrier's seconds, one entry per problem (none: [])."""
  if min(timeout_secs, startup_timeout_secs, warn_after_secs, log_every_secs) <= 0:
    return ["timeout_secs, startup_timeout_secs, warn_after_secs and log_every_secs must be > 0 "
            "(--epochsync_barrier_timeout_secs, ...)"]
  if log_every_secs < MIN_LOG_EVERY_SECS:
    return [f"log_every_secs={log_every_secs!r} must be >= {MIN_LOG_EVERY_SECS} "
            "(--epochsync_log_every_secs): more than one line per millisecond helps nobody"]
  return []
