"""Where an epoch's passes come from: EpochInput's one pass over its dataset, or units handed out.

An epoch of `EpochInput` is one or more passes over its dataset, each started with a fresh
iterator and the feeds its source gives. The default source gives one pass per epoch (the
worker's static shard). A work queue (hooks.workqueue) gives one pass per unit it hands this
worker, until none is left: the epoch ends for the worker when its source has no next pass.

A pass can start after `skip` batches of it that a mid-epoch checkpoint already holds (a work
queue's unit resumed): the driver skips them and counts them in the pass (PassEnd), not in
the worker's steps.

Typical usage (a source that hands out three passes per epoch, feeding `part`):
  class ThreeParts(PassSource):
    def first_pass(self, session, epoch, epoch_batches): self._left = 2; return PassStart({part: 0})
    def next_pass(self, session, epoch, ended):
      self._left -= 1
      return None if self._left < 0 else PassStart({part: 2 - self._left})
"""

import dataclasses
from typing import Any, Dict, Optional

__all__ = ["PassSource", "PassStart", "PassEnd"]


@dataclasses.dataclass(frozen=True)
class PassStart:
  """A pass to start: its feeds, and the batches of it to skip (None: the first pass of the
  static shard, which skips what the epoch's resume says)."""
  feeds: Dict[Any, Any] = dataclasses.field(default_factory=dict)
  skip: Optional[int] = None


@dataclasses.dataclass(frozen=True)
class PassEnd:
  """The pass that just ended: its batches and examples (a resumed pass's skipped ones
  included), and the worker's epoch batches so far (its position in the epoch's steps)."""
  batches: int
  examples: int
  epoch_batches: int


class PassSource:
  """One pass per epoch, fed nothing: the static shard. Subclasses hand out more."""

  # True: the examples of a resumed epoch's skipped batches are counted per pass (PassStart's
  # skip), not over the epoch's dataset (a work queue's units are not the worker's shard).
  skips_by_pass = False

  def batch_gate(self, after: Any) -> Optional[Any]:
    """An op each step's batch waits for before it reaches the model, run after `after` (the
    step's take of the batch), or None (here: none). An elastic work queue's counts the batch
    or fails the step of a fenced worker."""
    del after
    return None

  def step_feeds(self) -> Dict[Any, Any]:
    """Feeds of every step that takes a batch, known once the graph is built (here: none). An
    elastic queue's turn its batch gate off where the step's apply is admitted instead."""
    return {}

  def first_pass(self, session, epoch: int, epoch_batches: int = 0) -> PassStart:
    """The epoch's first pass (it runs with the epoch's start ops; it may be empty).
    `epoch_batches`: the worker's position in the epoch (a resumed synchronous epoch: S)."""
    del session, epoch, epoch_batches
    return PassStart()

  def next_pass(self, session, epoch: int, ended: PassEnd) -> Optional[PassStart]:
    """After a pass ended: the next one, or None when the epoch has no more."""
    del session, epoch, ended
    return None
