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

Synchronous training (`guest`) joins as a guest of the steps: the next aggregation that hands
out tokens takes it in, so it trains from the next step. If the epoch's steps end first, the
chief arrives for it and it starts with the next epoch.

Typical usage (hooks.session.wiring, on every worker but the chief with --epochsync_elastic):
  start = RunStartHook(..., rejoin=rejoin_fn(queue, barrier))
  start = RunStartHook(..., rejoin=rejoin_fn(queue, barrier, guest=elastic_sync.GuestJoin(...)))
"""

from typing import Any, Callable, List, Optional, Tuple

from hooks import log as logging
from hooks.workqueue.elastic_graph import JOINED, NOT_FENCED
from hooks.workqueue.unit_passes import UnitPasses

__all__ = ["rejoin_fn"]


def rejoin_fn(queue: UnitPasses, barrier, guest: Any = None
              ) -> Callable[[object], Optional[str]]:
  """`(session) -> None` once this worker joined the running job, else why not yet.

  `guest` (synchronous training): the sync optimizer's `join(session, epoch) -> (answer,
  held)` and `started(session) -> its first step, or -1` (hooks.session.elastic_sync)."""
  joined: List[Tuple[int, int]] = []  # (the epoch it joined, its earlier process's batches)

  def rejoin(session) -> Optional[str]:
    if not joined:
      running = barrier.start_epoch(session)
      if barrier.release_wait.arrived_at_end(session, running):
        return (f"its earlier process arrived at the end of epoch {running} before it was "
                "lost; it joins when that epoch ends")
      answer, held = (guest or queue.claims).join(session, running)
      if answer == NOT_FENCED:
        return (f"the chief has not found its earlier process lost yet (epoch {running}); it "
                "does within a few seconds")
      if answer != JOINED:
        return (f"it cannot join epoch {running} now (the chief arrives for it at its end, or "
                "its earlier process's last step is still being aggregated); it tries again")
      joined.append((running, held))
      logging.info("%s joined epoch %d (its earlier process trained %d batches of it)%s",
                   queue.task_name, running, held,
                   "; the next synchronous step takes it in" if guest else "")
    epoch, held = joined[0]
    if guest is None or guest.started(session) >= 0:  # In the steps: the epoch waits for it.
      barrier.release_wait.rejoined_at(epoch, held)
      return None
    if barrier.start_epoch(session) > epoch:  # Its steps ended first: it starts the next one.
      return None
    return f"it joined epoch {epoch}; it waits for the next synchronous step to take it in"

  return rejoin
