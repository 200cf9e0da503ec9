"""A reusable, bounded barrier on ps:0 at the start and at the end of every epoch.

Each non-chief worker enqueues one arrival (its epoch statistics) into a queue on ps:0 and
blocks on its own release queue; the chief dequeues the arrivals, runs its chief actions
(save the checkpoint), then releases everyone with one enqueue per worker. No task polls
with sleeps: every wait is a blocking dequeue on the PS with a deadline, re-issued every
`log_every_secs` only to log who is still missing. Barriers are numbered (start of epoch
e: 2e, end of epoch e: 2e+1) and checked, so a fast worker's next barrier is never
confused with this one.

Typical usage:
  barrier = EpochBarrierHook(epoch_input, num_workers=4, worker_id=config.worker_id,
                             timeout_secs=600, audit_dir=model_dir)
  hooks = [barrier, epoch_input.hook]
"""

import time
from typing import Callable, Dict, List, Optional, Sequence

from absl import logging
import tensorflow as tf

from hooks import audit as audit_lib
from hooks.cluster import worker_problems
from hooks.epoch_input import EpochInput, EpochListener, EpochStats
from hooks.errors import BarrierTimeoutError, ConfigError, EpochSyncError

__all__ = ["EpochBarrierHook", "ChiefAction"]

_v1 = tf.compat.v1
_ABORT = -1  # a release carrying this value means the chief gave up waiting

# fn(session, epoch, arrivals by task name) -> fields for the audit line
ChiefAction = Callable[[object, int, Dict[str, EpochStats]], Dict[str, object]]


