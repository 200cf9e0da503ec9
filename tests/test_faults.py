"""Fault tests on real clusters: a dead task is named by every survivor within seconds.

The jobs run with the default timeouts (step 600 s, barrier 1800 s, start-up 600 s): a task
that is gone must be known as gone through liveness probes, not through a timeout.
"""

import os
import sys
import time

import pytest

from hooks.audit import read_audit
from hooks.testing.local_cluster import LocalCluster

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

TASK = [sys.executable, os.path.join(os.path.dirname(__file__), "tasks", "epoch_task.py")]
DETECT_SECS = 10  # every survivor must have exited this soon after the kill


def _wait_for_epochs(model_dir, n, deadline_secs=60):
  deadline = time.monotonic() + deadline_secs
  while time.monotonic() < deadline and len(read_audit(model_dir)) < n:
    time.sleep(0.05)
  assert len(read_audit(model_dir)) >= n, f"the job did not finish {n} epoch(s) in time"


def _kill_mid_epoch(tmp_path, victim, sync=True, num_ps=1, has_chief=False, shards=(8, 5, 3)):
  """Kills `victim` in the middle of epoch 1; returns (kill time, result, model_dir)."""
  model_dir = str(tmp_path / "model")
  command = TASK + [f"--model_dir={model_dir}", "--shard_batches=" + ",".join(map(str, shards)),
                    "--epochsync_num_epochs=3", f"--epochsync_sync={sync}",
                    "--step_sleep_secs=0.25"]
  num_workers = len(shards)
  with LocalCluster(num_workers=num_workers, num_ps=num_ps, has_chief=has_chief,
                    timeout_secs=120, fail_fast_secs=DETECT_SECS + 15,
                    log_dir=str(tmp_path / "logs")) as cluster:
    cluster.start(command)
    _wait_for_epochs(model_dir, 1)
    time.sleep(0.6)  # inside epoch 1 (an epoch lasts about 2 s)
    killed_at = cluster.kill_task(victim)
    result = cluster.wait()
  return killed_at, result, model_dir


def _assert_every_survivor_names(result, victim, killed_at):
  survivors = [t for name, t in result.tasks.items() if name != victim and not
               name.startswith("ps:")]
  assert survivors
  for task in survivors:
    assert task.returncode not in (0, None) and not task.timed_out, (
        f"{task.name} did not fail by itself:\n{task.tail()}")
    assert task.ended_at - killed_at < DETECT_SECS, (
        f"{task.name} exited {task.ended_at - killed_at:.1f} s after the kill")
    print(f"fault: {victim} killed; {task.name} exited {task.ended_at - killed_at:.2f} s later")
    log = task.log
    assert "TaskDiedError" in log and f"{victim} died while {task.name} waited for it" in log, (
        task.tail(30))
    assert "StepTimeoutError" not in log and "BarrierTimeoutError" not in log
    assert "missing worker" not in log  # nobody blames a live worker
  return survivors


@pytest.mark.timeout(180)
@pytest.mark.parametrize("victim,sync", [("worker:2", True), ("worker:2", False),
                                         ("worker:0", True)],
                         ids=["worker-sync", "worker-async", "chief-sync"])
def test_a_killed_training_task_is_named_by_every_survivor(tmp_path, victim, sync):
  killed_at, result, model_dir = _kill_mid_epoch(tmp_path, victim, sync=sync)
  _assert_every_survivor_names(result, victim, killed_at)
  assert [line["epoch"] for line in read_audit(model_dir)] == [0]


@pytest.mark.timeout(180)
def test_a_killed_ps_is_named_by_every_task_the_chief_included(tmp_path):
  killed_at, result, model_dir = _kill_mid_epoch(tmp_path, "ps:1", num_ps=2, has_chief=True,
                                                 shards=(8, 5, 3, 4))
  survivors = _assert_every_survivor_names(result, "ps:1", killed_at)
  assert "chief:0" in [t.name for t in survivors]


@pytest.mark.timeout(120)
def test_a_ps_that_never_comes_up_fails_startup_naming_it(tmp_path):
  model_dir = str(tmp_path / "model")
  command = TASK + [f"--model_dir={model_dir}", "--shard_batches=2,2",
                    "--epochsync_startup_timeout_secs=5"]
  start = time.monotonic()
  with LocalCluster(num_workers=2, num_ps=2, timeout_secs=60, fail_fast_secs=30,
                    log_dir=str(tmp_path / "logs")) as cluster:
    cluster.start(command, per_task_args={"ps:1": ["--never_serve"]})
    result = cluster.wait()
  for name in ("worker:0", "worker:1"):
    task = result.tasks[name]
    assert task.returncode not in (0, None) and not task.timed_out, task.tail()
    assert task.ended_at - start < 5 + 20  # its own 5 s deadline, plus the processes' start
    assert "StartupTimeoutError" in task.log and "ps:1 never came up" in task.log, task.tail()
