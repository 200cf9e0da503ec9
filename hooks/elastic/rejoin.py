"""A relaunched worker of an elastic job rejoins the running job instead of starting with it.

RunStartHook finds that an earlier process of this worker joined the running job (Kubernetes
relaunched it after it died). In an elastic job the chief goes on without that process and
fences its slot once it finds it lost (hooks.elastic.lost_workers); the new process then joins
the running epoch, also the one its earlier process was lost in: it skips the start barrier,
claims units of the epoch, counts its batches on from the ones its earlier process trained, and
arrives itself at the epoch's barrier. It joins when the epoch ends instead if the chief
arrives for it there (its gather came first), or if its earlier process had arrived there
before it died. The queue's MembershipOps decide, inside its lock, so the chief's stand-in and
the join never both count one epoch.

A spare worker (--epochsync_spare_workers: the job's last worker indices) joins the same way,
from its start: the chief fences it at the run's start and arrives for it at every barrier, and
its join answers FULL while no more workers are fenced than the job has spares. So it stands
by, its graph built and its session up, and joins in place of the first lost worker within the
chief's detection; a relaunched worker that finds the job full stands by in its turn. A
process that finds the job's epochs all trained ends (its session stops before a step).
An optional worker (--epochsync_optional_workers, `optional`: a pod scheduled late) is fenced
and arrived for from the run's start as a spare is, but joins as soon as its process is up: its
join counts no spares (`spares=0`), so its own fence makes room for it.

Synchronous training (`guest`) joins as a guest of the steps. The join only reserves its place;
the steps wait for it from the round that takes it in, and that round comes only once its
session is ready for its first step (`GuestTakeInHook`, the last hook before the epoch starts):
its session's other hooks never stall the others' steps. If the epoch's steps end first, the
chief arrives for it and it starts with the next epoch.

Typical usage (hooks.session.wiring, on every worker but the chief with --epochsync_elastic):
  rejoin = Rejoin(queue, barrier)                              # asynchronous
  rejoin = Rejoin(queue, barrier, guest=elastic_sync.GuestJoin(...))   # synchronous
  rejoin = Rejoin(queue, barrier, spares=1, num_epochs=3, spare=True)  # a job's spare
  rejoin = Rejoin(queue, barrier, num_epochs=3, spare=True, optional=True)  # optional worker
  start = RunStartHook(..., rejoin=rejoin)
  hooks += [GuestTakeInHook(rejoin, monitor, chief, timeout_secs), epoch_input.hook]
"""

import time
from typing import Any, Callable, Optional, Tuple

import tensorflow as tf

from hooks import log as logging
from hooks.errors import StartupTimeoutError
from hooks.workqueue.elastic_graph import FULL, JOINED, NOT_FENCED
from hooks.workqueue.unit_passes import UnitPasses

__all__ = ["Rejoin", "GuestTakeInHook"]

_POLL_SECS = 0.02  # a guest's poll of `started`: two reads on the ps; its steps wait meanwhile


