"""A relaunch with another number of workers, on every path (docs/migration.md §6 states the rule).

Over an epoch checkpoint every job goes on with the new count; over a mid-epoch checkpoint a
work-queue job resumes exactly and a static-shard job is refused before its first step. Each
path: TensorFlow's own MonitoredTrainingSession with hand-wired hooks (tests/tasks/
stock_session_task.py), the drop-in (epoch_task.py) and the Estimator (test_estimator_*).
"""

import os
import re
import sys

import numpy as np
import pytest

from cluster_checks import (assert_workers_count_every_attempt, checkpoint_value,
                            kill_after_a_mid_epoch_save, relaunch_after_a_mid_epoch_kill,
                            steps_sgd, unit_steps)
from examples import train
from hooks.epoch.audit import read_audit
from hooks.testing import oracle
from hooks.testing.local_cluster import LocalCluster

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

TASKS = os.path.join(os.path.dirname(__file__), "tasks")
STOCK_TASK = [sys.executable, os.path.join(TASKS, "stock_session_task.py")]
DROP_IN_TASK = [sys.executable, os.path.join(TASKS, "epoch_task.py")]
UNITS = [9, 1, 4, 6, 2, 7, 3, 5, 1, 8]  # batches per unit
BATCH, FEATURES, LR = 8, 16, 0.05


def _queue_steps(audit_line):
  inputs, labels = train.unit_arrays("linear", UNITS, BATCH, FEATURES)
  starts = np.cumsum([0] + UNITS[:-1]) * BATCH
  rows = lambda index, k: starts[index] + k * BATCH
  return unit_steps(audit_line, sum(UNITS),
                    lambda index, k: (inputs[rows(index, k):rows(index, k) + BATCH],
                                      labels[rows(index, k):rows(index, k) + BATCH]))


def _assert_queue_exact(audit):
  """Every unit once per epoch with all its batches; the global step and the parameters are
  those of the steps each audit line records (both attempts of the resumed epoch)."""
  params, steps = {"w": np.zeros(FEATURES), "b": np.zeros(())}, 0
  for line in audit:
    assert_workers_count_every_attempt(line, UNITS, BATCH)
    assert sorted(u["index"] for u in line["units"]) == list(range(len(UNITS))), line["units"]
    for u in line["units"]:
      assert u["batches"] == UNITS[u["index"]] and u["examples"] == UNITS[u["index"]] * BATCH, u
    epoch_steps = _queue_steps(line)
    params = steps_sgd(params, epoch_steps, oracle.linear_mse_gradients, LR)
    steps += len(epoch_steps)
    assert line["global_step"] == steps, (line["epoch"], line["global_step"], steps)
  for name, value in params.items():
    np.testing.assert_allclose(checkpoint_value(audit[-1]["checkpoint"], name), value, atol=1e-5)


def _queue_relaunch(tmp_path, task, before, after):
  """`before` workers train a synchronous queue job of 2 epochs with a mid-epoch checkpoint
  every 2 steps; the chief is killed after one of epoch 1 (the others then end); the job is
  relaunched with `after` workers on the same model_dir."""
  model_dir = str(tmp_path / "model")
  command = task + [f"--model_dir={model_dir}", "--unit_batches=" + ",".join(map(str, UNITS)),
                    "--epochsync_num_epochs=2", "--epochsync_save_checkpoint_secs=0",
                    "--epochsync_save_checkpoint_steps=2"]
  relaunch_after_a_mid_epoch_kill(tmp_path, command, model_dir, before, after, victim="worker:0")
  audit = read_audit(model_dir)
  assert [line["epoch"] for line in audit] == [0, 1]
  assert audit[1]["attempts"] == [1, 2], audit[1]
  return audit


@pytest.mark.timeout(300)
@pytest.mark.parametrize("before,after", [(4, 3), pytest.param(2, 3, marks=pytest.mark.variant)],
                         ids=["fewer", "more"])
