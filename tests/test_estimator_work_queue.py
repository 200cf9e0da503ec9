"""estimator_ext.work_units on a real cluster: the example's linear Estimator job trains units
through the work queue, every unit once per epoch, equal to the lockstep oracle of the workers'
recorded unit streams."""

import os
import sys

import numpy as np
import pytest

from hooks.epoch.audit import read_audit
from hooks.testing import oracle
from hooks.testing.local_cluster import LocalCluster
from cluster_checks import (assert_workers_count_every_attempt, checkpoint_value,
                            kill_after_a_mid_epoch_save, steps_sgd, unit_steps)

pytestmark = [pytest.mark.cluster]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TASK = [sys.executable, os.path.join(ROOT, "tests", "tasks", "estimator_task.py")]
UNITS = [5, 1, 3, 6, 2, 4, 1]


def _streams(line, names):
  from examples import estimator_data  # pylint: disable=g-import-not-at-top; no flags here
  batch = estimator_data.BATCH_SIZE
  x, y = estimator_data.shard_arrays(999, sum(UNITS))  # estimator_task.unit_train_input_fn
  starts = np.cumsum([0] + UNITS[:-1]) * batch
  streams = []
  for name in names:
    mine = sorted((u for u in line["units"] if u["worker"] == name), key=lambda u: u["first_batch"])
    rows = [r for u in mine for r in range(starts[u["index"]],
                                           starts[u["index"]] + UNITS[u["index"]] * batch, batch)]
    streams.append([(x[r:r + batch], y[r:r + batch]) for r in rows])
  return streams


@pytest.mark.timeout(240)
def test_estimator_work_units_are_trained_once_and_equal_the_oracle(tmp_path):
  from examples import estimator_data  # pylint: disable=g-import-not-at-top
  model_dir, epochs = str(tmp_path / "model"), 2
  with LocalCluster(num_workers=3, num_ps=1, has_chief=True, timeout_secs=180,
                    log_dir=str(tmp_path / "logs")) as cluster:
    cluster.start(TASK + [f"--model_dir={model_dir}", f"--epochsync_num_epochs={epochs}",
                          "--unit_batches=" + ",".join(map(str, UNITS))])
    result = cluster.wait()
  result.check()
  names = cluster.training_task_names
  audit = read_audit(model_dir)
  assert [line["epoch"] for line in audit] == list(range(epochs))
  params = {"w": np.zeros(estimator_data.FEATURES), "b": np.zeros(())}
  steps = 0
  for line in audit:
    assert sorted(u["index"] for u in line["units"]) == list(range(len(UNITS)))
    assert all(u["batches"] == UNITS[u["index"]] for u in line["units"]), line["units"]
    params, epoch_steps = oracle.lockstep_sgd(params, _streams(line, names),
                                              oracle.linear_mse_gradients, learning_rate=0.05)
    steps += epoch_steps
    assert line["global_step"] == steps
  for name, value in params.items():
    np.testing.assert_allclose(checkpoint_value(audit[-1]["checkpoint"], name), value, atol=1e-5)


@pytest.mark.timeout(400)
@pytest.mark.parametrize("workers_after", [pytest.param(3, marks=pytest.mark.variant), 2],
                         ids=["same-workers", "fewer-workers"])
def test_estimator_work_units_resume_a_mid_epoch_checkpoint_exactly(tmp_path, workers_after):
  """A worker killed after a mid-epoch save of epoch 1; the relaunch (3 training tasks as
  before, or 2) finishes the units in flight from the step the checkpoint holds: every batch
  once, equal to the recorded steps."""
  from examples import estimator_data  # pylint: disable=g-import-not-at-top
  model_dir = str(tmp_path / "model")
  command = TASK + [f"--model_dir={model_dir}", "--epochsync_num_epochs=2",
                    "--unit_batches=" + ",".join(map(str, UNITS)),
                    "--epochsync_save_checkpoint_secs=0", "--epochsync_save_checkpoint_steps=2"]
  cluster_args = dict(num_ps=1, has_chief=True, timeout_secs=180)
  with LocalCluster(num_workers=3, log_dir=str(tmp_path / "logs1"), fail_fast_secs=30,
                    **cluster_args) as first:
    first.start(command + ["--step_sleep_secs=0.15"])
    kill_after_a_mid_epoch_save(first, model_dir, 1, "worker:0")
    first.wait()
  with LocalCluster(num_workers=workers_after, log_dir=str(tmp_path / "logs2"),
                    **cluster_args) as second:
    second.start(command)
    second.wait().check()
  audit = read_audit(model_dir)
  assert [line["epoch"] for line in audit] == [0, 1] and audit[1]["attempts"] == [1, 2]
  batch = estimator_data.BATCH_SIZE
  x, y = estimator_data.shard_arrays(999, sum(UNITS))
  starts = np.cumsum([0] + UNITS[:-1]) * batch
  row = lambda index, k: starts[index] + k * batch
  params, steps = {"w": np.zeros(estimator_data.FEATURES), "b": np.zeros(())}, 0
  for line in audit:
    assert all(u["batches"] == UNITS[u["index"]] for u in line["units"]), line["units"]
    assert_workers_count_every_attempt(line, UNITS, batch)
    epoch_steps = unit_steps(line, sum(UNITS), lambda i, k: (x[row(i, k):row(i, k) + batch],
                                                             y[row(i, k):row(i, k) + batch]))
    params = steps_sgd(params, epoch_steps, oracle.linear_mse_gradients, 0.05)
    steps += len(epoch_steps)
    assert line["global_step"] == steps
  for name, value in params.items():
    np.testing.assert_allclose(checkpoint_value(audit[-1]["checkpoint"], name), value, atol=1e-5)