class Rejoin:
  """`rejoin(session)` (RunStartHook's): None once this worker joined the running job (or
  found its `num_epochs` all trained), else why not yet. `spares`: the job's spare workers;
  `spare`: this worker is one (`optional`: it is an optional worker, which joins at once). A
  synchronous guest (`guest`: the sync optimizer's
  `join(session, epoch, spares) -> (answer, held)`, `ready(session, epoch)`,
  `started(session) -> its first step, or -1` and `take_local_step(session)`,
  hooks.session.elastic_sync) is then taken into the steps by `take_in`. `announce(session)`
  runs before each join (a worker beyond the launch's cluster writes its address:
  hooks.elastic.addresses)."""

  def __init__(self, queue: UnitPasses, barrier: Any, guest: Any = None, spares: int = 0,
               num_epochs: Optional[int] = None, spare: bool = False, optional: bool = False,
               announce: Optional[Callable[[Any], None]] = None):
    self._queue, self._barrier, self._guest = queue, barrier, guest
    self._announce = announce
    self._spares, self._num_epochs, self._spare = spares, num_epochs, spare
    self._optional = optional  # (implies `spare`)
    self._standing_by = False  # its join found the job full (logged once)
    self.finished = False  # it found the job's epochs all trained: its session ends at once
    self.task_name = queue.task_name
    self.joined: Optional[Tuple[int, int]] = None  # (its epoch, its earlier process's batches)
    self.pending = False  # (a guest) joined, not in the steps yet
    self._marked_ready = False

  def __call__(self, session) -> Optional[str]:
    if self.joined is not None:
      return None
    running = self._barrier.start_epoch(session)
    if self._num_epochs is not None and running >= self._num_epochs:
      self.joined = (running, 0)  # Nothing left: its session ends before a step.
      self.finished = True
      logging.info("%s: the running job trained all its %d epochs; this process ends",
                   self.task_name, self._num_epochs)
      return None
    if self._barrier.release_wait.arrived_at_end(session, running):
      return (f"the end of epoch {running} already counts an arrival for it (its earlier "
              "process's, or the chief's for it); it joins when that epoch ends")
    if not self._barrier.release_wait.epoch_under_way(session, running):
      return (f"epoch {running} has not started: its start barrier waits for workers of the "
              "job's launch; it joins once they are all there")
    if self._announce is not None:
      self._announce(session)
    answer, held = (self._guest or self._queue.claims).join(session, running, self._spares)
    if answer == FULL:
      if not self._standing_by:
        self._standing_by = True
        logging.info("%s stands by as a spare: the job has the workers it trains with "
                     "(--epochsync_spare_workers=%d); it joins in place of the next lost worker",
                     self.task_name, self._spares)
      return f"it stands by as a spare (epoch {running}) until a worker is lost"
    if answer == NOT_FENCED:
      return ("the chief has not fenced its slot yet (an optional worker's at the run's "
              "start, a lost earlier process's within a few seconds)" if self._optional else
              f"the chief has not found its earlier process lost yet (epoch {running}); it "
              "does within a few seconds")
    if answer != JOINED:
      return (f"it cannot join epoch {running} now (the chief arrives for it at its end, or "
              "its earlier process's last step is still being aggregated); it tries again")
    self.joined, self.pending = (running, held), self._guest is not None
    logging.info("%s joined epoch %d (%s)%s", self.task_name, running,
                 ("an optional worker, up after the job's start" if self._optional and not held
                  else "a spare, in place of a lost worker" if self._standing_by or (
                      self._spare and not held) else
                  f"its earlier process trained {held} batches of it"),
                 "; a synchronous step takes it in once its session is ready" if self.pending
                 else "")
    if not self.pending:
      self._barrier.release_wait.rejoined_at(running, held)
    return None

  def take_in(self, session) -> Optional[str]:
    """(A pending guest, once its session is ready for its first step) None once a step took
    it in (its local step is then the one it owes) or the epoch's steps ended first (it starts
    the next one); else why it waits. Marks it ready on its first call."""
    epoch, held = self.joined
    if not self._marked_ready:  # (0: the chief's gather stood in for it first; it waits on)
      self._guest.ready(session, epoch)
      self._marked_ready = True
    if self._guest.started(session) >= 0:
      self._guest.take_local_step(session)  # The steps wait for its marker: the step holds.
      self._barrier.release_wait.rejoined_at(epoch, held)
      self.pending = False
      logging.info("%s: a synchronous step took it into epoch %d", self.task_name, epoch)
      return None
    if self._barrier.start_epoch(session) > epoch:
      self.pending = False
      logging.info("%s: epoch %d's steps ended before one took it in; it starts with epoch %d",
                   self.task_name, epoch, epoch + 1)
      return None
    return f"joined epoch {epoch} as a guest of the synchronous steps"


class GuestTakeInHook(tf.compat.v1.train.SessionRunHook):
  """(Synchronous, elastic) Takes a relaunched worker that joined as a guest into the steps, as
  the last hook before its epoch starts. Bounded by `timeout_secs`; a dead chief ends it."""

  def __init__(self, rejoin: Rejoin, liveness: Any, chief: str, timeout_secs: float):
    self._rejoin, self._liveness, self._chief = rejoin, liveness, chief
    self._timeout = timeout_secs

  def after_create_session(self, session, coord) -> None:
    start = time.monotonic()
    while self._rejoin.pending:
      why = self._rejoin.take_in(session)
      if why is None:
        return
      if time.monotonic() - start > self._timeout:
        raise StartupTimeoutError(
            f"{self._rejoin.task_name} {why}, and no step took it in for {self._timeout:g} s "
            f"(nor did the epoch's steps end): {self._chief}'s aggregation is stuck; check its "
            "log, or raise --epochsync_startup_timeout_secs", [self._chief])
      self._liveness.check([self._chief], "for a synchronous step to take it in")
      time.sleep(_POLL_SECS)

