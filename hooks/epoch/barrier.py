"""A reusable, bounded barrier on ps:0 at the start and at the end of every epoch.

Each non-chief worker, in one run, enqueues one arrival (its epoch statistics) into a queue on
ps:0 and blocks on its own release queue; the chief takes every arrival with one blocking
`dequeue_many`, runs its chief actions (save the checkpoint), then releases everyone with one
enqueue per worker. Without chief actions the gather's own run releases them, on the ps, the
moment the last arrival is in. No task polls or sleeps, and no blocking dequeue is ever
cancelled on the normal path: each runs in a thread of its own
(`hooks.faults.waiting.BackgroundRun`) while the waiting task logs who is still missing every
`log_every_secs` (read from the idempotent `epochsync/arrived_barrier` variable) and enforces
its deadline. Barriers are numbered (start
of epoch e: 2e, end of epoch e: 2e+1) and checked, so a fast worker's next barrier is never
confused with this one.

Typical usage:
  barrier = EpochBarrierHook(epoch_input, num_workers=4, worker_id=config.worker_id,
                             timeout_secs=600, audit_dir=model_dir)
  hooks = [barrier, epoch_input.hook]
"""

import dataclasses
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import tensorflow as tf

from hooks.epoch import arrivals as arrivals_lib
from hooks.epoch import audit as audit_lib
from hooks.epoch import barrier_graph
from hooks.epoch import run_start
from hooks import log as logging
from hooks.config.cluster import worker_problems
from hooks.epoch.barrier_release import ABORT, ReleaseWait, result_of
from hooks.epoch.barrier_wait import BarrierWaiter, Wait, timing_problems
from hooks.epoch.stand_ins import StandIns
from hooks.epoch.step_increment import lock_global_step_increments
from hooks.faults.heartbeat import Heartbeat
from hooks.data.epoch_input import EpochInput, EpochListener, EpochStats
from hooks.errors import ConfigError
from hooks.faults.liveness import LivenessMonitor
from hooks.faults.waiting import MAX_WAIT_SECS, BackgroundRun, run_options

__all__ = ["EpochBarrierHook", "ChiefAction"]

