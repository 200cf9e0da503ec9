"""Where an epoch's passes come from: EpochInput's one pass over its dataset, or units handed out.

An epoch of `EpochInput` is one or more passes over its dataset, each started with a fresh
iterator and the feeds its source gives. The default source gives one pass per epoch (the
worker's static shard). A work queue (hooks.workqueue) gives one pass per unit it hands this
worker, until none is left: the epoch ends for the worker when its source has no next pass.

Typical usage (a source that hands out three passes per epoch, feeding `part`):
  class ThreeParts(PassSource):
    def first_pass(self, session, epoch): self._left = 2; return {part: 0}
    def next_pass(self, session, epoch, ended):
      self._left -= 1
      return None if self._left < 0 else {part: 2 - self._left}
"""

import dataclasses
from typing import Any, Dict, Optional

__all__ = ["PassSource", "PassEnd"]


@dataclasses.dataclass(frozen=True)
class PassEnd:
  """The pass that just ended: its batches and examples, and the worker's epoch batches so far."""
  batches: int
  examples: int
  epoch_batches: int


class PassSource:
  """One pass per epoch, fed nothing: the static shard. Subclasses hand out more."""

  def first_pass(self, session, epoch: int) -> Dict[Any, Any]:
    """The feeds of the epoch's first pass (it runs with the epoch's start ops; it may be
    empty)."""
    del session, epoch
    return {}

  def next_pass(self, session, epoch: int, ended: PassEnd) -> Optional[Dict[Any, Any]]:
    """After a pass ended: the feeds of the next one, or None when the epoch has no more."""
    del session, epoch, ended
    return None
