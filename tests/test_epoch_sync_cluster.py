"""Epoch-synchronized training on real clusters: exact epochs, ordered saves, timeouts, restart."""

import glob
import os
import re
import sys
import time

import numpy as np
import pytest

import cluster_checks
from hooks.epoch.audit import read_audit
from hooks.epoch.summaries import read_epoch_summaries
from hooks.testing.local_cluster import LocalCluster

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

TASK = [sys.executable, os.path.join(os.path.dirname(__file__), "tasks", "epoch_task.py")]
FAST_TIMEOUTS = ["--epochsync_barrier_timeout_secs=60", "--epochsync_startup_timeout_secs=60",
                 "--epochsync_log_every_secs=2", "--epochsync_warn_after_secs=10"]


_summaries = cluster_checks.summaries
_checkpoint_value = cluster_checks.checkpoint_value
_assert_equals_oracle = cluster_checks.assert_equals_oracle


def _first_epoch_id_counts(shards):
  """The embedding model's ids of one epoch of every shard, counted per id (the oracle)."""
  import numpy as np
  from examples import train
  ids = [train.shard_arrays("embedding", w, n, 8, 16)[0] for w, n in enumerate(shards)]
  return np.bincount(np.concatenate(ids), minlength=16)


def _assert_tensorboard_matches_audit(model_dir, audit, names, steps_per_epoch):
  """The chief's per-epoch TensorBoard scalars, read back from the event files."""
  got = read_epoch_summaries(model_dir)
  epochs = [line["epoch"] for line in audit]
  assert got["epoch/steps"] == {e: steps_per_epoch for e in epochs}
  assert got["epoch/global_step"] == {line["epoch"]: line["global_step"] for line in audit}
  for name in names:
    assert got[f"batches/{name}"] == {
        line["epoch"]: line["workers"][name]["batches"] for line in audit}
    assert got[f"examples/{name}"] == {
        line["epoch"]: line["workers"][name]["examples"] for line in audit}
    for line in audit:  # the chief's wait ends at its save, the audit's at the release
      wait = line["workers"][name]["barrier_wait_secs"]
      assert 0 <= got[f"barrier_wait_secs/{name}"][line["epoch"]] <= wait + 1e-3
  for e in epochs:
    assert got["epoch/wall_secs"][e] >= max(got[f"epoch_secs/{n}"][e] for n in names) - 1e-3


def _run(tmp_path, shards, num_epochs, sync, timeout_secs=90, model="linear", **cluster_args):
  model_dir = str(tmp_path / "model")
  command = TASK + [f"--model_dir={model_dir}", "--shard_batches=" + ",".join(map(str, shards)),
                    f"--epochsync_num_epochs={num_epochs}", f"--epochsync_sync={sync}",
                    f"--model={model}"] + FAST_TIMEOUTS
  with LocalCluster(timeout_secs=timeout_secs, log_dir=str(tmp_path / "logs"),
                    **cluster_args) as cluster:
    cluster.start(command)
    result = cluster.wait()
  result.check()
  return model_dir, result, cluster


@pytest.mark.timeout(150)
@pytest.mark.parametrize("shards,num_epochs,sync,model,cluster_args", [
    pytest.param((9, 5, 0), 3, True, "linear", dict(num_workers=3, num_ps=1),
                 marks=pytest.mark.variant),  # (the 8-worker and 2-ps cases cover it)
    pytest.param((9, 5, 0), 2, False, "linear", dict(num_workers=3, num_ps=1),
                 marks=pytest.mark.variant),  # (test_matrix's asynchronous seed covers it)
    ((6, 6, 3, 0), 2, True, "linear", dict(num_workers=4, num_ps=2, has_chief=True,
                                            has_evaluator=True)),
    ((7, 4, 1), 2, True, "embedding", dict(num_workers=3, num_ps=2)),
    ((0, 4, 2), 2, True, "linear", dict(num_workers=3, num_ps=1)),
    ((3,), 2, True, "linear", dict(num_workers=1, num_ps=1)),
    ((3, 0, 2, 1, 4, 0, 1, 2), 2, True, "linear", dict(num_workers=8, num_ps=2)),
], ids=["sync-3workers-9-5-0", "async-3workers-9-5-0", "sync-chief+3workers-2ps+evaluator-6-6-3-0",
        "sync-embedding-2ps-7-4-1", "sync-empty-chief-0-4-2", "sync-1worker",
        "sync-8workers-2ps"])
