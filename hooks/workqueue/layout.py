"""Where each field of the work queue's state vector lives (hooks.workqueue.queue_graph).

One int64 vector on ps:0 holds the whole queue, so that a claim writes it with one assign and a
checkpoint holds it whole. Its size depends on the number of units only (the per-worker slots
are fixed), so a checkpoint resumes with any worker count up to MAX_WORKERS.

Typical usage:
  layout = Layout(num_units)
  parts = layout.parts(vector)            # {"epoch": ..., "order": [...], ...}
  header, fields = layout.join(parts)     # back, in the vector's order
"""

import dataclasses
from typing import Any, Dict, List, Tuple

__all__ = ["Layout", "MAX_WORKERS", "HEADER", "UNIT_FIELDS", "fingerprint_value", "units_of_size"]

MAX_WORKERS = 1024  # Per-worker slots: a checkpoint resumes with any worker count up to this.
UNIT_FIELDS = ("order", "owner", "first_batch", "batches", "examples", "skip")
HEADER = ("epoch", "next", "fingerprint", "resumed_next", "resumed_step")


@dataclasses.dataclass(frozen=True)
class Layout:
  """Where each field lives in the state vector of `units` units:

    [epoch, next, fingerprint, resumed_next, resumed_step,
     order[u], owner[u], first_batch[u], batches[u], examples[u], skip[u],
     claims[MAX_WORKERS], last[MAX_WORKERS]]

  order: the epoch's order of the units (positions < next are handed out); owner: the worker
  that took the unit (-1: not yet); first_batch: the owner's epoch batch count when it took the
  unit, minus the unit's skip (so that its batch k went into the owner's batch first_batch + k);
  batches, examples: the unit's counts once finished (-1 before); skip: the unit's batches a
  resumed checkpoint already held; claims/last: each worker's claims this epoch and the unit of
  its last one; fingerprint: the units' (hooks.workqueue.units.fingerprint); resumed_next:
  the units done before the epoch's last resume (they keep the owners of an earlier attempt);
  resumed_step: the synchronous step it resumed at (every worker's batch count starts there).
  """
  units: int

  @property
  def size(self) -> int:
    return len(HEADER) + len(UNIT_FIELDS) * self.units + 2 * MAX_WORKERS

  def slices(self) -> Dict[str, slice]:
    out = {name: slice(i, i + 1) for i, name in enumerate(HEADER)}
    at = len(HEADER)
    for name in UNIT_FIELDS:
      out[name] = slice(at, at + self.units)
      at += self.units
    out["claims"], out["last"] = slice(at, at + MAX_WORKERS), slice(at + MAX_WORKERS, self.size)
    return out

  def parts(self, vector) -> Dict[str, Any]:
    """The fields of `vector` (a tensor or numpy array): header fields are scalars."""
    return {name: vector[s.start] if name in HEADER else vector[s]
            for name, s in self.slices().items()}

  def join(self, parts: Dict[str, Any]) -> Tuple[List[Any], List[Any]]:
    """The header scalars and the field vectors of `parts`, in the vector's order."""
    return ([parts[name] for name in HEADER],
            [parts[name] for name in UNIT_FIELDS + ("claims", "last")])


def fingerprint_value(fingerprint: str) -> int:
  """The units' fingerprint (hex) as the int64 the state holds."""
  return int(fingerprint[:15], 16)


def units_of_size(size: int) -> int:
  """The number of units of a state vector of `size` (the inverse of Layout.size)."""
  return (size - len(HEADER) - 2 * MAX_WORKERS) // len(UNIT_FIELDS)
