"""Tests for hooks/epoch/summaries.py: the chief's per-epoch TensorBoard scalars, read back.

In-process: one chief (num_workers=1) whose barrier state lives on the local device.
"""

import numpy as np
import pytest
import tensorflow as tf

from hooks.epoch import summaries as summaries_lib
from hooks.epoch.barrier import EpochBarrierHook
from hooks.checkpoint.epoch_save import ChiefSaveAfterBarrierHook
from hooks.data.epoch_input import EpochInput
from hooks.epoch.summaries import EpochSummaryHook, read_epoch_summaries
from hooks.errors import ConfigError
from tf_unit import LOCAL, graph, v1  # noqa: F401  (graph: a fresh graph per test)
from tf_unit import train as _train

SHARD = np.arange(10, dtype=np.float32)  # batches of 4 -> 3 batches (4, 4, 2) per epoch


def _hooks(model_dir, num_epochs):
  epoch_input = EpochInput(tf.data.Dataset.from_tensor_slices(SHARD).batch(4),
                           num_epochs=num_epochs, task_name="worker:0")
  global_step = v1.train.get_or_create_global_step()
  total = v1.get_variable("total", [], tf.float32, v1.zeros_initializer(), use_resource=False)
  train_op = tf.group(v1.assign_add(total, tf.reduce_sum(epoch_input.get_next())),
                      v1.assign_add(global_step, 1))
  barrier = EpochBarrierHook(epoch_input, num_workers=1, worker_id=0, ps_device=LOCAL)
  save = ChiefSaveAfterBarrierHook(barrier, model_dir)
  summaries = EpochSummaryHook(barrier, model_dir)
  return [barrier, save, summaries, epoch_input.hook], train_op


def test_exports():
  assert sorted(summaries_lib.__all__) == ["EpochSummaryHook", "SUBDIR", "read_epoch_summaries"]


def test_validation():
  epoch_input = EpochInput(tf.data.Dataset.range(2), num_epochs=1)
  with pytest.raises(ConfigError, match=r"output_dir is empty; pass the model_dir"):
    EpochSummaryHook(EpochBarrierHook(epoch_input, 2, 0), "")
  with pytest.raises(ConfigError, match=r"chief only, but the barrier is worker:1's"):
    EpochSummaryHook(EpochBarrierHook(epoch_input, 2, 1), "/tmp/x")


def test_scalars_per_epoch_are_read_back(tmp_path):
  model_dir = str(tmp_path)
  hooks, train_op = _hooks(model_dir, num_epochs=3)
  assert _train(hooks, train_op, checkpoint_dir=model_dir) == 9
  got = read_epoch_summaries(model_dir)
  assert got["epoch/steps"] == {0: 3, 1: 3, 2: 3}
  assert got["epoch/global_step"] == {0: 3, 1: 6, 2: 9}
  assert got["epoch/examples"] == {0: 10, 1: 10, 2: 10}
  assert got["batches/worker:0"] == {0: 3, 1: 3, 2: 3}
  assert got["examples/worker:0"] == {0: 10, 1: 10, 2: 10}
  for tag in ("epoch/wall_secs", "epoch_secs/worker:0", "barrier_wait_secs/worker:0"):
    assert sorted(got[tag]) == [0, 1, 2] and all(0 <= v < 10 for v in got[tag].values()), tag
  assert all(got["epoch/wall_secs"][e] >= got["epoch_secs/worker:0"][e] - 1e-3 for e in range(3))


def test_steps_after_a_restart_count_from_the_restored_step(tmp_path):
  model_dir = str(tmp_path)
  hooks, train_op = _hooks(model_dir, num_epochs=2)
  _train(hooks, train_op, checkpoint_dir=model_dir)
  with tf.Graph().as_default():  # A new process: same model_dir, one more epoch.
    hooks, train_op = _hooks(model_dir, num_epochs=3)
    assert _train(hooks, train_op, checkpoint_dir=model_dir) == 3  # only epoch 2 trains
  got = read_epoch_summaries(model_dir)
  assert got["epoch/steps"] == {0: 3, 1: 3, 2: 3}  # not 9: counted from the restored step 6
  assert got["epoch/global_step"] == {0: 3, 1: 6, 2: 9}