class EpochBarrierHook(_v1.train.SessionRunHook, EpochListener):
  """Holds every worker at the start and at the end of each epoch until all have arrived.

  Worker id 0 (the chief: `chief:0`, else `worker:0`) gathers the arrivals, stores the
  completed epoch in `epochsync/completed_epochs` (so a restarted job resumes after it),
  runs its chief actions and writes the audit line, then releases the others.

    barrier = EpochBarrierHook(epoch_input, num_workers=3, worker_id=config.worker_id)
    with tf.compat.v1.train.MonitoredSession(session_creator=creator,
                                             hooks=[barrier, epoch_input.hook]) as sess:
      while not sess.should_stop(): sess.run(train_op)

  Args:
    epoch_input: `EpochInput` whose epochs this barrier separates.
    num_workers: `int`, training tasks (chief + workers).
    worker_id: `int`, this task's index in `worker_names`; 0 is the chief.
    worker_names: task names by worker id, e.g. ("chief:0", "worker:0"); for messages.
    timeout_secs: `float`, deadline of an end-of-epoch barrier.
    startup_timeout_secs: `float`, deadline of the start barrier (every worker up).
    warn_after_secs: `float`, waits longer than this log WARNING instead of INFO.
    log_every_secs: `float`, period of the "still missing" lines while waiting.
    audit_dir: where the chief appends `epochsync_epochs.jsonl`; None disables it.
    ps_device: the device holding the barrier state.

  Raises:
    ConfigError: for num_workers < 1, a worker_id out of range or non-positive seconds.
    BarrierTimeoutError: (at run time) naming the barrier, the epoch and the missing tasks.
  """

  order = 20

  def __init__(self, epoch_input: EpochInput, num_workers: int, worker_id: int,
               worker_names: Optional[Sequence[str]] = None, timeout_secs: float = 1800.0,
               startup_timeout_secs: float = 600.0, warn_after_secs: float = 60.0,
               log_every_secs: float = 30.0, audit_dir: Optional[str] = None,
               ps_device: str = "/job:ps/task:0"):
    problems = worker_problems(num_workers, worker_id, worker_names)
    if min(timeout_secs, startup_timeout_secs, warn_after_secs, log_every_secs) <= 0:
      problems.append("timeout_secs, startup_timeout_secs, warn_after_secs and log_every_secs "
                      "must be > 0 (--epochsync_barrier_timeout_secs, ...)")
    if problems:
      raise ConfigError("EpochBarrierHook: " + "; ".join(problems))
    self._input = epoch_input
    self.num_workers, self.worker_id = num_workers, worker_id
    self.worker_names = tuple(worker_names or [f"worker:{i}" for i in range(num_workers)])
    self.is_chief = worker_id == 0
    self.task_name = self.worker_names[worker_id]
    self._timeout_secs, self._startup_timeout_secs = timeout_secs, startup_timeout_secs
    self._warn_after_secs, self._log_every_secs = warn_after_secs, log_every_secs
    self._audit = audit_lib.EpochAudit(audit_dir) if audit_dir and self.is_chief else None
    self._ps_device = ps_device
    self._chief_actions: List[ChiefAction] = []
    self._arrived_at: Dict[int, float] = {}
    epoch_input.add_listener(self)

  def add_chief_action(self, action: ChiefAction) -> None:
    """Runs `action` on the chief after all workers arrived at an epoch's end, before release."""
    self._chief_actions.append(action)

  def begin(self):
    n = self.num_workers
    with _v1.device(self._ps_device), tf.name_scope("epochsync_barrier"):
      self._completed = _v1.get_variable(
          "epochsync/completed_epochs", [], tf.int64, _v1.zeros_initializer(),
          trainable=False, use_resource=False)
      self._arrived = _v1.get_variable(
          "epochsync/arrived_barrier", [n], tf.int64, _v1.constant_initializer(-1),
          trainable=False, use_resource=False)
      arrive_q = _v1.FIFOQueue(4 * n, [tf.int32, tf.int64, tf.int64, tf.int64, tf.float64],
                               shapes=[[]] * 5, shared_name="epochsync_barrier_arrive",
                               name="arrive_q")
      release_qs = [_v1.FIFOQueue(4, [tf.int64], shapes=[[]],
                                  shared_name=f"epochsync_barrier_release_{i}",
                                  name=f"release_q_{i}") for i in range(n)]
      self._seq = _v1.placeholder(tf.int64, [], "seq")
      self._stats = _v1.placeholder(tf.int64, [2], "batches_examples")
      self._started = _v1.placeholder(tf.float64, [], "started_at")
      # The chief only marks itself arrived; the others also enqueue their statistics.
      self._mark_arrived = _v1.scatter_update(self._arrived, [self.worker_id], [self._seq])
      self._arrive = tf.group(
          arrive_q.enqueue([tf.constant(self.worker_id), self._seq, self._stats[0],
                            self._stats[1], self._started]), self._mark_arrived)
      self._take_arrival = arrive_q.dequeue()
      self._release_value = _v1.placeholder(tf.int64, [], "release")
      self._release = tf.group(*[q.enqueue([self._release_value]) for q in release_qs[1:]])
      self._wait_release = release_qs[self.worker_id].dequeue()
      self._set_completed = self._completed.assign(self._seq)
    self._global_step = _v1.train.get_global_step()

  # --- EpochListener -------------------------------------------------------------------

  def start_epoch(self, session) -> int:
    return int(session.run(self._completed))

  def session_created(self, session, start_epoch: int) -> None:
    stats = EpochStats(start_epoch, 0, 0, time.time(), time.time())
    self._sync(session, "start", 2 * start_epoch, stats, self._startup_timeout_secs)

  def epoch_ended(self, session, stats: EpochStats) -> None:
    self._sync(session, "epoch_end", 2 * stats.epoch + 1, stats, self._timeout_secs)

  # --- the barrier ---------------------------------------------------------------------

  def _sync(self, session, barrier: str, seq: int, stats: EpochStats, timeout: float):
    start = time.monotonic()
    logging.info("%s waiting at %s, epoch %d", self.task_name, barrier, stats.epoch)
    if self.is_chief:
      session.run(self._mark_arrived, {self._seq: seq})
      arrivals = self._gather(session, barrier, seq, stats, start, timeout)
      fields = self._run_chief_actions(session, barrier, seq, stats.epoch, arrivals)
      audit = self._audit and barrier == "epoch_end"
      # Read while everyone is held: after the release the next epoch's steps begin.
      step = (int(session.run(self._global_step))
              if audit and self._global_step is not None else None)
      session.run(self._release, {self._release_value: seq})
      if audit:
        self._audit.write(stats.epoch, arrivals, time.time(), fields, step)
    else:
      session.run(self._arrive, {self._seq: seq, self._stats: [stats.batches, stats.examples],
                                 self._started: stats.started_at})
      self._wait_for_release(session, barrier, seq, stats.epoch, start, timeout)
    logging.info("%s passed %s, epoch %d, after %.3f s", self.task_name, barrier, stats.epoch,
                 time.monotonic() - start)

  def _gather(self, session, barrier, seq, own: EpochStats, start, timeout):
    arrivals = {self.task_name: own}
    missing = lambda: [n for n in self.worker_names if n not in arrivals]
    while len(arrivals) < self.num_workers:
      remaining = timeout - (time.monotonic() - start)
      if remaining <= 0:
        self._abort(session)
        self._fail(barrier, own.epoch, start, timeout, missing())
      try:
        worker, got_seq, batches, examples, started = session.run(
            self._take_arrival, options=_timeout(min(remaining, self._log_every_secs)))
      except tf.errors.DeadlineExceededError:
        self._log_waiting(barrier, own.epoch, start, missing())
        continue
      name = self.worker_names[worker]
      if got_seq != seq:
        self._abort(session)
        raise EpochSyncError(
            f"{name} arrived at barrier #{got_seq} while the chief waits at {barrier} #{seq} "
            f"(epoch {own.epoch}): the workers disagree on the epoch; check that every task "
            "runs the same num_epochs and restarts from the same model_dir")
      arrivals[name] = EpochStats(own.epoch, int(batches), int(examples), float(started),
                                  time.time())
    return arrivals

  def _run_chief_actions(self, session, barrier, seq, epoch, arrivals) -> Dict[str, object]:
    fields: Dict[str, object] = {}
    if barrier != "epoch_end":
      return fields
    try:
      session.run(self._set_completed, {self._seq: epoch + 1})
      for action in self._chief_actions:
        fields.update(action(session, epoch, arrivals) or {})
    except Exception:
      self._abort(session)
      raise
    return fields

  def _abort(self, session) -> None:
    """Releases every waiting worker with an abort, so each fails now instead of timing out."""
    session.run(self._release, {self._release_value: _ABORT})

  def _wait_for_release(self, session, barrier, seq, epoch, start, timeout):
    # The chief releases after its own deadline at the latest; allow one log period more.
    while time.monotonic() - start < timeout + self._log_every_secs:
      remaining = timeout + self._log_every_secs - (time.monotonic() - start)
      try:
        got = session.run(self._wait_release,
                          options=_timeout(min(remaining, self._log_every_secs)))
      except tf.errors.DeadlineExceededError:
        self._log_waiting(barrier, epoch, start, self._missing(session, seq))
        continue
      if got == seq:
        return
      if got == _ABORT:
        self._fail(barrier, epoch, start, timeout, self._missing(session, seq),
                   "the chief gave up: ")
      raise EpochSyncError(f"{self.task_name} was released from barrier #{got} while waiting "
                           f"at {barrier} #{seq} (epoch {epoch}): the workers disagree on "
                           "the epoch; check num_epochs and model_dir on every task")
    self._fail(barrier, epoch, start, timeout, self._missing(session, seq))

  def _missing(self, session, seq) -> List[str]:
    arrived = session.run(self._arrived, options=_timeout(self._log_every_secs))
    return [n for n, s in zip(self.worker_names, arrived) if s < seq]

  def _log_waiting(self, barrier, epoch, start, missing):
    waited = time.monotonic() - start
    level = logging.WARNING if waited > self._warn_after_secs else logging.INFO
    logging.log(level, "%s still waiting at %s, epoch %d, after %.0f s: %d/%d arrived; "
                "missing %s", self.task_name, barrier, epoch, waited,
                self.num_workers - len(missing), self.num_workers, ", ".join(missing))

  def _fail(self, barrier, epoch, start, timeout, missing, why=""):
    flag = ("--epochsync_startup_timeout_secs" if barrier == "start"
            else "--epochsync_barrier_timeout_secs")
    arrived = f"{self.num_workers - len(missing)}/{self.num_workers} arrived; "
    who = (f"missing {', '.join(missing)} (check their logs or raise {flag})" if missing else
           f"{self.worker_names[0]} did not release them (check its log)")
    message = (f'barrier "{barrier}" timed out after {time.monotonic() - start:.0f} s '
               f"(limit {timeout:g} s) in epoch {epoch} on {self.task_name}: {why}{arrived}{who}")
    logging.error(message)
    raise BarrierTimeoutError(message, missing)


def _timeout(secs: float):
  return _v1.RunOptions(timeout_in_ms=max(1, int(secs * 1000)))
