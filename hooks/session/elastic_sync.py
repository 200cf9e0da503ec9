"""Wires a synchronous elastic job: the sync optimizer's IDLE steps, lost markers and guests.

With an elastic work queue the sync optimizer builds its markers in the queue's lock
(hooks.sync.elastic_steps). Three pieces join it to the rest: a worker whose claim answers
WAIT runs IDLE steps between its claims (the others' steps go on); the chief, after it took a
lost worker's unit back, sends the marker the worker owes (hooks.elastic.LostWorkerWatch); and
a relaunched worker joins the running epoch as a guest (`GuestJoin`, hooks.elastic.Rejoin).

Typical usage (hooks.session.wiring, with --epochsync_elastic and a sync optimizer):
  on_lost = wire(queue, sync_hook, settings)
  watch = LostWorkerWatch(queue, barrier, monitor, ..., on_lost=on_lost)
  rejoin = Rejoin(queue, barrier, guest=GuestJoin(sync_hook, worker_id=1))
"""

import random
from typing import Any, Callable, Tuple

import tensorflow as tf

from hooks.errors import FENCED_MARK, StepTimeoutError
from hooks.faults import step_retry
from hooks.faults.waiting import run_options, run_uncancelled
from hooks.workqueue.claims import fenced_error
from hooks.workqueue.unit_passes import UnitPasses

__all__ = ["wire", "GuestJoin"]

_RUN_TIMEOUT_SECS = 60.0  # the lost marker and the guest's runs wait only for the queue's lock


def wire(queue: UnitPasses, sync_hook: Any, step_timeout_secs: float
         ) -> Callable[[Any, int], None]:
  """Sets this worker's IDLE steps; returns the chief's `on_lost(session, worker_id)`."""
  opt = sync_hook.optimizer  # one (hooks.session.wiring refuses several)
  task = queue.task_name

  def idle(session) -> None:
    ops = opt.sync_ops
    try:
      session.run(ops.idle_op, options=run_options(step_timeout_secs))
    except tf.errors.InvalidArgumentError as e:  # its marker refused: the chief fenced it
      if FENCED_MARK in (e.message or ""):
        raise fenced_error(task) from e
      raise
    except tf.errors.DeadlineExceededError as e:
      if _found_lost(queue, session):  # it stalled (frozen) past the step and was fenced
        raise fenced_error(task) from e
      raise StepTimeoutError(
          f"{task} waited {step_timeout_secs:.0f} s in a step without a batch (its claim "
          "waits for a unit in flight) and the step never ended: the chief's aggregation is "
          "stuck; check the chief's log, or raise --epochsync_step_timeout_secs",
          [opt.worker_names[0]]) from e

  def on_lost(session, worker_id: int) -> None:
    feed, op = opt.sync_ops.lost_marker
    step_retry.run_rerunnable(
        lambda: run_uncancelled(session, op, {feed: worker_id}, _RUN_TIMEOUT_SECS),
        "the lost worker's marker", opt.worker_names[0])

  queue.claims.while_waiting = idle
  return on_lost


def _found_lost(queue: UnitPasses, session) -> bool:
  """Whether the chief fenced this worker; False when the queue cannot be read either."""
  try:
    return queue.claims.fenced(session)
  except tf.errors.OpError:
    return False


class GuestJoin:
  """A relaunched worker's join of the running epoch, for hooks.elastic.rejoin (a guest).

  `join` can run again after its answer was lost: the same process's token answers JOINED again.
  """

  def __init__(self, sync_hook: Any, worker_id: int):
    self._opt, self._worker = sync_hook.optimizer, worker_id
    self._token = random.SystemRandom().getrandbits(62) + 1
    self._started = self._opt.sync_ops.guest.started[worker_id]  # built before the session

  def join(self, session, epoch: int, spares: int = 0) -> Tuple[int, int]:
    """(JOINED, NOT_FENCED, CLOSED or FULL; its earlier process's batches of `epoch`), in a job
    of `spares` spare workers."""
    ops = self._opt.sync_ops.guest
    feeds = {ops.worker: self._worker, ops.epoch: epoch, ops.token: self._token,
             ops.spares: spares}
    answer, held = step_retry.run_rerunnable(
        lambda: run_uncancelled(session, ops.join, feeds, _RUN_TIMEOUT_SECS),
        "the guest's join", self._opt.worker_names[0])
    return int(answer), int(held)

  def ready(self, session, epoch: int) -> bool:
    """Its session is ready for its first step: the next aggregation may take it in. False: the
    chief's gather stood in for it at `epoch`'s end first."""
    ops = self._opt.sync_ops.guest
    return bool(step_retry.run_rerunnable(
        lambda: run_uncancelled(session, ops.ready, {ops.worker: self._worker,
                                                     ops.epoch: epoch}, _RUN_TIMEOUT_SECS),
        "the guest's ready mark", self._opt.worker_names[0]))

  def started(self, session) -> int:
    """Its first step in the joined epoch, once an aggregation took it in; -1 before."""
    return int(session.run(self._started, options=run_options(_RUN_TIMEOUT_SECS)))

  def take_local_step(self, session) -> None:
    """(Once a step took it in) Its local step is the step, which waits for its marker."""
    session.run(self._opt.sync_ops.local_step_init_op, options=run_options(_RUN_TIMEOUT_SECS))