def test_every_worker_trains_its_shard_once_per_epoch_and_saves_are_ordered(
    tmp_path, shards, num_epochs, sync, model, cluster_args):
  model_dir, result, cluster = _run(tmp_path, shards, num_epochs, sync, model=model,
                                    **cluster_args)
  names = [n for n in cluster.training_task_names if n != "evaluator:0"]
  audit = read_audit(model_dir)
  assert [line["epoch"] for line in audit] == list(range(num_epochs))
  # Synchronous: one global step per step of the longest shard; asynchronous: one per batch.
  steps_per_epoch = max(shards) if sync else sum(shards)
  for line in audit:
    e = line["epoch"]
    assert {w: s["batches"] for w, s in line["workers"].items()} == dict(zip(names, shards))
    assert {w: s["examples"] for w, s in line["workers"].items()} == {
        w: 8 * n for w, n in zip(names, shards)}
    assert line["global_step"] == steps_per_epoch * (e + 1)
    # The checkpoint itself proves what had happened when it was written.
    ckpt = line["checkpoint"]
    assert os.path.basename(ckpt) == f"model.ckpt-epoch{e:04d}-{steps_per_epoch * (e + 1)}"
    assert list(_checkpoint_value(ckpt, "epochsync/done_epochs")) == [e + 1] * len(names)
    assert _checkpoint_value(ckpt, "global_step") == steps_per_epoch * (e + 1)
    assert _checkpoint_value(ckpt, "epochsync/completed_epochs") == e + 1
  checkpoints = sorted(glob.glob(os.path.join(model_dir, "model.ckpt-epoch*.index")))
  assert len(checkpoints) == num_epochs
  if sync:  # the whole stack (input, hooks, optimizer) computes exactly synchronous SGD
    _assert_equals_oracle(audit[-1]["checkpoint"], model, shards, num_epochs)
  if model == "embedding":  # counted in the first epoch only, through epoch_tensor
    np.testing.assert_array_equal(_checkpoint_value(audit[-1]["checkpoint"], "feature_counts"),
                                  _first_epoch_id_counts(shards))
  _assert_tensorboard_matches_audit(model_dir, audit, names, steps_per_epoch)
  assert "Traceback" not in "".join(t.log for t in result.tasks.values())
  summaries = _summaries(model_dir)
  if "evaluator:0" in summaries:  # it evaluated epoch checkpoints up to the last one
    evaluated = summaries.pop("evaluator:0")["evaluated"]
    assert evaluated[-1]["epoch"] == num_epochs - 1
    assert evaluated[-1]["global_step"] == audit[-1]["global_step"]
    assert [e["epoch"] for e in evaluated] == sorted({e["epoch"] for e in evaluated})
  assert sorted(summaries) == sorted(names)
  for name, row in summaries.items():
    assert row["epochs"] == list(range(num_epochs))
    assert row["batches"] == [shards[names.index(name)]] * num_epochs
    for e, line in enumerate(audit):
      assert row["ended_at"][e] <= line["saved_at"], f"{name} ended epoch {e} after the save"
      if e + 1 < num_epochs:
        assert row["started_at"][e + 1] >= line["saved_at"], (
            f"{name} started epoch {e + 1} before the chief saved epoch {e}")


@pytest.mark.timeout(90)
def test_a_worker_that_never_reaches_the_barrier_is_named_by_the_others(tmp_path):
  model_dir = str(tmp_path / "model")
  command = TASK + [f"--model_dir={model_dir}", "--shard_batches=4,3,2",
                    "--epochsync_num_epochs=3", "--stall_worker=2", "--stall_epoch=1",
                    "--epochsync_barrier_timeout_secs=4", "--epochsync_log_every_secs=1",
                    "--epochsync_warn_after_secs=2"]
  start = time.monotonic()
  with LocalCluster(num_workers=3, timeout_secs=60, fail_fast_secs=3,
                    log_dir=str(tmp_path / "logs")) as cluster:
    cluster.start(command)
    result = cluster.wait()
  elapsed = time.monotonic() - start
  chief, other = result.tasks["worker:0"], result.tasks["worker:1"]
  assert chief.returncode not in (0, None) and other.returncode not in (0, None)
  assert "BarrierTimeoutError" in chief.log
  # It waits 4 s from worker:2's last step (taken after the chief began to wait).
  assert re.search(r'barrier "epoch_end" timed out after \d+ s, the last 4 s without progress '
                   r"of the tasks it waits for \(limit 4 s\) in epoch 1 on worker:0: 2/3 "
                   r"arrived; missing worker:2 \(no step for \d+ s", chief.log), chief.tail()
  assert "in epoch 1 on worker:1: the chief gave up: 2/3 arrived; missing worker:2" in (
      other.log)
  assert "still waiting at epoch_end, epoch 1" in chief.log and "missing worker:2" in chief.log
  assert result.tasks["worker:2"].timed_out  # it really never arrived; the launcher killed it
  assert [line["epoch"] for line in read_audit(model_dir)] == [0]
  assert elapsed < 40


