"""Progress a person can watch: one line per worker per epoch, and one every few seconds in between.

Each line starts with "progress " and says how many batches of its shard the worker has done,
its examples and its examples/s, e.g.

    progress worker:1 epoch 2 done: 5/5 batches of its shard, 40 examples in 0.41 s, 97.6 examples/s
    progress worker:1 epoch 2: 37/53 batches of its shard, 296 examples in 10.0 s, 29.6 examples/s

The shard's size comes from the dataset's cardinality when TensorFlow knows it, else from the
previous epoch (the first epoch then shows "37 batches so far"). `./es demo` echoes these lines.

Typical usage:
  progress = EpochProgressHook(epoch_input, every_secs=10)
  hooks = [done, barrier, progress, epoch_input.hook]
"""

import math
import time
from typing import Callable, Optional

import tensorflow as tf

from hooks import log as logging
from hooks.data.epoch_input import EpochInput, EpochListener, EpochStats
from hooks.errors import ConfigError

__all__ = ["EpochProgressHook", "PREFIX"]

_v1 = tf.compat.v1
PREFIX = "progress "


class EpochProgressHook(_v1.train.SessionRunHook, EpochListener):
  """Logs this worker's progress at each epoch's end and at most every `every_secs` within one.

    progress = EpochProgressHook(epoch_input, every_secs=10)
    with tf.compat.v1.train.MonitoredSession(..., hooks=[progress, epoch_input.hook]) as sess:
      while not sess.should_stop(): sess.run(train_op)

  Args:
    epoch_input: the `EpochInput` whose epochs are reported.
    every_secs: `float` > 0, the shortest time between two lines within an epoch.
    clock: `Callable[[], float]` monotonic clock (tests inject one).

  Raises:
    ConfigError: if `every_secs` is not a finite number > 0.
  """

  order = 5  # Before the done signal and the barrier: the line is written before any wait.
  logs_epoch_end = True  # EpochInput leaves the epoch's end to this hook's line.

  def __init__(self, epoch_input: EpochInput, every_secs: float = 10.0,
               clock: Callable[[], float] = time.monotonic):
    if (not isinstance(every_secs, (int, float)) or isinstance(every_secs, bool) or
        not math.isfinite(every_secs) or every_secs <= 0):
      raise ConfigError(f"EpochProgressHook: every_secs={every_secs!r} must be a finite number "
                        "of seconds > 0 (--epochsync_progress_secs)")
    self._input, self._every, self._clock = epoch_input, float(every_secs), clock
    self._shard_batches: Optional[int] = None
    self._session = None  # Until the shard's size was read.
    self._epoch_start = self._last_line = 0.0
    epoch_input.add_listener(self)

  def after_create_session(self, session, coord):
    self._shard_batches, self._session = None, session  # The size is read at the first line.

  def epoch_started(self, session, epoch: int) -> None:
    self._epoch_start = self._last_line = self._clock()

  def after_run(self, run_context, run_values):
    now = self._clock()
    if now - self._last_line < self._every:
      return
    self._last_line = now
    if self._session is not None:  # Once, off the start-up: the shard's size if TF knows it.
      cardinality = int(self._session.run(self._input.batches_per_epoch_tensor))
      self._shard_batches, self._session = (cardinality if cardinality >= 0 else None), None
    driver = self._input.hook
    self._log(driver.epoch, driver.batches, driver.examples, now - self._epoch_start, "")

  def epoch_ended(self, session, stats: EpochStats) -> None:
    # The epoch's own times, as in the audit (which the demo's final table shows).
    self._log(stats.epoch, stats.batches, stats.examples, stats.ended_at - stats.started_at,
              " done")
    self._shard_batches, self._session = stats.batches, None  # The next epoch: the same shard.

  def _log(self, epoch: int, batches: int, examples: int, secs: float, done: str) -> None:
    total = batches if done else self._shard_batches  # At its end the whole shard is done.
    of = (f"{batches}/{total} batches of its shard" if total is not None else
          f"{batches} batches so far")
    rate = f"{examples / secs:.1f}" if secs > 0 else "-"
    logging.info("%s%s epoch %d%s: %s, %d examples in %.2f s, %s examples/s", PREFIX,
                 self._input.task_name, epoch, done, of, examples, secs, rate)
