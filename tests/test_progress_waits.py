"""Waits bounded by progress on real clusters: a long epoch or a long save is not a stall, a
stopped worker is.

The barrier timeout is 15 s. worker:0 (the chief) has an empty shard and waits at the epoch's
end while worker:1 trains for longer than that; then every worker waits while the chief's
epoch checkpoint takes longer than that (a CheckpointSaverListener sleeps). A SIGSTOPped
worker stops moving: the chief names it after the timeout, with how long since its last step.
A relaunched chief restoring for longer than the start-up timeout is not a stall either.
"""

import json
import os
import re
import signal
import sys
import time

import pytest

from hooks.audit import read_audit
from hooks.testing.local_cluster import LocalCluster

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

TASK = [sys.executable, os.path.join(os.path.dirname(__file__), "tasks", "epoch_task.py")]
TIMEOUT = 15


@pytest.mark.timeout(150)
def test_a_long_epoch_and_a_long_save_outlast_the_barrier_timeout(tmp_path):
  model_dir = str(tmp_path / "model")
  command = TASK + [f"--model_dir={model_dir}", "--shard_batches=0,130",
                    "--step_sleep_secs=0.12", f"--epochsync_barrier_timeout_secs={TIMEOUT}",
                    "--epochsync_warn_after_secs=10", "--epochsync_log_every_secs=5",
                    "--save_sleep_secs=20"]
  with LocalCluster(num_workers=2, timeout_secs=120, log_dir=str(tmp_path / "logs")) as cluster:
    cluster.start(command)
    result = cluster.wait()
  result.check()
  chief, worker = result.tasks["worker:0"].log, result.tasks["worker:1"].log
  waited = [float(s) for s in re.findall(
      r"worker:0 passed epoch_end, epoch 0, after ([\d.]+) s", chief)]
  assert waited and waited[0] > TIMEOUT, chief  # The epoch outlasted the timeout ...
  released = [float(s) for s in re.findall(
      r"worker:1 passed epoch_end, epoch 0, after ([\d.]+) s", worker)]
  assert released and released[0] > 20, worker  # ... and so did the save.
  # While it waited, the chief said whom it waited for and how far it was.
  assert re.search(r"worker:0 still waiting at epoch_end, epoch 0, .*missing worker:1; "
                   r"worker:1 epoch 0 batch \d+, [\d.]+ batches/s", chief), chief
  assert re.search(r"worker:1 still waiting at epoch_end, epoch 0, .*worker:0 saving", worker)
  assert [line["epoch"] for line in read_audit(model_dir)] == [0]
  assert read_audit(model_dir)[0]["workers"]["worker:1"]["batches"] == 130


@pytest.mark.timeout(90)
def test_a_stopped_worker_is_named_with_how_long_since_its_last_step(tmp_path):
  command = TASK + [f"--model_dir={tmp_path / 'model'}", "--shard_batches=0,400",
                    "--step_sleep_secs=0.05", "--epochsync_barrier_timeout_secs=5",
                    "--epochsync_warn_after_secs=2", "--epochsync_log_every_secs=1"]
  with LocalCluster(num_workers=2, timeout_secs=60, fail_fast_secs=2,
                    log_dir=str(tmp_path / "logs")) as cluster:
    cluster.start(command)
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline and " batch " not in _log(cluster, "worker:0"):
      time.sleep(0.2)  # Until the chief saw worker:1 step (the chief waits at the barrier).
    stopped_at = cluster.kill_task("worker:1", signal.SIGSTOP)
    result = cluster.wait()
  chief = result.tasks["worker:0"]
  assert chief.returncode not in (0, None) and not chief.timed_out, chief.tail()
  assert 5 <= chief.ended_at - stopped_at < 15, chief.ended_at - stopped_at
  match = re.search(r'BarrierTimeoutError: barrier "epoch_end" timed out after \d+ s, the last 5 s '
                    r"without progress .* on worker:0: 1/2 arrived; missing worker:1 \(no step "
                    r"for (\d+) s, at batch \d+ of epoch 0, training\)", chief.log)
  assert match, chief.tail()
  assert int(match.group(1)) >= 5


def _log(cluster, name):
  with open(os.path.join(cluster.log_dir, name.replace(":", "-") + ".log")) as f:
    return f.read()


@pytest.mark.timeout(120)
def test_a_long_mid_epoch_save_outlasts_the_step_timeout(tmp_path):
  # The chief saves between two aggregations: every synchronous step waits for the save.
  model_dir = str(tmp_path / "model")
  command = TASK + [f"--model_dir={model_dir}", "--shard_batches=30,30", "--step_sleep_secs=0.05",
                    "--epochsync_step_timeout_secs=4", "--epochsync_warn_after_secs=3",
                    "--epochsync_save_checkpoint_steps=15", "--epochsync_save_checkpoint_secs=0",
                    "--mid_epoch_save_sleep_secs=8"]
  with LocalCluster(num_workers=2, timeout_secs=90, log_dir=str(tmp_path / "logs")) as cluster:
    cluster.start(command)
    result = cluster.wait()
  result.check()
  chief = result.tasks["worker:0"].log
  assert "slow mid-epoch save: sleeping 8.0 s" in chief, chief
  assert re.search(r"chief saved a mid-epoch checkpoint of epoch 0 .* in [89]\.\d+ s", chief), chief
  assert read_audit(model_dir)[0]["workers"]["worker:1"]["batches"] == 30


@pytest.mark.timeout(150)
def test_a_long_restore_outlasts_the_startup_timeout(tmp_path):
  """The relaunched chief restores for 14 s; the workers wait for its initialisation with a
  6 s start-up timeout: its heartbeat says "restoring" while they wait."""
  model_dir = str(tmp_path / "model")
  command = TASK + [f"--model_dir={model_dir}", "--shard_batches=3,3,3"]
  with LocalCluster(num_workers=3, timeout_secs=60, log_dir=str(tmp_path / "first")) as cluster:
    cluster.start(command + ["--epochsync_num_epochs=1"])
    cluster.wait().check()
  relaunch = command + ["--epochsync_num_epochs=2", "--epochsync_startup_timeout_secs=6",
                        "--restore_sleep_secs=14"]
  with LocalCluster(num_workers=3, timeout_secs=90, log_dir=str(tmp_path / "second")) as cluster:
    cluster.start(relaunch)
    result = cluster.wait()
  result.check()
  assert "slow restore: sleeping 14.0 s" in result.tasks["worker:0"].log
  for name in ("worker:1", "worker:2"):  # Each waited for the restore, well past its timeout.
    summary = json.loads(re.search(r"summary (\{.*\})", result.tasks[name].log).group(1))
    assert summary["secs"] > 14, (name, summary)
  assert [line["epoch"] for line in read_audit(model_dir)] == [0, 1]
  assert read_audit(model_dir)[1]["attempt"] == 2
