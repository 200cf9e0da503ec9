"""AggregationLoop.check_lost, in-process: an aggregation run (or its read) TensorFlow lost is
left behind with its thread and a new thread goes on with the same run; a run that began on
every ps is only waiting; a run lost too often, or one left behind that comes back done, ends
the process. The real runs are replaced by a fake session (the cluster test is
tests/test_faults.py::test_an_aggregation_run_tensorflow_lost_runs_again_and_the_job_stays_exact).
"""

import threading
import time

from hooks.faults import step_runner
from hooks.faults.stuck_step import MAX_LOST
from hooks.sync.aggregation_loop import AggregationLoop

LOST_AFTER = 0.2


class _FakeSession:
  """make_callable("aggregate") applies a step (begun += 1 first, as on every ps) unless the
  call's number is in `lose` (then it blocks and runs nothing); make_callable("last") returns
  1 per step, then -1 (STOP) after `steps` steps; `lose_reads` blocks those reads."""

  def __init__(self, steps, lose=(), lose_reads=(), lost_returns=False):
    self.begun, self.applied, self.steps = 0, 0, steps
    self.lose, self.lose_reads, self.lost_returns = set(lose), set(lose_reads), lost_returns
    self.calls = {"aggregate": 0, "last": 0}
    self.release = threading.Event()

  def make_callable(self, name):
    def call():
      self.calls[name] += 1
      if name == "aggregate":
        if self.calls[name] in self.lose:
          self.release.wait(10)
          if not self.lost_returns:
            raise RuntimeError("the lost run, cancelled at last")
        self.begun += 1
        self.applied += 1
        return None
      if self.calls[name] in self.lose_reads:
        self.release.wait(10)
        raise RuntimeError("the lost read, cancelled at last")
      return 1 if self.applied <= self.steps else -1
    return call

  def run(self, fetch, options=None):
    assert fetch == "begun"
    return self.begun


def _loop(exits):
  return AggregationLoop("worker:0", "aggregate", "last", "count", begun="begun",
                         lost_after_secs=LOST_AFTER, exit_fn=exits.append)


def _drive(loop, session, secs=10.0, stop=lambda: False):
  """Runs the loop as SafeSyncTokensHook does: a thread, and check_lost from another, until
  the current thread ends, `stop()` or `secs`."""
  def run(generation):
    try:
      loop.run(session, lambda: False, generation)
    except RuntimeError:  # a lost run released at the test's end, after the "process" ended
      pass
  threads = [threading.Thread(target=run, args=(0,), daemon=True)]
  threads[0].start()
  deadline = time.monotonic() + secs
  while threads[-1].is_alive() and time.monotonic() < deadline and not stop():
    if loop.check_lost(session):
      threads.append(threading.Thread(target=run, args=(loop.generation,), daemon=True))
      threads[-1].start()
    time.sleep(0.02)
  return threads


def test_a_lost_aggregation_run_runs_again_on_a_new_thread_once(caplog):
  exits, session = [], _FakeSession(steps=5, lose=[3])
  loop = _loop(exits)
  threads = _drive(loop, session)
  assert not threads[-1].is_alive() and len(threads) == 2
  assert session.applied == 6 and loop.num_updates == 5  # 5 steps, then the STOP run
  assert step_runner.runs_left_behind(session) == 1 and not exits
  assert ("worker:0: the aggregation run has been in TensorFlow's session.run for 0 s and never "
          "started on every ps") in caplog.text
  assert "a new aggregation thread runs it again (retry 1 of 3)" in caplog.text
  session.release.set()  # the lost run ends with an error at last: its thread just stops
  threads[0].join(2)
  assert not threads[0].is_alive() and not exits and session.applied == 6


def test_a_lost_read_of_the_aggregation_is_read_again_and_the_step_applied_once():
  exits, session = [], _FakeSession(steps=4, lose_reads=[2])
  loop = _loop(exits)
  threads = _drive(loop, session)
  assert len(threads) == 2 and session.applied == 5 and loop.num_updates == 4
  assert session.calls["aggregate"] == 5  # the new thread read again, it did not aggregate
  session.release.set()


def test_a_run_that_began_on_every_ps_is_only_waiting_for_the_markers():
  exits, session = [], _FakeSession(steps=2)
  loop = _loop(exits)
  started = threading.Event()
  slow = session.make_callable

  def make_callable(name):
    call = slow(name)
    if name != "aggregate":
      return call

    def waiting():  # began on every ps, then waits for the workers' markers
      if session.calls["aggregate"] == 1:
        session.begun += 1
        started.set()
        time.sleep(4 * LOST_AFTER)
        session.begun -= 1
      return call()
    return waiting
  session.make_callable = make_callable
  threads = _drive(loop, session)
  assert started.is_set() and len(threads) == 1 and loop.num_updates == 2 and not exits


def test_a_run_lost_more_than_max_lost_times_ends_the_process(caplog):
  exits, session = [], _FakeSession(steps=3, lose=range(2, 2 + MAX_LOST + 1))
  loop = _loop(exits)
  _drive(loop, session, secs=5 + MAX_LOST * 2 * LOST_AFTER, stop=lambda: bool(exits))
  assert exits == [1]
  assert f"It was lost {MAX_LOST + 1} times; this process ends now" in caplog.text
  session.release.set()


def test_a_run_left_behind_that_comes_back_done_ends_the_process(caplog):
  exits, session = [], _FakeSession(steps=3, lose=[2], lost_returns=True)
  loop = _loop(exits)
  threads = _drive(loop, session)
  assert not exits and session.applied == 4
  session.release.set()  # it applied a step after all
  threads[0].join(2)
  assert exits == [1] and "came back done, after another thread ran it again" in caplog.text
