"""StuckStepWatchdog: a step TensorFlow lost, or an asynchronous step past its timeout, ends the
process; a slow step whose part on this task started does not."""

import threading
import time
import types

import pytest
import tensorflow as tf

from hooks.config.cluster import ClusterConfig
from hooks.config.settings import EpochSyncSettings
from hooks.faults.step_watch import StepWatch
from hooks.faults import stuck_step
from hooks.faults.stuck_step import StuckStepWatchdog
from hooks.session import wiring


def _watchdog(exits, timeout=0.6, warn_after=0.2):
  return StuckStepWatchdog("worker:1", StepWatch(timeout, warn_after, 0.1),
                           lost_after_secs=1000, exit_fn=exits.append)


def test_a_step_past_its_timeout_warns_then_ends_the_process(caplog):
  exits = []
  watchdog = _watchdog(exits)
  watchdog.start()
  for _ in range(7):
    watchdog.before_step()
  with watchdog.step():
    deadline = time.monotonic() + 5
    while not exits and time.monotonic() < deadline:
      time.sleep(0.02)
  watchdog.stop()
  assert exits == [1]
  text = caplog.text
  assert "worker:1: step 7 of this task has been in TensorFlow's session.run for" in text
  assert "WARNING" in text and "ERROR" in text
  assert "this process ends now (exit status 1)" in text
  assert "--epochsync_step_timeout_secs" in text


def test_quick_steps_and_the_time_between_steps_never_end_it():
  exits = []
  watchdog = _watchdog(exits, timeout=0.3, warn_after=0.2)
  watchdog.start()
  for _ in range(20):
    watchdog.before_step()
    with watchdog.step():
      time.sleep(0.02)
    time.sleep(0.05)  # 1 s between steps in all: only time inside a step counts
  time.sleep(0.5)
  watchdog.stop()
  assert exits == []


def test_a_step_that_raises_is_no_longer_watched():
  exits = []
  watchdog = _watchdog(exits, timeout=0.3)
  watchdog.start()
  with pytest.raises(RuntimeError):
    with watchdog.step():
      raise RuntimeError("the step failed")
  time.sleep(0.6)
  watchdog.stop()
  assert exits == []


def test_start_is_idempotent_and_stop_ends_the_thread():
  # A task name of its own: the other tests' watchdogs (worker:1) may still be winding down.
  watchdog = StuckStepWatchdog("worker:7", StepWatch(0.6, 0.2, 0.1), lost_after_secs=1000,
                               exit_fn=[].append)
  name = "epochsync-stuck-step-worker:7"
  watchdog.start()
  watchdog.start()
  assert len([t for t in threading.enumerate() if t.name == name]) == 1
  watchdog.stop()
  deadline = time.monotonic() + 3
  while time.monotonic() < deadline and any(t.name == name for t in threading.enumerate()):
    time.sleep(0.05)
  assert not any(t.name == name for t in threading.enumerate())


def _marked(lost_after=0.3):
  """A watchdog with its step marker in a local session."""
  exits = []
  watchdog = StuckStepWatchdog("worker:1", lost_after_secs=lost_after, exit_fn=exits.append)
  graph = tf.Graph()
  with graph.as_default():
    watchdog.build("/cpu:0")
    init = tf.compat.v1.local_variables_initializer()
  session = tf.compat.v1.Session(graph=graph)
  session.run(init)
  watchdog.bind(session)
  return watchdog, session, exits


def _wait_for(exits, secs):
  deadline = time.monotonic() + secs
  while not exits and time.monotonic() < deadline:
    time.sleep(0.02)


def test_a_step_whose_part_here_never_started_is_lost_and_ends_the_process(caplog):
  watchdog, session, exits = _marked()
  watchdog.start()
  session.run(**_args(watchdog.before_step()))  # step 1 started here
  with watchdog.step("train"):
    time.sleep(0.05)
  watchdog.before_step()  # step 2: its run never reaches this task (the marker stays at 1)
  with watchdog.step("train"):
    _wait_for(exits, 5)
  watchdog.stop()
  assert exits == [1]
  assert ("worker:1: step 2 of this task has been in TensorFlow's session.run for 0 s and its "
          "part on this task never started") in caplog.text


def test_the_first_step_of_a_kind_is_not_lost_while_its_graph_is_registered():
  watchdog, _, exits = _marked()
  watchdog.start()
  watchdog.before_step()  # the marker stays behind: partitions not issued yet
  with watchdog.step("train with summaries"):
    time.sleep(1.0)
  watchdog.stop()
  assert exits == []


def test_a_slow_step_that_started_here_is_left_alone():
  watchdog, session, exits = _marked()
  watchdog.start()
  session.run(**_args(watchdog.before_step()))
  with watchdog.step():
    time.sleep(1.2)  # four times lost_after_secs: probed once, found started
  watchdog.stop()
  assert exits == []


def _args(run_args):
  return {"fetches": run_args.fetches, "feed_dict": run_args.feed_dict}


@pytest.mark.parametrize("sync,has_sync_hook,timeout", [(False, False, True), (True, False, False),
                                                         (False, True, False)])
def test_every_job_gets_one_and_an_asynchronous_one_has_the_timeout(sync, has_sync_hook, timeout):
  config = ClusterConfig.from_tf_config(
      '{"cluster": {"worker": ["localhost:1", "localhost:2"], "ps": ["localhost:3"]},'
      ' "task": {"type": "worker", "index": 1}}')
  settings = EpochSyncSettings(sync=sync, step_timeout_secs=50.0)
  watchdog = wiring._stuck_step_watchdog(config, settings, object() if has_sync_hook else None)  # pylint: disable=protected-access
  assert watchdog.task_name == "worker:1"
  assert (watchdog._watch is not None) == timeout  # pylint: disable=protected-access
  assert watchdog._lost_after == 12.5  # pylint: disable=protected-access  # a quarter of 50 s


def test_the_step_runner_benchmark_measures_both_ways():
  from bench import step_runner_cost  # pylint: disable=import-outside-toplevel
  result = step_runner_cost.measure(pairs=2, runs=20)
  assert len(result["pairs"]) == 2
  for row in result["pairs"]:
    assert row["direct_wall_us"] > 0 and row["runner_wall_us"] > 0
  assert set(result["summary"]) == {"direct_wall_us", "runner_wall_us", "extra_wall_us",
                                    "extra_cpu_us"}


def test_a_process_frozen_inside_a_step_restarts_its_clock_instead_of_ending(caplog, monkeypatch):
  """SIGSTOP for longer than the timeout, seen as a jump of the clock between two polls: that
  time is not the step's (an elastic worker's next step then meets its fence)."""
  jump = [0.0]
  clock = lambda: time.monotonic() + jump[0]
  monkeypatch.setattr(stuck_step, "time", types.SimpleNamespace(monotonic=clock))
  exits = []
  watchdog = StuckStepWatchdog("worker:1", StepWatch(3.0, 2.5, 0.1, clock=clock),
                               lost_after_secs=1000, exit_fn=exits.append)
  with caplog.at_level("INFO", logger="absl"):  # absl sets its own level once flags parse
    watchdog.start()
    watchdog.before_step()
    with watchdog.step():
      time.sleep(0.5)
      jump[0] = 10.0  # the whole process stood still for 10 s
      time.sleep(1.5)
    watchdog.stop()
  assert exits == []
  assert "worker:1 did not run for 10 s (frozen" in caplog.text
