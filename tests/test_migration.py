"""Existing jobs keep their checkpoints: tf-epochsync switched on over a stock checkpoint, off
again, and a restart with another number of workers (real clusters, numpy oracle)."""

import json
import os
import sys

import numpy as np
import pytest

import cluster_checks
from examples import train
from hooks.epoch.audit import read_audit
from hooks.testing import oracle
from hooks.testing.local_cluster import LocalCluster

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

TASKS = os.path.join(os.path.dirname(__file__), "tasks")
EPOCH_TASK = [sys.executable, os.path.join(TASKS, "epoch_task.py")]
STOCK_TASK = [sys.executable, os.path.join(TASKS, "stock_task.py")]


def _run(tmp_path, name, command, num_workers):
  with LocalCluster(num_workers=num_workers, timeout_secs=120,
                    log_dir=str(tmp_path / f"logs-{name}")) as cluster:
    cluster.start(command)
    return cluster.wait().check()


def _params(checkpoint):
  return {name: np.asarray(cluster_checks.checkpoint_value(checkpoint, name), np.float64)
          for name in ("w", "b")}


def _batches(shards):
  data = [train.shard_arrays("linear", w, n, 8, 16) for w, n in enumerate(shards)]
  return [[(x[i:i + 8], y[i:i + 8]) for i in range(0, len(y), 8)] for x, y in data]


def _assert_close(checkpoint, expected):
  for name, value in expected.items():
    np.testing.assert_allclose(cluster_checks.checkpoint_value(checkpoint, name), value,
                               atol=1e-5, err_msg=name)


@pytest.mark.timeout(300)
def test_switch_on_over_a_stock_checkpoint_then_off_again(tmp_path):
  import tensorflow as tf
  model_dir = str(tmp_path / "model")
  os.makedirs(model_dir)
  # 1. The existing stock job: asynchronous, 7 steps, a checkpoint at the end.
  _run(tmp_path, "stock", STOCK_TASK + [f"--model_dir={model_dir}", "--shard_batches=4",
                                        "--stock_steps=7"], num_workers=1)
  stock_ckpt = tf.train.latest_checkpoint(model_dir)
  stock = _params(stock_ckpt)
  assert cluster_checks.checkpoint_value(stock_ckpt, "global_step") == 7
  assert "epochsync/completed_epochs" not in dict(tf.train.list_variables(stock_ckpt))

  # 2. Switched on: 2 synchronous epochs on 3 workers from the stock parameters.
  shards = (3, 2, 0)
  _run(tmp_path, "on", EPOCH_TASK + [f"--model_dir={model_dir}", "--shard_batches=3,2,0",
                                     "--epochsync_num_epochs=2"], num_workers=3)
  audit = read_audit(model_dir)
  assert [line["epoch"] for line in audit] == [0, 1]  # epoch counting starts at 0
  assert [line["global_step"] for line in audit] == [7 + 3, 7 + 6]  # global_step goes on
  expected, _ = oracle.lockstep_sgd(stock, _batches(shards), oracle.linear_mse_gradients,
                                    learning_rate=0.05, num_epochs=2)
  _assert_close(audit[-1]["checkpoint"], expected)
  chief_log = open(os.path.join(str(tmp_path / "logs-on"), "worker-0.log")).read()
  assert "tf-epochsync's own state starts fresh" in chief_log
  assert "epoch counting starts at 0 for this run" in chief_log

  # 3. Switched off again: the stock job restores the tf-epochsync checkpoint as it is.
  _run(tmp_path, "off", STOCK_TASK + [f"--model_dir={model_dir}", "--shard_batches=4",
                                      "--stock_steps=2"], num_workers=1)
  with open(os.path.join(model_dir, "stock-worker-0.json")) as f:
    off = json.load(f)
  assert off["start_step"] == 13 and off["end_step"] == 15
  for name, value in expected.items():
    np.testing.assert_allclose(off["restored"][name], value, atol=1e-5)
  # load_checkpoint users see the model under its own names, beside harmless extra state.
  names = dict(tf.train.list_variables(tf.train.latest_checkpoint(model_dir)))
  assert {"w", "b", "global_step"} <= set(names)


@pytest.mark.timeout(300)
def test_a_restart_with_fewer_workers_resizes_the_epoch_state(tmp_path):
  model_dir = str(tmp_path / "model")
  _run(tmp_path, "three", EPOCH_TASK + [f"--model_dir={model_dir}", "--shard_batches=3,2,1",
                                        "--epochsync_num_epochs=1"], num_workers=3)
  _run(tmp_path, "two", EPOCH_TASK + [f"--model_dir={model_dir}", "--shard_batches=2,4",
                                      "--epochsync_num_epochs=2"], num_workers=2)
  audit = read_audit(model_dir)
  assert [(line["epoch"], sorted(line["workers"])) for line in audit] == [
      (0, ["worker:0", "worker:1", "worker:2"]), (1, ["worker:0", "worker:1"])]
  start = {"w": np.zeros(16), "b": np.zeros(())}
  after_0, _ = oracle.lockstep_sgd(start, _batches((3, 2, 1)), oracle.linear_mse_gradients,
                                   learning_rate=0.05, num_epochs=1)
  after_1, _ = oracle.lockstep_sgd(after_0, _batches((2, 4)), oracle.linear_mse_gradients,
                                   learning_rate=0.05, num_epochs=1)
  _assert_close(audit[-1]["checkpoint"], after_1)
  assert audit[-1]["global_step"] == 3 + 4
  chief_log = open(os.path.join(str(tmp_path / "logs-two"), "worker-0.log")).read()
  assert "has shape [3] there and [2] here" in chief_log
  assert "epoch counting goes on from the checkpoint" in chief_log
