"""Kills inside an epoch after a mid-epoch checkpoint, then a relaunch on the same model_dir.

One cluster per case (and one for the relaunch): a worker, the chief or a ps is SIGKILLed in epoch 1 (of 2) once a
mid-epoch checkpoint of epoch 1 exists (--epochsync_save_checkpoint_steps=2), and a second
cluster finishes the job. Synchronous: the final parameters equal the lockstep oracle (1e-5),
global_step (the number of gradient applications) equals the uninterrupted run's, and the
audit counts each shard once. A resume that skips nothing trains batches twice (global_step
and the parameters differ); one that skips too much misses some (the same).

The randomized kill matrix draws, per seed, the shards, the save period, the victim and the
kill point (up to 0.3 s after the first mid-epoch save of epoch 0 or 1): the default run
is seed 0 (synchronous, ps:0 killed in epoch 1: the ps case of the default suite); all seeds
0..N-1 in both modes:
  ./es test tests/test_mid_epoch_cluster.py --kill-seeds=10
"""

import os
import random
import sys
import time

import pytest

from cluster_checks import (assert_equals_oracle, checkpoint_value, kill_after_a_mid_epoch_save,
                            mid_epoch_saved_in)
from hooks.epoch.audit import read_audit
from hooks.testing.local_cluster import LocalCluster

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

TASK = [sys.executable, os.path.join(os.path.dirname(__file__), "tasks", "epoch_task.py")]
# Hand-wired hooks (epoch_sync_hooks) in TensorFlow's own MonitoredTrainingSession ("mts") or
# MonitoredSession with TensorFlow's ChiefSessionCreator/WorkerSessionCreator ("creators").
STOCK_TASK = [sys.executable,
              os.path.join(os.path.dirname(__file__), "tasks", "stock_session_task.py")]
SHARDS = (8, 6, 3)
BATCH = 8  # examples.train's --batch_size
EPOCHS = 2


def _command(model_dir, sync, step_sleep_secs, shards=SHARDS, save_steps=2, task=TASK):
  return task + [f"--model_dir={model_dir}", "--shard_batches=" + ",".join(map(str, shards)),
                 f"--epochsync_num_epochs={EPOCHS}", f"--step_sleep_secs={step_sleep_secs}",
                 "--epochsync_save_checkpoint_secs=0",
                 f"--epochsync_save_checkpoint_steps={save_steps}",
                 f"--epochsync_sync={str(sync).lower()}"]


def _two_attempts(tmp_path, victim, sync=True, task=TASK):
  model_dir = str(tmp_path / "model")
  with LocalCluster(num_workers=3, timeout_secs=90, fail_fast_secs=30,
                    log_dir=str(tmp_path / "logs1")) as first:
    first.start(_command(model_dir, sync, step_sleep_secs=0.15, task=task))
    kill_after_a_mid_epoch_save(first, model_dir, 1, victim)
    first.wait()
  ready = os.path.join(model_dir, "chief-has-a-session")  # STOCK_TASK's, for the relaunch's
  if os.path.exists(ready):  # workers to wait for the new chief (not the killed one's file)
    os.remove(ready)
  with LocalCluster(num_workers=3, timeout_secs=90, log_dir=str(tmp_path / "logs2")) as second:
    second.start(_command(model_dir, sync, step_sleep_secs=0, task=task))
    second.wait().check()
  audit = read_audit(model_dir)
  assert [line["epoch"] for line in audit] == list(range(EPOCHS))
  for line in audit:  # Each worker's batches across attempts: its whole shard, once.
    assert [s["batches"] for s in line["workers"].values()] == list(SHARDS)
    assert [s["examples"] for s in line["workers"].values()] == [BATCH * n for n in SHARDS]
  resumed = audit[1]
  assert resumed["attempts"] == [1, 2], resumed
  assert len(resumed["resumed_from"]) == 1 and resumed["resumed_from"][0]["attempt"] == 2
  return model_dir, audit, resumed["resumed_from"][0]


@pytest.mark.timeout(240)
# (A chief's kill and resume inside the epoch: test_hooks_in_tensorflows_own_session, test_restarts.)
@pytest.mark.parametrize("victim", ["worker:1", pytest.param("worker:0", marks=pytest.mark.variant)],
                         ids=["worker", "chief"])