_v1 = tf.compat.v1
_ABORT = ABORT  # a release carrying this value means the chief gave up waiting
_REFUSED = barrier_graph.REFUSED  # ... or that the chief refused the tasks' settings
_RPC_TIMEOUT_SECS = 60.0  # Runs that cannot block: generous, a busy ps must not fail them.

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
    timeout_secs: `float`, how long an end-of-epoch barrier waits while the tasks it waits
      for make no progress (no new batch; a save of the chief counts as progress).
    startup_timeout_secs: `float`, the same at the start barrier (every worker up).
    warn_after_secs: `float`, waits longer than this log WARNING instead of INFO.
    log_every_secs: `float`, period of the "still missing" lines while waiting.
    audit_dir: where the chief appends `epochsync_epochs.jsonl`; None disables it.
    ps_device: the device holding the barrier state.
    liveness: a `LivenessMonitor` (`hooks.faults.liveness.monitor_for(config)`): while waiting, the
      chief probes the other workers and the ps tasks, a worker the chief and the ps tasks,
      once a second, and a dead one ends the wait with TaskDiedError. None: timeouts only.

  Raises:
    ConfigError: for num_workers < 1, a worker_id out of range, non-positive seconds or
      log_every_secs < 0.001.
    BarrierTimeoutError: (at run time) naming the barrier, the epoch and the missing tasks.
    TaskDiedError: (at run time) a task it waited for died, named with the barrier and epoch.
  """

  order = 20

  def __init__(self, epoch_input: EpochInput, num_workers: int, worker_id: int,
               worker_names: Optional[Sequence[str]] = None, timeout_secs: float = 1800.0,
               startup_timeout_secs: float = 600.0, warn_after_secs: float = 60.0,
               log_every_secs: float = 30.0, audit_dir: Optional[str] = None,
               ps_device: str = "/job:ps/task:0",
               liveness: Optional[LivenessMonitor] = None):
    problems = worker_problems(num_workers, worker_id, worker_names) + timing_problems(
        timeout_secs, startup_timeout_secs, warn_after_secs, log_every_secs)
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
    self._liveness = liveness
    self._heartbeat = Heartbeat(epoch_input, num_workers, worker_id, ps_device)
    self._waiter = BarrierWaiter(self.worker_names, worker_id, self._heartbeat, liveness,
                                 warn_after_secs, log_every_secs)
    self._chief_actions: List[ChiefAction] = []
    # (Elastic) The chief's arrivals for lost workers (hooks.elastic: stand_ins.lose), and a
    # relaunched worker's arrivals in the running job (hooks.elastic.rejoin: release_wait).
    self.stand_ins = StandIns(self._run_stand_in, self.worker_names, self.task_name)
    self.release_wait = ReleaseWait(self.task_name, self.worker_names[0], self._waiter,
                                     liveness, self._wait, self._missing)
    epoch_input.add_listener(self)

  def add_chief_action(self, action: ChiefAction) -> None:
    """Runs `action` on the chief after all workers arrived at an epoch's end, before release."""
    self._chief_actions.append(action)

  def _run_stand_in(self, session, worker_id: int, batches: int, seq: int) -> bool:
    return bool(_run(session, self._stand_in, {self._stand_in_worker: worker_id,
                                               self._stand_in_batches: batches, self._seq: seq}))

  def begin(self):
    # The audit's global_step counts every batch: no asynchronous increment is lost on the ps.
    lock_global_step_increments(_v1.get_default_graph())
    ops = barrier_graph.build(self.num_workers, self.worker_id, self._input.num_epochs,
                              self._ps_device)
    for field in dataclasses.fields(ops):  # self._seq, self._gather, ... as the runs use them
      setattr(self, "_" + field.name, getattr(ops, field.name))
    self._heartbeat.build()

  def after_create_session(self, session, coord):
    self._heartbeat.start(session)  # Before the start barrier: the others see this task come.

  def end(self, session):
    self._heartbeat.stop()

  # --- EpochListener -------------------------------------------------------------------

  def start_epoch(self, session) -> int:
    return int(session.run(self._completed, options=run_options(_RPC_TIMEOUT_SECS)))

  def resume_batches(self, session, epoch: int) -> Optional[int]:
    return self.release_wait.batches_before(epoch)

  def session_created(self, session, start_epoch: int) -> None:
    if run_start.rejoined_run():  # (elastic) The job runs already: it gathers no start.
      logging.info("%s rejoined the running job at epoch %d: no start barrier", self.task_name,
                   start_epoch)
      return
    stats = EpochStats(start_epoch, 0, 0, time.time(), time.time())
    self._sync(session, "start", 2 * start_epoch, stats, self._startup_timeout_secs)

  def epoch_ended(self, session, stats: EpochStats) -> None:
    self._sync(session, "epoch_end", 2 * stats.epoch + 1, stats, self._timeout_secs)

  # --- the barrier ---------------------------------------------------------------------

  def _sync(self, session, barrier: str, seq: int, stats: EpochStats, timeout: float):
    try:
      self._sync_now(session, barrier, seq, stats, timeout)
    except BaseException:  # The session fails now (end() is not called): stop beating.
      self._heartbeat.stop()
      raise

  def _sync_now(self, session, barrier: str, seq: int, stats: EpochStats, timeout: float):
    wait = Wait(barrier, seq, stats.epoch, time.monotonic(), timeout)
    logging.info("%s waiting at %s, epoch %d", self.task_name, barrier, stats.epoch)
    if self.is_chief:
      # Chief actions (a save) run between the gather and the release; without any, one run.
      fold = barrier != "epoch_end" or not self._chief_actions
      arrivals, step = self._gather_arrivals(session, wait, stats, release=fold)
      fields = {} if fold else self._run_chief_actions(session, wait, arrivals)
      if not fold:
        _, step = _run(session, self._release, self._release_feed(seq))
      for key, names in (("lost_workers", self.stand_ins.names),
                         ("rejoined_workers", self.stand_ins.rejoined),
                         (f"{self.stand_ins.absent_kind}_workers", self.stand_ins.spares)):
        if names:  # (elastic) arrived for by the chief; lost before, arrived themselves; idle
          fields[key] = names
      if self._audit and barrier == "epoch_end":
        self._audit.write(stats.epoch, arrivals, time.time(), fields,
                          None if step < 0 else int(step))
    else:
      self._arrive_and_wait_for_release(session, wait, stats)
    logging.info("%s passed %s, epoch %d, after %.3f s", self.task_name, barrier, stats.epoch,
                 time.monotonic() - wait.start)
    if barrier == "start" and self._liveness:  # Every task is up: note who answers as whom.
      self._liveness.probe(sorted(self._liveness.addresses))

  def _gather_arrivals(self, session, wait: Wait, own: EpochStats,
                       release: bool) -> Tuple[Dict[str, EpochStats], int]:
    """The chief: every worker's EpochStats, from one blocking dequeue_many of n-1 arrivals.

    With `release`, the same run releases the workers (or refuses them, if they disagree).
    Returns the arrivals and global_step (-1 if none) when they were gathered.
    """
    completed = own.epoch + 1 if wait.barrier == "epoch_end" else 0
    with self.stand_ins.gathering(session, wait):  # Lost workers (elastic): arrived for.
      return self._gather_now(session, wait, own, release, completed)

  def _gather_now(self, session, wait: Wait, own: EpochStats, release: bool,
                  completed: int) -> Tuple[Dict[str, EpochStats], int]:
    call = BackgroundRun(session, self._gather_and_release if release else self._gather,
                         wait.deadline,
                         feed_dict={self._seq: wait.seq, self._new_completed: completed,
                                    self._zero: 0},
                         name=f"epochsync-barrier-{wait.barrier}", run_timeout_secs=MAX_WAIT_SECS)
    if not self._wait(session, call, wait):
      self._abort(session)
      self._waiter.fail(wait, self._missing(session, wait.seq))
    try:
      result = result_of(call, wait, self._liveness, self.task_name)
      arrived, step = result[0], (result[3] if release else -1)
    except Exception:
      self._abort(session)
      raise
    arrivals, problems = arrivals_lib.arrivals(arrived, own, wait, self.worker_names,
                                               self.task_name,
                                               (self.num_workers, self._input.num_epochs))
    if problems:
      if not release:  # The folded run has refused them already.
        self._abort(session, _REFUSED)
      message = f"{self.task_name} at {wait.barrier} of epoch {wait.epoch}: " + "; ".join(problems)
      logging.error("%s", message)
      raise ConfigError(message)
    return arrivals, step

  def _run_chief_actions(self, session, wait: Wait, arrivals) -> Dict[str, object]:
    fields: Dict[str, object] = {}  # (only at an epoch's end: the start has no actions)
    try:
      for action in self._chief_actions:
        fields.update(action(session, wait.epoch, arrivals) or {})
    except Exception:
      self._abort(session)
      raise
    return fields

  def _abort(self, session, code: int = _ABORT) -> None:
    """Releases every waiting worker with an abort, so each fails now instead of timing out."""
    try:
      _run(session, self._release, self._release_feed(code))
    except tf.errors.OpError as e:  # Already failing: say so, keep the original error.
      logging.error("%s could not release the workers with an abort: %s", self.task_name,
                    e.message)

  def _release_feed(self, value: int):
    return {self._release_value: value, self._zero: 0}

  def _arrive_and_wait_for_release(self, session, wait: Wait, stats: EpochStats) -> None:
    """A worker: one run enqueues its arrival (never blocks) and dequeues its release."""
    rejoined = self.release_wait.batches_before(stats.epoch) is not None  # examples: unknown
    self.release_wait.arrive(session, wait, self._arrive_and_wait, {
        self._seq: wait.seq, self._stats: [stats.batches, -1 if rejoined else stats.examples],
        self._times: [stats.started_at, stats.ended_at]}, self._next_release)

  def _wait(self, session, call: BackgroundRun, wait: Wait) -> bool:
    return self._waiter.wait(session, call, wait, self._arrived, lambda: self._abort(session))

  def _missing(self, session, seq: int) -> Optional[List[str]]:
    return self._waiter.missing(session, self._arrived, seq)


def _run(session, fetches, feed_dict):
  """A run that cannot block (an enqueue into an unbounded queue, a variable update)."""
  return session.run(fetches, feed_dict, options=run_options(_RPC_TIMEOUT_SECS))
