"""A recorded assignment imposed again: each worker claims the units an audit says it trained.

The chief's audit (`<model_dir>/epochsync_epochs.jsonl`) lists every unit of an epoch with the
worker that trained it and that worker's batch count when it took it. A replay hands each
worker, in each recorded epoch, exactly its units in that order (and nothing more), so a
synchronous run repeats the recorded step composition (a worker's k-th batch goes into step k)
whatever the timing: a debugging aid, and how the tests compare a job with a numpy oracle.
Epochs the audit does not hold are handed out as usual. An epoch that was resumed from a
mid-epoch checkpoint cannot be replayed (its first part ran in another attempt).

Typical usage:
  replay = UnitReplay.from_audit("/tmp/model/epochsync_epochs.jsonl", num_units=len(units))
  epoch_input = work_queue_input(units, unit_fn, ..., replay=replay)
  # or: python -m examples.train ... --unit_replay=/tmp/model/epochsync_epochs.jsonl
"""

import json
from typing import Dict, List, Optional

from hooks.errors import ConfigError

__all__ = ["UnitReplay"]


class UnitReplay:
  """epoch -> worker name -> the units it takes, in order."""

  def __init__(self, assignment: Dict[int, Dict[str, List[int]]]):
    self._assignment = assignment

  @classmethod
  def from_audit(cls, path: str, num_units: int) -> "UnitReplay":
    """The assignment of every epoch of the audit file at `path` (the jsonl the chief writes)."""
    assignment: Dict[int, Dict[str, List[int]]] = {}
    with open(path) as f:
      for number, line in enumerate(f, 1):
        if not line.strip():
          continue
        entry = json.loads(line)
        units = entry.get("units")
        where = f"{path} line {number} (epoch {entry.get('epoch')})"
        if units is None:
          raise ConfigError(f"{where} lists no units: it was written by a job without a work "
                            "queue; replay the audit of a job that trained through one")
        if entry.get("unit_parts") or any(u.get("before_resume") for u in units):
          raise ConfigError(f"{where} was resumed from a mid-epoch checkpoint: its first part "
                            "ran in another attempt and cannot be imposed again; replay an "
                            "uninterrupted epoch")
        if sorted(u["index"] for u in units) != list(range(num_units)):
          raise ConfigError(f"{where} holds units {sorted(u['index'] for u in units)[:8]}..., "
                            f"not the {num_units} units of this job: pass the units it was "
                            "written with")
        by_worker: Dict[str, List[dict]] = {}
        for u in units:
          by_worker.setdefault(u["worker"], []).append(u)
        assignment[int(entry["epoch"])] = {
            name: [u["index"] for u in sorted(mine, key=lambda u: u["first_batch"])]
            for name, mine in by_worker.items()}
    return cls(assignment)

  def units_of(self, epoch: int, task_name: str) -> Optional[List[int]]:
    """The units `task_name` takes in `epoch`, in order; None: the epoch is not replayed."""
    epoch_assignment = self._assignment.get(epoch)
    if epoch_assignment is None:
      return None
    return list(epoch_assignment.get(task_name, []))
