"""Jobs of many workers on this machine (opt-in: --scale=N, e.g. 48 or 64, with 4 ps tasks).

Each task is a process forked from one that imported TensorFlow (hooks.testing.fork_server), as
in every cluster test. Synchronous and asynchronous, static shards and the work queue, and an
elastic asynchronous job with one worker killed inside a unit: the audit exact, the synchronous
parameters equal to the lockstep oracle. Each test prints the start-up (from the launch to the
last worker's first epoch start) and the barriers' release latency (after the last arrival).
"""

import os
import statistics
import sys
import time

import pytest

from cluster_checks import assert_audit_exact, assert_equals_oracle
from elastic_checks import kill_inside_a_unit
from hooks.epoch.audit import read_audit
from hooks.testing.local_cluster import LocalCluster

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

TASK = [sys.executable, os.path.join(os.path.dirname(__file__), "tasks", "epoch_task.py")]
NUM_PS = 4


@pytest.fixture
def workers(request):
  n = request.config.getoption("--scale")
  if not n:
    pytest.skip("a job of many workers runs with --scale=N (e.g. 48)")
  return n


def _run(tmp_path, workers, args, per_task_args=None, deadline=900, kill=None):
  model_dir = str(tmp_path / "model")
  command = TASK + [f"--model_dir={model_dir}", "--epochsync_save_checkpoint_secs=0",
                    "--epochsync_startup_timeout_secs=600"] + args
  started = time.time()
  with LocalCluster(num_workers=workers, num_ps=NUM_PS, timeout_secs=deadline,
                    fail_fast_secs=None if kill else 60, log_dir=str(tmp_path / "logs")) as cluster:
    cluster.start(command, per_task_args=per_task_args or {})
    if kill:
      kill(cluster)
    result = cluster.wait()
  audit = read_audit(model_dir)
  first = min(s["started_at"] for s in audit[0]["workers"].values() if s.get("started_at"))
  last = max(s["started_at"] for s in audit[0]["workers"].values() if s.get("started_at"))
  releases = [line["released_at"] - max(s["arrived_at"] for s in line["workers"].values()
                                        if s.get("arrived_at")) for line in audit]
  print(f"{workers} workers + {NUM_PS} ps: first epoch started {first - started:.1f}-"
        f"{last - started:.1f} s after the launch; barrier release {statistics.median(releases):.2f}"
        f" s after the last arrival (median of {len(releases)}; the chief's save included)")
  return model_dir, result, audit


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
def test_static_shards_of_many_workers_are_exact(tmp_path, workers, sync):
  shards = [2 + (w % 3) for w in range(workers)]
  model_dir, result, _ = _run(tmp_path, workers, [
      "--shard_batches=" + ",".join(map(str, shards)), "--epochsync_num_epochs=2",
      f"--epochsync_sync={str(sync).lower()}"])
  result.check()
  names = sorted(result.tasks, key=lambda n: int(n.split(":")[1]))
  assert_audit_exact(model_dir, names, shards, 2, sync)
  if sync:
    assert_equals_oracle(read_audit(model_dir)[-1]["checkpoint"], "linear", shards, 2)


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
def test_a_work_queue_of_many_workers_trains_every_unit_once(tmp_path, workers, sync):
  units = [1 + (u % 4) for u in range(2 * workers)]
  _, result, audit = _run(tmp_path, workers, [
      "--unit_batches=" + ",".join(map(str, units)), "--epochsync_num_epochs=2",
      f"--epochsync_sync={str(sync).lower()}"])
  result.check()
  for line in audit:
    assert sorted(u["index"] for u in line["units"]) == list(range(len(units)))
    assert all(u["batches"] == units[u["index"]] for u in line["units"])
    assert sum(s["batches"] for s in line["workers"].values()) == sum(units)
  steps = [line["global_step"] for line in audit]
  if not sync:
    assert steps == [sum(units), 2 * sum(units)], steps


@pytest.mark.timeout(1200)
def test_an_elastic_job_of_many_workers_goes_on_without_a_killed_one(tmp_path, workers):
  units = [3 + (u % 4) for u in range(2 * workers)]
  killed = {}

  def kill(cluster):
    killed["unit"], _ = kill_inside_a_unit(cluster, os.path.join(cluster.log_dir, "worker-1.log"),
                                           units, time.monotonic() + 600, min_batches=3)

  _, result, audit = _run(tmp_path, workers, [
      "--unit_batches=" + ",".join(map(str, units)), "--epochsync_num_epochs=2",
      "--epochsync_sync=false", "--epochsync_elastic", "--step_sleep_secs=0.05"],
      per_task_args={"worker:1": ["--slowdown=10"]}, kill=kill)
  codes = {name: r.returncode for name, r in result.tasks.items()}
  assert codes.pop("worker:1") == -9 and set(codes.values()) == {0}, codes
  for line in audit:
    assert line["lost_workers"] == ["worker:1"]
    assert sorted(u["index"] for u in line["units"]) == list(range(len(units)))
    assert all(u["batches"] == units[u["index"]] for u in line["units"]), line["units"]
  assert 2 * sum(units) - 1 <= audit[-1]["global_step"] <= 2 * sum(units)
