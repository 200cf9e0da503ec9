"""StuckStepWatchdog: a step that never comes back from session.run ends the process."""

import threading
import time

import pytest

from hooks.config.cluster import ClusterConfig
from hooks.config.settings import EpochSyncSettings
from hooks.faults.step_watch import StepWatch
from hooks.faults.stuck_step import StuckStepWatchdog
from hooks.session import wiring


def _watchdog(exits, timeout=0.6, warn_after=0.2):
  return StuckStepWatchdog("worker:1", StepWatch(timeout, warn_after, 0.1),
                           exit_fn=exits.append)


def test_a_step_past_its_timeout_warns_then_ends_the_process(caplog):
  exits = []
  watchdog = _watchdog(exits)
  watchdog.start()
  with watchdog.step(7):
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
  for number in range(20):
    with watchdog.step(number):
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
    with watchdog.step(1):
      raise RuntimeError("the step failed")
  time.sleep(0.6)
  watchdog.stop()
  assert exits == []


def test_start_is_idempotent_and_stop_ends_the_thread():
  watchdog = _watchdog([])
  watchdog.start()
  watchdog.start()
  names = [t.name for t in threading.enumerate() if t.name == "epochsync-stuck-step-worker:1"]
  assert len(names) == 1
  watchdog.stop()
  deadline = time.monotonic() + 3
  while time.monotonic() < deadline and any(
      t.name == "epochsync-stuck-step-worker:1" for t in threading.enumerate()):
    time.sleep(0.05)
  assert not any(t.name == "epochsync-stuck-step-worker:1" for t in threading.enumerate())


@pytest.mark.parametrize("sync,has_sync_hook,expected", [(False, False, True), (True, False, False),
                                                          (False, True, False)])
def test_only_an_asynchronous_job_gets_one(sync, has_sync_hook, expected):
  config = ClusterConfig.from_tf_config(
      '{"cluster": {"worker": ["localhost:1", "localhost:2"], "ps": ["localhost:3"]},'
      ' "task": {"type": "worker", "index": 1}}')
  settings = EpochSyncSettings(sync=sync, step_timeout_secs=50.0)
  watchdog = wiring._stuck_step_watchdog(config, settings, object() if has_sync_hook else None)  # pylint: disable=protected-access
  assert (watchdog is not None) == expected
  if watchdog is not None:
    assert watchdog.task_name == "worker:1"