@pytest.mark.timeout(180)
def test_restart_after_kill_in_epoch_2_trains_only_epochs_2_and_3(tmp_path):
  model_dir = str(tmp_path / "model")
  command = TASK + [f"--model_dir={model_dir}", "--shard_batches=8,5,3", "--model=embedding",
                    "--epochsync_num_epochs=3", "--step_sleep_secs=0.25"] + FAST_TIMEOUTS
  with LocalCluster(num_workers=3, timeout_secs=60, log_dir=str(tmp_path / "logs1")) as first:
    first.start(command)
    deadline = time.monotonic() + 50
    while time.monotonic() < deadline and len(read_audit(model_dir)) < 1:
      time.sleep(0.1)
    time.sleep(0.8)  # well inside epoch index 1 (it lasts about 2 s)
    assert len(read_audit(model_dir)) == 1, "the first run did not stop inside epoch 2"
  # `with` killed every task mid-epoch; relaunch on the same model_dir.
  assert not _summaries(model_dir)
  with LocalCluster(num_workers=3, timeout_secs=90, log_dir=str(tmp_path / "logs2")) as second:
    second.start(command)
    result = second.wait()
  result.check()
  audit = read_audit(model_dir)
  assert [line["epoch"] for line in audit] == [0, 1, 2]
  assert [line["global_step"] for line in audit] == [8, 16, 24]  # synchronous: max shard
  for name, row in _summaries(model_dir).items():
    assert row["epochs"] == [1, 2], f"{name} re-trained an epoch after the restart"
  # The first-epoch-only counter (epoch_tensor) counted epoch 0 of every shard exactly once:
  # epoch 0's checkpoint holds it, the restarted epochs 1 and 2 added nothing.
  for line in audit:
    np.testing.assert_array_equal(_checkpoint_value(line["checkpoint"], "feature_counts"),
                                  _first_epoch_id_counts([8, 5, 3]))
  assert _first_epoch_id_counts([8, 5, 3]).sum() == 8 * 16
  # TensorBoard: steps per epoch counted from the restored global step, not from 0.
  assert read_epoch_summaries(model_dir)["epoch/steps"] == {0: 8, 1: 8, 2: 8}


@pytest.mark.timeout(120)
def test_workers_start_within_a_second_or_two_of_the_chiefs_initialisation(tmp_path):
  """The chief initialises 3 s late (its server up), so every worker asks first; each then waits
  for its next readiness check: 0.5 s with the drop-in, 30 s with TensorFlow's own."""
  model_dir = str(tmp_path / "model")
  command = TASK + [f"--model_dir={model_dir}", "--shard_batches=2,2,2",
                    "--epochsync_num_epochs=1", "--chief_init_delay_secs=3"] + FAST_TIMEOUTS
  with LocalCluster(num_workers=3, has_chief=True, timeout_secs=90,
                    log_dir=str(tmp_path / "logs")) as cluster:
    cluster.start(command)
    result = cluster.wait()
  result.check()
  rows = _summaries(model_dir)
  initialised = rows["chief:0"]["initialised_at"]
  for name in ("worker:0", "worker:1"):
    assert rows[name]["session_created_at"] < initialised + 2.0, name  # poll 0.5 s + a check
    assert rows[name]["first_step_at"] < initialised + 6.0, name
    # It really asked before the chief had initialised (else this test proves nothing).
    assert "Waiting for model to be ready" in result.tasks[name].log, name
