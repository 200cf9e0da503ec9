"""A relaunched worker of an elastic job rejoins the running job instead of starting with it.

RunStartHook finds that an earlier process of this worker joined the running job (Kubernetes
relaunched it after it died). In an elastic job the chief goes on without that process and
fences its slot once it finds it lost (hooks.elastic.lost_workers); the new process then joins
at the running epoch, unless the chief arrives for it at that epoch's barrier (the epoch it was
lost in, or one the chief closed at its gather): then it joins when that epoch ends. Joined, it
skips the start barrier, claims units of the epoch and arrives itself at its barrier. The
queue's MembershipOps decide, inside its lock, so the chief's stand-in and the join never both
count one epoch.

Synchronous training (`guest`) joins the running epoch as a guest: the next aggregation that
hands out tokens takes it into the steps, so it trains from the next step and arrives itself
at the epoch's end (its count goes on from its earlier process's). If the epoch's steps or its
gather end first, the chief arrives for it there and it starts with the next epoch; so it
does if its earlier process had arrived at the epoch's end before it died.

Typical usage (hooks.session.wiring, on every worker but the chief with --epochsync_elastic):
  start = RunStartHook(..., rejoin=rejoin_fn(queue, barrier))
  start = RunStartHook(..., rejoin=rejoin_fn(queue, barrier, guest=elastic_sync.guest(...)))
"""

from typing import Any, Callable, List, Optional, Tuple

from hooks import log as logging
from hooks.workqueue.elastic_graph import GUEST, JOINED, NOT_FENCED
from hooks.workqueue.unit_passes import UnitPasses

__all__ = ["rejoin_fn"]


def rejoin_fn(queue: UnitPasses, barrier, guest: Any = None
              ) -> Callable[[object], Optional[str]]:
  """`(session) -> None` once this worker joined the running job, else why not yet.

  `guest` (synchronous training): the sync optimizer's `join(session, epoch) -> (answer,
  held)` and `started(session) -> its first step, or -1` (hooks.session.elastic_sync)."""
  joined: List[Tuple[int, int]] = []  # (the epoch it joined, its earlier process's batches)

  def rejoin(session) -> Optional[str]:
    running = barrier.start_epoch(session)
    if not joined:
      if guest is not None and barrier.arrived_at_end(session, running):
        return (f"its earlier process arrived at the end of epoch {running} before it was "
                "lost; it joins when that epoch ends")
      answer, held = (queue.claims.join(session, running), 0) if guest is None else (
          guest.join(session, running))
      if answer == NOT_FENCED:
        return (f"the chief has not found its earlier process lost yet (epoch {running}); it "
                "does within a few seconds")
      if answer not in (JOINED, GUEST):
        return (f"the chief arrives for it at the end of epoch {running}, the epoch its "
                "earlier process was lost in; it joins when that epoch ends")
      joined.append((running, held))
      if guest is not None:
        logging.info("%s joined epoch %d as a guest (its earlier process trained %d batches "
                     "of it); the next synchronous step takes it in", queue.task_name, running,
                     held)
    if guest is None:
      return None
    epoch, held = joined[0]
    if guest.started(session) >= 0:  # Read first: once in the steps, the epoch goes on for it.
      barrier.join_as_guest(epoch, held)
      return None
    if barrier.start_epoch(session) > epoch:  # Ended first: it starts with the next epoch.
      return None
    return f"it joined epoch {epoch}; it waits for the next synchronous step to take it in"

  return rejoin