def test_sync_resumes_inside_the_epoch_exactly_after_a_kill(tmp_path, victim):
  model_dir, audit, resumed_from = _two_attempts(tmp_path, victim)
  step = resumed_from["epoch_step"]
  assert step >= 2 and step % 2 == 0, resumed_from  # From a save inside epoch 1.
  assert resumed_from["global_step"] == max(SHARDS) + step
  assert resumed_from["skipped_batches"] == {
      name: min(step, n) for name, n in zip(audit[1]["workers"], SHARDS)}
  # global_step: as many gradient applications as the uninterrupted run (nothing twice).
  assert [line["global_step"] for line in audit] == [max(SHARDS) * (e + 1) for e in range(EPOCHS)]
  assert_equals_oracle(audit[-1]["checkpoint"], "linear", SHARDS, EPOCHS)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("victim, session", [
    pytest.param("worker:1", "mts", marks=pytest.mark.variant), ("worker:0", "creators"),
    pytest.param("ps:0", "mts", marks=pytest.mark.variant)], ids=["worker", "chief", "ps"])
def test_hooks_in_tensorflows_own_session_resume_inside_the_epoch(tmp_path, victim, session):
  """TensorFlow's ChiefSessionCreator restores the epoch checkpoint; the chief's
  MidEpochRestoreHook restores the newer mid-epoch one over it before the run starts."""
  task = STOCK_TASK + [f"--session={session}"]
  model_dir, audit, resumed_from = _two_attempts(tmp_path, victim, task=task)
  step = resumed_from["epoch_step"]
  assert step >= 2 and resumed_from["global_step"] == max(SHARDS) + step, resumed_from
  assert [line["global_step"] for line in audit] == [max(SHARDS) * (e + 1) for e in range(EPOCHS)]
  assert_equals_oracle(audit[-1]["checkpoint"], "linear", SHARDS, EPOCHS)


@pytest.mark.timeout(240)
def test_async_counts_every_batch_once_after_a_kill(tmp_path):
  model_dir, audit, resumed_from = _two_attempts(tmp_path, "worker:1", sync=False)
  assert resumed_from["epoch_step"] == -1
  skipped = resumed_from["skipped_batches"]
  assert all(0 <= skipped[w] <= n for w, n in zip(audit[1]["workers"], SHARDS)), skipped
  assert sum(skipped.values()) > 0, skipped
  # One update per batch, but those in flight at the save may be in the model or not.
  steps = checkpoint_value(audit[-1]["checkpoint"], "global_step")
  assert abs(steps - EPOCHS * sum(SHARDS)) <= len(SHARDS), steps


@pytest.mark.timeout(300)
def test_random_kill_points_resume_exactly(tmp_path, kill_case):
  seed, sync = kill_case  # from conftest.py: --kill-seeds
  rng = random.Random(seed)
  shards = tuple(rng.randint(0, 10) for _ in range(3))
  shards = shards if max(shards) >= 4 else shards[:2] + (6,)  # room for a save inside
  if not sync:  # The chief saves from its own steps: give it the longest shard.
    shards = tuple(sorted(shards, reverse=True))
  save_steps, epoch = rng.randint(1, 3), rng.randint(0, 1)
  victim, delay = rng.choice(["worker:1", "worker:2", "worker:0", "ps:0"]), rng.random() * 0.3
  what = (f"kill seed {seed}: shards {shards}, save every {save_steps} steps, {victim} killed "
          f"{delay:.2f} s after a mid-epoch save of epoch {epoch}, "
          f"{'sync' if sync else 'async'}")
  print(what, flush=True)
  model_dir = str(tmp_path / "model")
  with LocalCluster(num_workers=3, timeout_secs=90, fail_fast_secs=30,
                    log_dir=str(tmp_path / "logs1")) as first:
    first.start(_command(model_dir, sync, 0.15, shards, save_steps))
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and not mid_epoch_saved_in(model_dir, epoch):
      time.sleep(0.05)
    time.sleep(delay)
    first.kill_task(victim)
    first.wait()
  with LocalCluster(num_workers=3, timeout_secs=90, log_dir=str(tmp_path / "logs2")) as second:
    second.start(_command(model_dir, sync, 0, shards, save_steps))
    second.wait().check()
  audit = read_audit(model_dir)
  assert [line["epoch"] for line in audit] == list(range(EPOCHS)), what
  for line in audit:
    assert [s["batches"] for s in line["workers"].values()] == list(shards), what
    assert [s["examples"] for s in line["workers"].values()] == [BATCH * n for n in shards], what
    for resume in line.get("resumed_from", ()):
      step = resume["epoch_step"]
      assert (step >= 0) == sync, what
      if sync:
        assert resume["skipped_batches"] == {
            name: min(step, n) for name, n in zip(line["workers"], shards)}, what
  if sync:
    assert [line["global_step"] for line in audit] == [
        max(shards) * (e + 1) for e in range(EPOCHS)], what
    assert_equals_oracle(audit[-1]["checkpoint"], "linear", shards, EPOCHS, context=what + ": ")
  else:
    steps = checkpoint_value(audit[-1]["checkpoint"], "global_step")
    assert abs(steps - EPOCHS * sum(shards)) <= len(shards), what
