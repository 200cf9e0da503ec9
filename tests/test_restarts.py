"""Restarts on real clusters: exact resumption after a kill, Kubernetes' one-pod restarts, and a
second job on parameter servers that are still running.

Every job is checked against the numpy oracle of lockstep synchronous SGD: "it finished" is
not enough, the parameters must equal those of an uninterrupted run.
"""

import os
import sys
import time

import pytest

from cluster_checks import assert_equals_oracle, names_the_dead
from hooks.epoch.audit import read_audit
from hooks.testing.local_cluster import LocalCluster

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

TASK = [sys.executable, os.path.join(os.path.dirname(__file__), "tasks", "epoch_task.py")]
SHARDS = (6, 4, 2)
EPOCHS = 3


def _command(model_dir, step_sleep_secs=0.1):
  return TASK + [f"--model_dir={model_dir}", "--shard_batches=" + ",".join(map(str, SHARDS)),
                 f"--epochsync_num_epochs={EPOCHS}", f"--step_sleep_secs={step_sleep_secs}"]


def _kill_in_epoch_1(cluster, model_dir, victim):
  """Kills `victim` in the middle of epoch 1 (the second of three); returns the kill time."""
  deadline = time.monotonic() + 60
  while time.monotonic() < deadline and not read_audit(model_dir):
    time.sleep(0.05)
  time.sleep(0.3)  # epoch 1 lasts about 0.7 s
  assert len(read_audit(model_dir)) == 1, "the kill did not land in epoch 1"
  return cluster.kill_task(victim)


def _assert_all_failed_soon(result, killed_at, limit_secs=20):  # (test_faults: 10 s)
  for name, task in result.tasks.items():
    if name.startswith("worker") or name.startswith("chief"):
      assert task.returncode not in (0, None) and not task.timed_out, task.tail()
      assert task.ended_at - killed_at < limit_secs, f"{name} took {task.ended_at - killed_at}s"


def _assert_resumed_exactly(model_dir, attempts):
  audit = read_audit(model_dir)
  assert [(line["epoch"], line["attempt"]) for line in audit] == list(enumerate(attempts))
  assert [line["global_step"] for line in audit] == [max(SHARDS) * (e + 1) for e in range(EPOCHS)]
  for line in audit:
    assert [s["batches"] for s in line["workers"].values()] == list(SHARDS)
  assert_equals_oracle(audit[-1]["checkpoint"], "linear", SHARDS, EPOCHS)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("victim", [pytest.param("worker:2", marks=pytest.mark.variant),
                                    "worker:0", pytest.param("ps:0", marks=pytest.mark.variant)],
                         ids=["worker", "chief", "ps"])
def test_a_relaunched_job_resumes_exactly_after_a_kill(tmp_path, victim):
  model_dir = str(tmp_path / "model")
  with LocalCluster(num_workers=3, timeout_secs=90, fail_fast_secs=30,
                    log_dir=str(tmp_path / "logs1")) as first:
    first.start(_command(model_dir))
    killed_at = _kill_in_epoch_1(first, model_dir, victim)
    _assert_all_failed_soon(first.wait(), killed_at)
  # A worker killed after it arrived at the barrier does not stop epoch 1 from being saved.
  saved = len(read_audit(model_dir))
  assert saved in (1, 2)
  with LocalCluster(num_workers=3, timeout_secs=90, log_dir=str(tmp_path / "logs2")) as second:
    second.start(_command(model_dir, step_sleep_secs=0))
    second.wait().check()
  _assert_resumed_exactly(model_dir, attempts=[1] * saved + [2] * (EPOCHS - saved))


@pytest.mark.timeout(240)
def test_kubernetes_restarts_the_killed_pod_and_then_the_others_on_the_same_ps(tmp_path):
  """A TFJob with restartPolicy OnFailure relaunches each failed pod at the same address.

  The killed worker comes back at once; the survivors fail fast (a task they waited for died
  or restarted) and are relaunched in turn, while the ps pod keeps running with the old run's
  queues and variables. The job then resumes from the last epoch checkpoint as if nothing had
  happened. The test plays the operator: it restarts any training task that exits non-zero.
  """
  model_dir = str(tmp_path / "model")
  with LocalCluster(num_workers=3, timeout_secs=200, fail_fast_secs=None,
                    log_dir=str(tmp_path / "logs")) as cluster:
    cluster.start(_command(model_dir))
    killed_at = _kill_in_epoch_1(cluster, model_dir, "worker:2")
    time.sleep(0.2)
    cluster.restart_task("worker:2", _command(model_dir, step_sleep_secs=0))
    first_failures, restarts = {}, 0
    deadline = time.monotonic() + 150
    while time.monotonic() < deadline:
      results = cluster.results()
      if all(r.returncode == 0 for r in results.values()):
        break
      for name, result in results.items():
        if result.returncode not in (None, 0):  # the operator restarts the failed pod
          first_failures.setdefault(name, (result.ended_at, result.log))  # before the restart
          restarts += 1
          assert restarts <= 6, f"the job keeps failing; last: {name}\n{result.tail()}"
          cluster.restart_task(name, _command(model_dir, step_sleep_secs=0))
      time.sleep(0.1)
    assert all(r.returncode == 0 for r in cluster.results().values()), cluster.results()
  for name in ("worker:0", "worker:1"):  # the survivors knew at once, and why
    ended_at, log = first_failures[name]  # (tests/test_faults.py holds the 10 s bound)
    assert ended_at - killed_at < 20, f"{name} exited {ended_at - killed_at:.1f} s after the kill"
    assert names_the_dead(log, name, "worker:2") or "worker:2 restarted" in log, log[-3000:]
  attempts = [line["attempt"] for line in read_audit(model_dir)]
  assert attempts[0] == 1 and attempts[-1] > 1 and attempts == sorted(attempts), attempts
  _assert_resumed_exactly(model_dir, attempts=attempts)


@pytest.mark.timeout(240)
def test_a_second_job_on_the_same_running_ps_trains_exactly(tmp_path):
  first_dir, second_dir = str(tmp_path / "first"), str(tmp_path / "second")
  with LocalCluster(num_workers=3, timeout_secs=200, log_dir=str(tmp_path / "logs")) as cluster:
    cluster.start(_command(first_dir, step_sleep_secs=0))
    cluster.wait().check()
    for name in ("worker:0", "worker:1", "worker:2"):
      cluster.restart_task(name, _command(second_dir, step_sleep_secs=0))
    cluster.wait().check()
  for model_dir in (first_dir, second_dir):
    _assert_resumed_exactly(model_dir, attempts=[1, 1, 1])
