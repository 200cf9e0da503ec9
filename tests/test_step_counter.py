"""Tests for hooks/sync/step_counter.py: no "global step has not been increased" for a stepping run."""

import logging as std_logging

import pytest
import tensorflow as tf

from hooks.sync import step_counter
from hooks.sync.step_counter import SyncStepCounterHook

v1 = tf.compat.v1
_WARNING = "has not been increased"


def test_exports():
  assert step_counter.__all__ == ["SyncStepCounterHook"]


class _Context:
  """A run_context whose session.run returns the global step after the run."""

  def __init__(self, after):
    self.after = after
    self.reads = 0
    self.session = self

  def run(self, fetches):
    self.reads += 1
    return self.after


def _warnings(caplog, hook_class, runs):
  """Drives the hook with (stale read, step after the run) per run; returns its warnings."""
  with tf.Graph().as_default():
    v1.train.get_or_create_global_step()
    hook = hook_class(every_n_steps=1000)
    hook.begin()
  caplog.set_level(std_logging.WARNING)
  contexts = []
  for stale, after in runs:
    contexts.append(_Context(after))
    hook.after_run(contexts[-1], v1.train.SessionRunValues(stale, None, None))
  return [r.getMessage() for r in caplog.records if _WARNING in r.getMessage()], contexts


@pytest.mark.parametrize("hook_class", [v1.train.StepCounterHook, SyncStepCounterHook])
def test_a_read_that_raced_the_runs_update_is_not_a_stuck_step(caplog, hook_class):
  """Run 2 read the step after its own update (3), run 3 before its own (3): both stepped."""
  warnings, contexts = _warnings(caplog, hook_class, [(1, 2), (3, 3), (3, 4), (4, 5)])
  if hook_class is SyncStepCounterHook:
    assert warnings == []
    # Stock reads once at its first trigger; the hook once more, only for the tie.
    assert [c.reads for c in contexts] == [1, 0, 1, 0]
  else:
    assert len(warnings) == 1  # stock's false alarm, as the loaded chief logged it


def test_a_step_that_really_did_not_move_still_warns(caplog):
  warnings, _ = _warnings(caplog, SyncStepCounterHook, [(5, 5), (5, 5), (5, 5)])
  assert len(warnings) == 2 and "Current value (could be stable): 5 vs previous value: 5" in (
      warnings[0])
