"""The chief's check of a work queue's epoch, and the units' part of the audit line.

At the epoch's end (a barrier chief action, after every worker arrived and before the save),
the chief reads the queue on ps:0 and lists every unit in the order it was handed out: its
worker, the worker's batch count when it took it, its batches and examples. The epoch is exact
when every unit was handed out and finished, each worker's units add up to what it trained,
and each unit of a known record range yielded that many examples. Anything else raises
WorkQueueError naming each problem, so no checkpoint of a wrong epoch is written.

Typical usage (hooks.session.wiring and estimator_ext's local mode, on the chief):
  queue = audit_work_queue(epoch_input, barrier, worker_names)  # None: a static shard
"""

from typing import Any, Dict, List, Optional, Sequence

from hooks.data.epoch_listener import EpochStats
from hooks.errors import WorkQueueError
from hooks.faults.waiting import run_options
from hooks.workqueue.unit_passes import UnitPasses, work_queue_of

__all__ = ["UnitAudit", "audit_work_queue", "worker_name"]

_READ_TIMEOUT_SECS = 60.0


class UnitAudit:
  """A barrier chief action: (session, epoch, arrivals) -> {"units": [...]} or WorkQueueError."""

  def __init__(self, passes: UnitPasses, worker_names: Sequence[str]):
    self._passes, self._names = passes, list(worker_names)

  def __call__(self, session, epoch: int, arrivals: Dict[str, EpochStats]) -> Dict[str, object]:
    state = session.run(self._passes.claims.state, options=run_options(_READ_TIMEOUT_SECS))
    units, problems = self._units(state, self._passes.taken_back.get(epoch, {})), []
    offset = int(state["resumed_step"])  # Every worker's batch count started there.
    if int(state["epoch"]) != epoch:
      problems.append(f"the queue on ps:0 is in epoch {int(state['epoch'])}, not {epoch}")
    handed = int(state["next"])
    if handed != len(self._passes.units):
      problems.append(f"{len(self._passes.units) - handed} of {len(self._passes.units)} units "
                      "were never handed out: " + ", ".join(
                          str(self._passes.units[i]) for i in state["order"][handed:][:5]))
    problems += [f"unit {u['unit']} was taken by {u['worker']} but never finished"
                 for u in units if u["batches"] < 0]
    problems += self._count_problems(units, arrivals, offset)
    if problems:
      raise WorkQueueError(f"the work queue's epoch {epoch} is not exact: " + "; ".join(problems))
    return {"units": units}

  def _units(self, state, taken_back) -> List[Dict[str, object]]:
    out, resumed = [], int(state["resumed_next"])
    for position, index in enumerate(state["order"][:int(state["next"])]):
      owner = int(state["owner"][index])
      unit = {"unit": str(self._passes.units[index]), "index": int(index),
              "worker": worker_name(self._names, owner), "first_batch": int(state["first_batch"][index]),
              "batches": int(state["batches"][index]),
              "examples": int(state["examples"][index])}
      if int(state["skip"][index]):  # Its first batches came from a mid-epoch checkpoint.
        unit["resumed_after"] = int(state["skip"][index])
      if position < resumed:  # Trained whole before the epoch's last resume.
        unit["before_resume"] = True
      if int(index) in taken_back:  # Its first batches came from lost workers (elastic).
        unit["taken_back"] = [{"worker": worker_name(self._names, lost), "batches": batches}
                              for lost, batches in taken_back[int(index)]]
      out.append(unit)
    return out

  def _count_problems(self, units, arrivals: Dict[str, EpochStats], offset: int) -> List[str]:
    """Each worker's units of this attempt add up to what it trained (its examples too, when
    none of them was resumed: a resumed unit's skipped examples are the unit's, not the
    worker's; a lost worker's examples are unknown: -1), and the parts of units taken back
    from it count as its own; each record range yielded its records."""
    problems = []
    for name, stats in sorted(arrivals.items()):
      mine = [u for u in units if u["worker"] == name and not u.get("before_resume")]
      batches = sum(u["batches"] - u.get("resumed_after", 0) for u in mine)
      batches += sum(part["batches"] for u in units for part in u.get("taken_back", ())
                     if part["worker"] == name)
      examples = sum(u["examples"] for u in mine)
      resumed = any("resumed_after" in u for u in mine) or stats.examples < 0
      if batches != stats.batches - offset or (not resumed and examples != stats.examples):
        problems.append(f"{name} trained {stats.batches - offset} batches / "
                        f"{stats.examples} examples but its units hold {batches} / {examples}")
    if self._passes.records_are_examples:
      for u in units:
        count = self._passes.units[u["index"]].count
        if count >= 0 and u["examples"] != count:
          problems.append(f"unit {u['unit']} yielded {u['examples']} examples, its range holds "
                          f"{count} records ({'short' if u['examples'] < count else 'long'}: "
                          "a filter, drop_remainder or repeat in unit_fn?)")
    return problems


def worker_name(names: Sequence[str], owner: int) -> Optional[str]:
  """The name of worker id `owner` (None: no owner). An id beyond `names` belongs to a job that
  ran with more workers before a resume."""
  if owner < 0:
    return None
  return names[owner] if owner < len(names) else f"worker:{owner}"


def audit_work_queue(epoch_input: Any, barrier: Any, worker_names: Sequence[str]
                     ) -> Optional[UnitPasses]:
  """The work queue `epoch_input` reads from, its audit added to the chief's `barrier` actions
  (before the save: a wrong epoch is never saved); None for a static shard."""
  queue = work_queue_of(epoch_input)
  if queue is not None:
    barrier.add_chief_action(UnitAudit(queue, worker_names))
  return queue
