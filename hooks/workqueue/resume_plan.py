"""What a restored work queue hands out again: the units a mid-epoch checkpoint holds in part.

A mid-epoch checkpoint holds the queue's state as the chief saved it, beside the model. Every
unit handed out has an owner and the owner's epoch batch count when it took it (first_batch);
the model holds the owner's batches up to its *position* at the save: the synchronous step S
for every worker (its k-th batch went into step k), or, asynchronously, the owner's own count
of applied batches (elastic synchronous training saves each worker's own count too: its steps
are not in lockstep with the others'). So the model holds `position - first_batch` batches of the unit, at most
its batches when it was finished. From that the plan sorts every unit:
  - done: finished, and all its batches in the model: it keeps its record (owner, counts), and
    stays done at every later resume of the epoch (its owner's count was an earlier attempt's);
  - in flight: some of its batches in the model: handed out again, skipping them;
  - not started: handed out again from its start, in the epoch's order.
Units are not tied to workers, so the plan holds for any worker count.

Typical usage (hooks.checkpoint.unit_resume, on the chief, before the run starts):
  plan = plan_resume(saved_vector, layout, position_of=lambda owner: steps)
  session.run(ops.assign, {ops.new_vector: plan.state})
"""

import dataclasses
from typing import Callable, Dict, List, Mapping, Optional, Tuple

import numpy as np

from hooks.workqueue.layout import MAX_WORKERS, Layout

__all__ = ["ResumePlan", "plan_resume"]


@dataclasses.dataclass(frozen=True)
class ResumePlan:
  """The queue's state to write, and the units by what happens to them (by index)."""
  state: np.ndarray
  done: List[int]
  in_flight: Dict[int, int]  # unit -> its batches the model holds (skipped when handed out)
  not_started: List[int]

  def describe(self) -> str:
    skips = ", ".join(f"{u} after {k} batches" for u, k in sorted(self.in_flight.items()))
    return (f"{len(self.done)} units done, {len(self.in_flight)} in flight"
            f"{' (' + skips + ')' if skips else ''}, {len(self.not_started)} not started")


def plan_resume(vector, layout: Layout, position_of: Callable[[int], int],
                resumed_step: int = 0,
                finished: Optional[Mapping[int, Tuple[int, int]]] = None) -> ResumePlan:
  """The resumed state of a queue saved as `vector`; `position_of(owner)` is the owner's batch
  count the model holds (synchronous: the saved step S for every owner); `resumed_step`: where
  every worker's batch count starts after the resume (synchronous: S; asynchronous: 0);
  `finished`: unit -> (its batches, its examples) for units in flight whose every batch the
  model holds though their end was not recorded yet (the save came between the unit's last
  step and its owner's next claim): they are done."""
  old = layout.parts(np.asarray(vector, np.int64))
  old["batches"], old["examples"] = old["batches"].copy(), old["examples"].copy()
  for unit, (batches, examples) in (finished or {}).items():
    if int(old["batches"][unit]) < 0:
      old["batches"][unit], old["examples"][unit] = batches, examples
  handed, resumed = int(old["next"]), int(old["resumed_next"])
  done, in_flight, rest = [], {}, []
  for position, unit in enumerate(int(u) for u in old["order"]):
    if position < resumed:  # Done at an earlier resume (its owner's count was another's).
      done.append(unit)
      continue
    if position >= handed:
      rest.append(unit)
      continue
    batches = int(old["batches"][unit])
    held = position_of(int(old["owner"][unit])) - int(old["first_batch"][unit])
    held = max(min(held, batches) if batches >= 0 else held, 0)
    if batches >= 0 and held == batches:
      done.append(unit)
    else:
      in_flight.update({unit: held} if held else {})
      rest.append(unit)
  new = {name: np.array(value, np.int64, copy=True) for name, value in old.items()}
  again = np.array(rest, np.int64)
  new["order"] = np.array(done + rest, np.int64)
  new["next"] = new["resumed_next"] = np.int64(len(done))
  new["resumed_step"] = np.int64(resumed_step)
  for name, value in (("owner", -1), ("first_batch", 0), ("batches", -1), ("examples", -1),
                      ("skip", 0)):
    new[name][again] = value
  for unit, held in in_flight.items():
    new["skip"][unit] = held
  new["claims"], new["last"] = (np.zeros(MAX_WORKERS, np.int64),
                                np.full(MAX_WORKERS, -1, np.int64))
  header, fields = layout.join(new)
  state = np.concatenate([np.array(header, np.int64)] + fields)
  not_started = [u for u in rest if u not in in_flight]
  return ResumePlan(state, done, in_flight, not_started)
