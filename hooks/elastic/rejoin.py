"""A relaunched worker of an elastic job rejoins the running job instead of starting with it.

RunStartHook finds that an earlier process of this worker joined the running job (Kubernetes
relaunched it after it died). In an elastic job the chief goes on without that process and
fences its slot once it finds it lost (hooks.elastic.lost_workers); the new process then joins
at the running epoch, unless the chief arrives for it at that epoch's barrier (the epoch it was
lost in, or one the chief closed at its gather): then it joins when that epoch ends. Joined, it
skips the start barrier, claims units of the epoch and arrives itself at its barrier. The
queue's MembershipOps decide, inside its lock, so the chief's stand-in and the join never both
count one epoch.

Typical usage (hooks.session.wiring, on every worker but the chief with --epochsync_elastic):
  start = RunStartHook(..., rejoin=rejoin_fn(queue, barrier))
"""

from typing import Callable, Optional

from hooks.workqueue.elastic_graph import JOINED, NOT_FENCED
from hooks.workqueue.unit_passes import UnitPasses

__all__ = ["rejoin_fn"]


def rejoin_fn(queue: UnitPasses, barrier, ahead: bool = False
              ) -> Callable[[object], Optional[str]]:
  """`(session) -> None` once this worker joined the running job, else why not yet.

  `ahead` (synchronous training): it joins the epoch after the running one, whose steps
  count it from their start, and starts once the running epoch ended."""
  joined = []  # the epoch it joined

  def rejoin(session) -> Optional[str]:
    running = barrier.start_epoch(session)
    if not joined:
      epoch = running + int(ahead)
      answer = queue.claims.join(session, epoch)
      if answer == NOT_FENCED:
        return (f"the chief has not found its earlier process lost yet (epoch {running}); it "
                "does within a few seconds")
      if answer != JOINED:
        return (f"the chief arrives for it at the end of epoch {epoch}"
                + (", the epoch its earlier process was lost in" if not ahead else "")
                + "; it joins when that epoch ends")
      joined.append(epoch)
    if running < joined[0]:
      return f"it joined epoch {joined[0]}, which starts when epoch {running} ends"
    return None

  return rejoin
