"""Tests for hooks/epoch/progress.py: one line per epoch, and at most one per `every_secs` within it."""

import re

import numpy as np
import pytest
import tensorflow as tf

from hooks.epoch import progress as progress_lib
from hooks.data.epoch_input import EpochInput
from hooks.errors import ConfigError
from hooks.epoch.progress import EpochProgressHook
from tf_unit import graph, v1  # noqa: F401  (graph: a fresh graph per test)
from tf_unit import train as _train


class _Clock:
  """A monotonic clock that advances `tick` seconds at every reading."""

  def __init__(self, tick):
    self.now, self.tick = 0.0, tick

  def __call__(self):
    self.now += self.tick
    return self.now


def _run(caplog, dataset, every_secs, tick, num_epochs=2):
  epoch_input = EpochInput(dataset, num_epochs=num_epochs, task_name="worker:1")
  global_step = v1.train.get_or_create_global_step()
  train_op = tf.group(tf.reduce_sum(epoch_input.get_next()), v1.assign_add(global_step, 1))
  hook = EpochProgressHook(epoch_input, every_secs=every_secs, clock=_Clock(tick))
  with caplog.at_level("INFO", logger="absl"):  # absl sets its own level once flags parse
    _train([hook, epoch_input.hook], train_op)
  return [r.getMessage() for r in caplog.records if r.getMessage().startswith("progress ")]


def test_exports():
  assert sorted(progress_lib.__all__) == ["EpochProgressHook", "PREFIX"]


@pytest.mark.parametrize("every_secs", [0, -1.0, float("inf"), True])
def test_rejects_bad_every_secs(every_secs):
  epoch_input = EpochInput(tf.data.Dataset.range(2), num_epochs=1)
  with pytest.raises(ConfigError, match=r"every_secs=.* must be a finite number of seconds > 0 "
                                        r"\(--epochsync_progress_secs\)"):
    EpochProgressHook(epoch_input, every_secs=every_secs)


def test_one_line_per_epoch_when_epochs_are_short(caplog):
  data = tf.data.Dataset.from_tensor_slices(np.arange(10, dtype=np.float32)).batch(4)
  lines = _run(caplog, data, every_secs=100, tick=0.5)
  assert len(lines) == 2
  for epoch, line in enumerate(lines):
    assert re.fullmatch(rf"progress worker:1 epoch {epoch} done: 3/3 batches of its shard, 10 "
                        r"examples in [0-9.]+ s, [0-9.]+ examples/s", line), line


def test_long_epochs_get_lines_in_between_at_most_every_secs(caplog):
  data = tf.data.Dataset.from_tensor_slices(np.arange(40, dtype=np.float32)).batch(4)  # 10 batches
  lines = _run(caplog, data, every_secs=10, tick=4.0, num_epochs=1)
  # One clock reading per step (4 s each) plus one at the epoch's start and end: a line at
  # most every 10 s, i.e. after every third step.
  between = [l for l in lines if " done:" not in l]
  assert between and len(between) <= 10 * 4 / 10
  assert re.fullmatch(r"progress worker:1 epoch 0: \d/10 batches of its shard, \d+ examples in "
                      r"[0-9.]+ s, [0-9.]+ examples/s", between[0]), between[0]
  assert lines[-1].startswith("progress worker:1 epoch 0 done: 10/10 batches of its shard, 40 ")


def test_unknown_shard_size_counts_so_far_then_uses_the_last_epoch(caplog):
  data = (tf.data.Dataset.from_tensor_slices(np.arange(40, dtype=np.float32))
          .filter(lambda x: x >= 0).batch(4))  # cardinality unknown to TensorFlow
  lines = _run(caplog, data, every_secs=10, tick=4.0, num_epochs=2)
  epoch0 = [l for l in lines if " epoch 0:" in l]
  epoch1 = [l for l in lines if " epoch 1:" in l]
  assert epoch0 and all(" batches so far, " in l for l in epoch0)
  assert epoch1 and all("/10 batches of its shard" in l for l in epoch1)


def test_the_epoch_end_is_logged_once_with_the_hook_and_by_epoch_input_without_it(caplog):
  """Each fact once: the progress line replaces EpochInput's own `epoch N done` line."""
  with caplog.at_level("INFO", logger="absl"):
    _run(caplog, tf.data.Dataset.range(4).batch(2), every_secs=100, tick=0.5, num_epochs=1)
  ends = [r.getMessage() for r in caplog.records if "epoch 0 done" in r.getMessage()]
  assert len(ends) == 1 and ends[0].startswith("progress worker:1 epoch 0 done: 2/2 batches")
  caplog.clear()
  with tf.Graph().as_default():
    epoch_input = EpochInput(tf.data.Dataset.range(4).batch(2), num_epochs=1, task_name="w:0")
    train_op = tf.reduce_sum(epoch_input.get_next())
    with caplog.at_level("INFO", logger="absl"):
      _train([epoch_input.hook], train_op)
  ends = [r.getMessage() for r in caplog.records if "epoch 0 done" in r.getMessage()]
  assert len(ends) == 1 and ends[0].startswith("w:0: epoch 0 done: 2 batches, 4 examples")