def test_tensorflows_own_session_resumes_a_queue_with_another_worker_count(tmp_path, before,
                                                                          after):
  """TensorFlow's ChiefSessionCreator restores the epoch checkpoint, the chief's hook the
  mid-epoch one over it, both through the Scaffold's saver: per-worker state of another count
  starts fresh instead of failing `Assign requires shapes of both tensors to match`."""
  audit = _queue_relaunch(tmp_path, STOCK_TASK, before, after)
  _assert_queue_exact(audit)
  resumed = audit[1]["workers"]
  assert set(resumed) >= {f"worker:{i}" for i in range(after)}, resumed
  assert len(resumed) <= max(before, after), resumed


def _static_batches(shards):
  data = [train.shard_arrays("linear", w, n, BATCH, FEATURES) for w, n in enumerate(shards)]
  return [[(x[i:i + BATCH], y[i:i + BATCH]) for i in range(0, len(y), BATCH)] for x, y in data]


def _run(tmp_path, name, command, num_workers):
  with LocalCluster(num_workers=num_workers, timeout_secs=120,
                    log_dir=str(tmp_path / f"logs-{name}")) as cluster:
    cluster.start(command)
    return cluster.wait()


@pytest.mark.timeout(300)
def test_tensorflows_own_session_goes_on_from_an_epoch_checkpoint_with_fewer_workers(tmp_path):
  """Static shards: epoch 0 on 4 workers, epoch 1 on 3 re-sharded ones; the model equals the
  oracle of both and the global step goes on."""
  model_dir = str(tmp_path / "model")
  before, after = (3, 2, 1, 2), (2, 4, 1)
  common = STOCK_TASK + [f"--model_dir={model_dir}", "--epochsync_save_checkpoint_secs=0"]
  _run(tmp_path, "four", common + ["--shard_batches=" + ",".join(map(str, before)),
                                   "--epochsync_num_epochs=1"], 4).check()
  _run(tmp_path, "three", common + ["--shard_batches=" + ",".join(map(str, after)),
                                    "--epochsync_num_epochs=2"], 3).check()
  audit = read_audit(model_dir)
  assert [(line["epoch"], len(line["workers"])) for line in audit] == [(0, 4), (1, 3)]
  start = {"w": np.zeros(FEATURES), "b": np.zeros(())}
  params, _ = oracle.lockstep_sgd(start, _static_batches(before), oracle.linear_mse_gradients,
                                  learning_rate=LR, num_epochs=1)
  params, _ = oracle.lockstep_sgd(params, _static_batches(after), oracle.linear_mse_gradients,
                                  learning_rate=LR, num_epochs=1)
  for name, value in params.items():
    np.testing.assert_allclose(checkpoint_value(audit[-1]["checkpoint"], name), value, atol=1e-5)
  assert audit[-1]["global_step"] == max(before) + max(after)
  chief_log = open(os.path.join(str(tmp_path / "logs-three"), "worker-0.log")).read()
  assert "epochsync/done_epochs [4] there, [3] here" in chief_log


@pytest.mark.timeout(300)
def test_tensorflows_own_session_refuses_static_shards_mid_epoch_with_another_count(tmp_path):
  """A mid-epoch checkpoint holds positions in the old shards: the relaunch with another count
  ends before its first step with a ConfigError that says what to do."""
  model_dir = str(tmp_path / "model")
  command = STOCK_TASK + [f"--model_dir={model_dir}", "--shard_batches=6,5,4",
                          "--epochsync_num_epochs=2", "--epochsync_save_checkpoint_secs=0",
                          "--epochsync_save_checkpoint_steps=2"]
  with LocalCluster(num_workers=3, timeout_secs=120, fail_fast_secs=30,
                    log_dir=str(tmp_path / "logs1")) as cluster:
    cluster.start(command + ["--step_sleep_secs=0.15"])
    kill_after_a_mid_epoch_save(cluster, model_dir, 1, "worker:0")
    cluster.wait()
  result = _run(tmp_path, "two", command, 2)
  assert not result.tasks["worker:0"].ok and not result.tasks["worker:0"].timed_out
  chief_log = open(os.path.join(str(tmp_path / "logs-two"), "worker-0.log")).read()
  assert "ConfigError" in chief_log, chief_log[-3000:]
  assert re.search(r"saved by a job of 3 workers and this job has 2.*delete <model_dir>/mid_epoch",
                   chief_log), chief_log[-3000:]
  assert len(read_audit(model_dir)) == 1  # nothing of epoch 1 was trained again
