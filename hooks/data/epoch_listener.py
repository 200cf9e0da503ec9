"""What an epoch hook sees: one worker's statistics of one epoch, and the listener interface.

`EpochInput`'s hook (hooks.data.epoch_driver) calls every registered `EpochListener` at
session start and at each epoch's start and end, in `order`.

Typical usage:
  class MyListener(EpochListener):
    order = 60
    def epoch_ended(self, session, stats): print(stats.epoch, stats.batches, stats.examples)
  epoch_input.add_listener(MyListener())
"""

import dataclasses
from typing import Optional

__all__ = ["EpochListener", "EpochStats"]


@dataclasses.dataclass(frozen=True)
class EpochStats:
  """What one worker trained in one epoch (`started_at`/`ended_at` are time.time()).

  After a resume from a mid-epoch checkpoint `batches` and `examples` count the whole epoch:
  the `skipped_batches` (holding `skipped_examples`) that earlier attempts trained, then this
  attempt's. `started_at` and `ended_at` are this attempt's.
  """
  epoch: int
  batches: int
  examples: int
  started_at: float
  ended_at: float
  skipped_batches: int = 0
  skipped_examples: int = 0


class EpochListener:
  """Base of the hooks that act at epoch boundaries; lower `order` acts first.

  The driver (`EpochInput.hook`) calls `session_created` once, then for each epoch
  `epoch_started` before its first step and `epoch_ended` after its last one.
  """
  order = 50

  def session_created(self, session, start_epoch: int) -> None:
    """Called once with the first epoch this session trains (> 0 after a restart)."""

  def epoch_started(self, session, epoch: int) -> None:
    """Called before the first step of `epoch`, after its iterator read the first batch.

    What the epoch's dataset reads must be set earlier: in `epoch_ended` of the epoch before
    (after the barrier: `order` > 20) or in `session_created`.
    """

  def epoch_ended(self, session, stats: EpochStats) -> None:
    """Called after this worker's last step of `stats.epoch` (at once for an empty shard)."""

  def start_epoch(self, session) -> Optional[int]:
    """A listener that knows the first epoch to train (e.g. from a checkpoint) returns it."""
    return None

  def resume_batches(self, session, epoch: int) -> Optional[int]:
    """Batches of `epoch` (the session's first) trained before a restart: they are skipped."""
    return None
