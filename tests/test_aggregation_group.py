"""Tests for hooks/sync/aggregation_group.py: several aggregation threads, one pause per step."""

import threading
import time

import pytest

from hooks.sync.aggregation_group import AggregationGroup


class _FakeAggregator:
  """A SafeSyncTokensHook's chief thread: `steps` aggregations, each a little apart."""

  def __init__(self, steps: int, pace_secs: float):
    self.applied, self._steps, self._pace = 0, steps, pace_secs
    self._callbacks = []
    self.aggregating = False

  def on_aggregated(self, fn):
    self._callbacks.append(fn)

  def use_liveness(self, monitor, epoch_fn=lambda: None):
    self.monitor = monitor

  def run(self):
    self.aggregating = True
    try:
      for _ in range(self._steps):
        time.sleep(self._pace)
        self.applied += 1  # The aggregation run's apply.
        for fn in self._callbacks:
          fn("session", 3)
    finally:
      self.aggregating = False


def _run(aggregators, timeout=30.0):
  threads = [threading.Thread(target=a.run, daemon=True) for a in aggregators]
  for a in aggregators:
    a.aggregating = True  # As the hooks do before their threads start.
  for t in threads:
    t.start()
  for t in threads:
    t.join(timeout)
  assert not any(t.is_alive() for t in threads)


@pytest.mark.parametrize("paces", [(0.0, 0.002), (0.003, 0.0), (0.001, 0.001, 0.0)])
def test_the_callback_sees_every_optimizer_after_the_same_step_and_nothing_moves(paces):
  aggregators = [_FakeAggregator(60, pace) for pace in paces]
  group = AggregationGroup(aggregators)
  seen = []

  def save(session, grads):
    before = [a.applied for a in aggregators]
    time.sleep(0.002)  # A save takes a while: no thread may apply meanwhile.
    seen.append((before, [a.applied for a in aggregators], grads))

  group.on_aggregated(save)
  _run(aggregators)
  assert len(seen) == 60
  for step, (before, after, grads) in enumerate(seen, start=1):
    assert before == after == [step] * len(paces)
    assert grads == 3


def test_one_optimizers_callback_alone_races_the_other():
  """What the group prevents: registered on one hook only, the other thread moves on."""
  aggregators = [_FakeAggregator(60, 0.0), _FakeAggregator(60, 0.0005)]
  seen = []
  aggregators[0].on_aggregated(lambda s, g: seen.append([a.applied for a in aggregators]))
  _run(aggregators)
  assert any(len(set(applied)) > 1 for applied in seen)


def test_a_waiting_thread_goes_on_when_a_peer_stops_aggregating():
  fast, stopped = _FakeAggregator(5, 0.0), _FakeAggregator(0, 0.0)
  group = AggregationGroup([fast, stopped])
  calls = []
  group.on_aggregated(lambda s, g: calls.append(g))
  started = time.monotonic()
  fast.aggregating = True
  fast.run()  # `stopped` never aggregates: each wait gives up at the next poll.
  assert time.monotonic() - started < 5 * 0.2 + 1.0
  assert calls == []


def test_use_liveness_reaches_every_hook_and_an_empty_group_is_refused():
  aggregators = [_FakeAggregator(0, 0.0), _FakeAggregator(0, 0.0)]
  AggregationGroup(aggregators).use_liveness("monitor")
  assert [a.monitor for a in aggregators] == ["monitor", "monitor"]
  with pytest.raises(ValueError, match="at least one"):
    AggregationGroup([])


def test_a_peer_that_aggregates_but_never_finishes_the_step_is_given_up_at_the_deadline():
  fast, stuck = _FakeAggregator(3, 0.0), _FakeAggregator(0, 0.0)
  stuck.aggregating = True  # Alive, but its step never completes.
  group = AggregationGroup([fast, stuck], max_wait_secs=0.5)
  calls = []
  group.on_aggregated(lambda s, g: calls.append(g))
  started = time.monotonic()
  fast.run()
  assert 0.5 <= time.monotonic() - started < 0.5 + 1.0  # Once: then the group is given up.
  assert calls == []
