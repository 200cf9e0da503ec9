"""The chief's arrivals for lost workers at the epoch barrier (elastic training).

Once the chief has found a worker lost (hooks.elastic), it arrives for it at every barrier (for a
spare worker standing by too, or an optional worker not joined yet, from the run's start): one
run on ps:0 enqueues the worker's arrival (its batches in the model at the epoch's end,
examples -1: unknown) unless the worker arrived itself before it died, so the chief's gather of
n-1 arrivals completes without it. A worker lost while the chief gathers is arrived for at
once. Stand-ins run one at a time under a lock: the op's read of `arrived` and its enqueue are
two ops, and only the lock keeps two stand-ins for one worker from both enqueuing. Before each
stand-in the chief asks `still_lost` (the work queue's membership, hooks.workqueue): a worker
that rejoined (a relaunched process) arrives itself from then on, and is no longer stood in
for; else it answers the worker's batches of the epoch in the model, which the stand-in
carries (a relaunched process's count goes on from its earlier process's, so this also holds
for one lost again in the epoch it rejoined).

Typical usage (EpochBarrierHook's, on the chief):
  stand_ins = StandIns(run_stand_in, worker_names, task_name="worker:0")
  stand_ins.lose(session, worker_id=1, epoch=0, batches=13)    # hooks.elastic's watch
  with stand_ins.gathering(session, wait): ...                   # the gather's blocking run
"""

import contextlib
import threading
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Set, Tuple

from hooks import log as logging
from hooks.epoch.barrier_wait import Wait

__all__ = ["StandIns", "StillLost"]

# (session, worker id, epoch) -> the lost worker's batches of the epoch in the model, or None
# once it rejoined and arrives itself.
StillLost = Callable[[object, int, int], Optional[int]]


class StandIns:
  """Lost workers and the chief's arrivals for them.

  Args:
    run_stand_in: (session, worker_id, batches, seq) -> whether it enqueued an arrival.
    worker_names: task names by worker id.
    task_name: the chief's, for the log.
  """

  def __init__(self, run_stand_in: Callable[[object, int, int, int], bool],
               worker_names: Sequence[str], task_name: str):
    self._run, self._names, self._task = run_stand_in, list(worker_names), task_name
    # worker id -> (epoch, batches in the model, still_lost or None)
    self._lost: Dict[int, Tuple[int, int, Optional[StillLost]]] = {}
    self._gathering: Optional[Wait] = None
    self._rejoined: List[str] = []  # found rejoined at the last gather
    self._spares: Set[int] = set()  # of _lost: spares standing by, not lost
    # What the job's `spares` are: "spare" (standing by) or "optional" (not joined yet).
    self.absent_kind = "spare"
    self._lock = threading.Lock()

  def lose(self, session, worker_id: int, epoch: int, batches: int,
           still_lost: Optional[StillLost] = None, spare: bool = False) -> None:
    """Worker `worker_id` is lost in `epoch` with `batches` of it in the model: arrive for it
    at every barrier from now on, now if one is being gathered, while `still_lost(session,
    worker_id, epoch)` answers its batches of that epoch in the model, not None (None: always,
    with `batches`). `spare`: it is not lost but a spare standing by (`spares`)."""
    with self._lock:
      self._lost[worker_id] = (epoch, batches, still_lost)
      if spare:
        self._spares.add(worker_id)
      else:
        self._spares.discard(worker_id)
      if self._gathering is not None:
        self._arrive_for(session, worker_id, self._gathering)

  @property
  def names(self) -> List[str]:
    """The lost workers' names, sorted (not the spares)."""
    with self._lock:
      return sorted(self._names[w] for w in self._lost if w not in self._spares)

  @property
  def spares(self) -> List[str]:
    """The spare workers standing by, or the optional ones not joined yet (arrived for as the
    lost ones), sorted."""
    with self._lock:
      return sorted(self._names[w] for w in self._spares)

  @property
  def rejoined(self) -> List[str]:
    """The lost workers the last gather found rejoined (they arrived themselves), sorted."""
    with self._lock:
      return sorted(self._rejoined)

  @contextlib.contextmanager
  def gathering(self, session, wait: Wait) -> Iterator[None]:
    """Around the chief's gather of `wait`: arrives for every worker lost so far, and for one
    lost while it gathers."""
    with self._lock:
      self._gathering, self._rejoined = wait, []
      for worker_id in list(self._lost):
        self._arrive_for(session, worker_id, wait)
    try:
      yield
    finally:
      with self._lock:
        self._gathering = None

  def _arrive_for(self, session, worker_id: int, wait: Wait) -> None:
    epoch, batches, still_lost = self._lost[worker_id]
    if still_lost is not None:
      # At the run's start barrier it asks about the epoch before the run's first, whose end
      # is past: it closes nothing the run trains, so a spare (or a worker lost before the
      # start) may still join the first epoch.
      asked = wait.epoch if wait.barrier == "epoch_end" else wait.epoch - 1
      held = still_lost(session, worker_id, asked)
      if held is None:
        del self._lost[worker_id]
        first = worker_id in self._spares  # a spare or an optional worker: its first join
        self._spares.discard(worker_id)
        self._rejoined.append(self._names[worker_id])
        logging.info("%s %s the job: it arrives itself at %s of epoch %d",
                     self._names[worker_id], "joined" if first else "rejoined", wait.barrier,
                     wait.epoch)
        return
      epoch, batches = wait.epoch, held
    batches = batches if (epoch, wait.barrier) == (wait.epoch, "epoch_end") else 0
    if self._run(session, worker_id, batches, wait.seq):
      logging.info("%s arrives at %s of epoch %d for %s, which is %s", self._task,
                   wait.barrier, wait.epoch, self._names[worker_id],
                   self.absent_label if worker_id in self._spares else "lost")

  @property
  def absent_label(self) -> str:
    """How the log names a worker of `spares`."""
    return ("a spare standing by" if self.absent_kind == "spare" else
            "an optional worker not joined yet")
