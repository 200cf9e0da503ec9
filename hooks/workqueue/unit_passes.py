"""EpochInput's passes from the work queue: each pass is one unit this worker claimed.

The epoch's first pass claims the worker's first unit; when a unit's pass ends, the next
claim records it (batches, examples) and takes the next one, in one run on ps:0; the claim
that finds the queue empty ends the worker's epoch. One claim per unit, none per step.

Typical usage (hooks.workqueue.work_queue_input builds it):
  passes = UnitPasses(claims, unit_placeholder, units, task_name="worker:1")
  epoch_input = EpochInput(dataset, num_epochs, task_name, passes=passes)
"""

import dataclasses
from typing import Any, Dict, List, Optional, Sequence, Tuple

import tensorflow as tf

from hooks import log as logging
from hooks.errors import ConfigError
from hooks.data.passes import PassEnd, PassSource, PassStart
from hooks.workqueue.claims import Claim, UnitClaims
from hooks.workqueue import elastic_graph
from hooks.workqueue.queue_graph import ANY, NONE
from hooks.workqueue.replay import UnitReplay
from hooks.workqueue.units import WorkUnit

__all__ = ["UnitPasses", "QueueBuild", "work_queue_of"]


@dataclasses.dataclass(frozen=True)
class QueueBuild:
  """What a queue's graph was built for: the hooks' settings and cluster must agree with it
  (`hooks.session.wiring` refuses a mismatch before the first step)."""
  num_workers: int
  elastic: bool
  sync: bool


class UnitPasses(PassSource):
  """A pass per claimed unit, fed through `unit_feed` (the unit's index; -1: no unit); a unit
  a mid-epoch checkpoint holds in part starts after its batches trained before."""
  skips_by_pass = True

  def __init__(self, claims: UnitClaims, unit_feed: Any, units: Sequence[WorkUnit],
               task_name: str, records_are_examples: bool = True,
               cardinality: Optional[Tuple[Any, Any]] = None,
               replay: Optional[UnitReplay] = None, gate_batches: bool = True,
               built: Optional[QueueBuild] = None):
    self._gate_batches = gate_batches  # (elastic) False: a synchronous step's marker is gated
    self._gate_enabled = None  # (elastic, asynchronous) the batch gate's switch
    self.built = built  # What the queue's graph was built for (None: not said).
    self.claims, self._feed, self.units, self.task_name = claims, unit_feed, units, task_name
    self._replay, self._replayed = replay, None  # The units this worker takes this epoch.
    self.records_are_examples = records_are_examples
    self._cardinality, self._checked = cardinality, False  # (unit feed, unit_fn's cardinality)
    self._unit = -1
    self.trained: Dict[int, list] = {}  # epoch -> [(unit, batches, examples)], this worker's
    # (Elastic, the chief) epoch -> {unit: [(lost worker id, its batches of the unit in the
    # model)], in the order they were trained}: units taken back from lost workers, for the audit.
    self.taken_back: Dict[int, Dict[int, List[Tuple[int, int]]]] = {}

  def take_back(self, epoch: int, unit: int, worker_id: int, batches: int) -> None:
    """(Elastic, the chief) Records that lost worker `worker_id` put `batches` of `unit` in the
    model before the unit went back to the queue: a part after the unit's earlier parts, whoever
    trained them (another lost worker, or its own earlier process)."""
    self.taken_back.setdefault(epoch, {}).setdefault(unit, []).append((worker_id, batches))

  def batch_gate(self, after: tf.Operation) -> Optional[tf.Operation]:
    """(Elastic) The gate each step's batch passes (hooks.workqueue.elastic_graph)."""
    ops = self.claims.ops
    if ops.gated is None or not self._gate_batches:
      return None
    self._gate_enabled = tf.compat.v1.placeholder_with_default(True, [], "input_gate_enabled")
    return elastic_graph.gate(ops, self.claims.worker_id, after, self.claims.identity,
                              self._gate_enabled)

  def step_feeds(self) -> Dict[Any, Any]:
    """The batch's gate is off where the step's apply is admitted (an ElasticOptimizer:
    hooks.sync.elastic_apply), which counts the batch after its apply."""
    if self._gate_enabled is None:
      return {}
    graph = self._gate_enabled.graph
    return {self._gate_enabled: False} if elastic_graph.applies_if_admitted(graph) else {}

  def first_pass(self, session, epoch: int, epoch_batches: int = 0) -> PassStart:
    self.trained.setdefault(epoch, [])
    self._replayed = self._replay.units_of(epoch, self.task_name) if self._replay else None
    claim = self._take(self.claims.claim(session, epoch, epoch_batches,
                                         wanted=self._wanted()), epoch)
    self._check_one_pass(session)
    return PassStart({self._feed: claim.unit}, claim.skip)

  def next_pass(self, session, epoch: int, ended: PassEnd) -> Optional[PassStart]:
    if self._unit < 0:
      return None  # The queue had no unit left for this worker: none comes back this epoch.
    finished = (self._unit, ended.batches, ended.examples)
    self.trained[epoch].append(finished)
    claim = self._take(self.claims.claim(session, epoch, ended.epoch_batches, finished,
                                         self._wanted()), epoch)
    return None if claim.unit < 0 else PassStart({self._feed: claim.unit}, claim.skip)

  def feeds_of(self, unit: int) -> Dict[Any, int]:
    """The feeds that select `unit`'s pass (e.g. for EpochInput.count_examples)."""
    return {self._feed: unit}

  def batches_of(self, session, unit: int) -> Optional[int]:
    """How many batches `unit_fn` gives `unit`, where tf.data knows without reading (a record
    range batched); None where it does not (a file's records are counted by reading it)."""
    if self._cardinality is None:
      return None
    feed, cardinality = self._cardinality
    count = int(session.run(cardinality, {feed: unit}))
    return count if count >= 0 else None

  def _wanted(self) -> int:
    """ANY, or in a replayed epoch the next unit this worker trained then (NONE after its
    last)."""
    if self._replayed is None:
      return ANY
    return self._replayed.pop(0) if self._replayed else NONE

  def _check_one_pass(self, session) -> None:
    """Once per session, before the first step: unit_fn's dataset of the first unit this worker
    took must not be infinite (a repeat() would train that unit for ever)."""
    if self._checked or self._cardinality is None or self._unit < 0:
      return
    self._checked = True
    feed, cardinality = self._cardinality
    if int(session.run(cardinality, {feed: self._unit})) == tf.data.INFINITE_CARDINALITY:
      raise ConfigError(
          f"{self.task_name}: unit_fn returned an infinite (repeated) dataset for unit "
          f"{self.units[self._unit]}: return one pass over the unit's records; remove .repeat() "
          "(every epoch hands each unit out once)")

  def _take(self, claim: Claim, epoch: int) -> Claim:
    self._unit = claim.unit
    if claim.unit >= 0:
      resumed = (f", resumed after the {claim.skip} batches of it the model holds"
                 if claim.skip else "")
      logging.info("%s took unit %d (%s) in epoch %d%s", self.task_name, claim.unit,
                   self.units[claim.unit], epoch, resumed)
    else:
      logging.info("%s: no unit left in epoch %d", self.task_name, epoch)
    return claim


def work_queue_of(epoch_input: Any) -> Optional["UnitPasses"]:
  """The work queue an EpochInput's passes come from; None for a static shard."""
  passes = getattr(epoch_input, "passes", None)
  return passes if isinstance(passes, UnitPasses) else None
