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

__all__ = ["UnitAudit", "audit_work_queue", "worker_name", "earlier_attempts"]

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
  if owner < len(names):
    return names[owner]
  chief_job = bool(names) and names[0].startswith("chief:")  # worker:i has id i + 1 there
  return f"worker:{owner - 1 if chief_job else owner}"


def earlier_attempts(state: Dict[str, Any], parts: Sequence[Dict[str, Any]],
                     names: Sequence[str]) -> Dict[str, List[Optional[int]]]:
  """What each worker trained of a resumed epoch before its last resume: {name: [batches,
  examples]} from the queue's `state` (the units done before the resume: their owner trained
  all but their skip) and the resumes' `parts` of units then in flight (each with its batches
  [from, to) and their `examples`). Examples are None where a skip is not made of recorded
  parts (a unit an elastic chief took back in an earlier attempt)."""
  earlier: Dict[str, List[Optional[int]]] = {}

  def add(name: str, batches: int, examples: Optional[int]) -> None:
    counts = earlier.setdefault(name, [0, 0])
    counts[0] += batches
    counts[1] = None if counts[1] is None or examples is None else counts[1] + examples

  skipped: Dict[int, List[int]] = {}  # unit -> [batches, examples] of its recorded parts
  for part in parts:
    batches, examples = part["to"] - part["from"], part.get("examples")
    add(part["worker"], batches, examples)
    done = skipped.setdefault(part["index"], [0, 0])
    done[0] += batches
    done[1] = None if done[1] is None or examples is None else done[1] + examples
  for index in state["order"][:int(state["resumed_next"])]:
    index = int(index)
    skip = int(state["skip"][index])
    batches, examples = skipped.get(index, [0, 0])
    known = batches == skip and examples is not None
    add(worker_name(names, int(state["owner"][index])), int(state["batches"][index]) - skip,
        int(state["examples"][index]) - examples if known else None)
  return earlier


def audit_work_queue(epoch_input: Any, barrier: Any, worker_names: Sequence[str]
                     ) -> Optional[UnitPasses]:
  """The work queue `epoch_input` reads from, its audit added to the chief's `barrier` actions
  (before the save: a wrong epoch is never saved); None for a static shard."""
  queue = work_queue_of(epoch_input)
  if queue is not None:
    barrier.add_chief_action(UnitAudit(queue, worker_names))
  return queue
