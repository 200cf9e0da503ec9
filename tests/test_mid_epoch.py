"""Tests for hooks/checkpoint/mid_epoch.py in-process: which checkpoint a restart restores, an exact resume
of a chief alone after a crash inside an epoch, and the refusals.

The chief alone trains asynchronously (no sync optimizer): its mid-epoch position is its own
applied-batch count. The synchronous position and real kills: tests/test_mid_epoch_cluster.py.
"""

import glob
import os

import numpy as np
import pytest
import tensorflow as tf

from hooks.checkpoint import mid_epoch
from hooks.checkpoint.mid_epoch_restore import MidEpochRestoreHook
from hooks.checkpoint.mid_epoch_resume import MidEpochResume
from hooks.epoch.audit import read_audit
from hooks.epoch.barrier import EpochBarrierHook
from hooks.checkpoint.epoch_save import ChiefSaveAfterBarrierHook
from hooks.data.epoch_input import EpochInput
from hooks.errors import ConfigError
from hooks.session.creators import EpochSyncChiefSessionCreator
from tf_unit import LOCAL, graph, user_loop, v1  # noqa: F401  (graph: a fresh graph per test)

EXAMPLES, BATCH, EPOCHS = 12, 2, 2  # 6 batches per epoch


class _Crash(v1.train.SessionRunHook):
  """Raises after the step that takes global_step to `at` (a crash inside an epoch)."""

  def __init__(self, at):
    self._at = at

  def before_run(self, run_context):
    return v1.train.SessionRunArgs(v1.train.get_global_step())

  def after_run(self, run_context, run_values):
    if run_values.results == self._at:
      raise RuntimeError("crash")


def _run(model_dir, examples=EXAMPLES, crash_at=None, save_steps=2, num_workers=1,
         creator="epochsync"):
  """One attempt of a chief alone; returns its EpochInput's history. `creator`: tf-epochsync's
  session creator, TensorFlow's ChiefSessionCreator with a MidEpochRestoreHook ("stock+hook"),
  or TensorFlow's alone ("stock")."""
  with tf.Graph().as_default():
    epoch_input = EpochInput(tf.data.Dataset.from_tensor_slices(
        np.arange(examples, dtype=np.float32)).batch(BATCH), num_epochs=EPOCHS,
        task_name="chief:0")
    global_step = v1.train.get_or_create_global_step()
    total = v1.get_variable("total", [], tf.float32, v1.zeros_initializer(), use_resource=False)
    train_op = tf.group(v1.assign_add(total, tf.reduce_sum(epoch_input.get_next())),
                        v1.assign_add(global_step, 1))
    barrier = EpochBarrierHook(epoch_input, 1, 0, ("chief:0",), audit_dir=model_dir,
                               ps_device=LOCAL)
    resume = MidEpochResume(epoch_input, num_workers, 0, None, count_applied=True,
                                      ps_device=LOCAL)
    save = ChiefSaveAfterBarrierHook(barrier, model_dir, save_graph_def=False)
    mid = mid_epoch.MidEpochSaveHook(epoch_input, barrier, model_dir, save_secs=0,
                                     save_steps=save_steps, ps_device=LOCAL)
    hooks = [barrier, resume, save, mid] + ([_Crash(crash_at)] if crash_at else [])
    if creator == "stock+hook":
      hooks.insert(0, MidEpochRestoreHook(model_dir, num_workers, ps_device=LOCAL))
    session_creator = (EpochSyncChiefSessionCreator(checkpoint_dir=model_dir)
                       if creator == "epochsync" else
                       v1.train.ChiefSessionCreator(checkpoint_dir=model_dir))
    with v1.train.MonitoredSession(session_creator,
                                   hooks=hooks + [epoch_input.hook]) as sess:
      user_loop(sess, train_op)
    return epoch_input.hook.history


def test_a_crash_inside_an_epoch_resumes_after_the_last_saved_batch(tmp_path):
  model_dir = str(tmp_path)
  with pytest.raises(RuntimeError, match="crash"):
    _run(model_dir, crash_at=9)  # epoch 1: saved at global_step 8 (2 batches), 9 is lost
  assert os.path.basename(mid_epoch.checkpoint_to_restore(model_dir)) == "model.ckpt-epoch0001-8"
  history = _run(model_dir)
  assert [(s.epoch, s.batches, s.skipped_batches) for s in history] == [(1, 6, 2)]
  # The epoch's examples: the 2 batches of attempt 1 (4 examples) and attempt 2's 8.
  assert [(s.examples, s.skipped_examples) for s in history] == [(EXAMPLES, 2 * BATCH)]
  newest = tf.train.latest_checkpoint(model_dir)
  # Every example once per epoch: nothing trained twice (step 9 was lost), nothing skipped.
  assert tf.train.load_variable(newest, "total") == EPOCHS * sum(range(EXAMPLES))
  assert tf.train.load_variable(newest, "global_step") == EPOCHS * EXAMPLES // BATCH
  audit = read_audit(model_dir)
  assert [line["workers"]["chief:0"]["batches"] for line in audit] == [6, 6]
  assert [line["workers"]["chief:0"]["examples"] for line in audit] == [EXAMPLES] * EPOCHS
  assert [line["workers"]["chief:0"]["attempt"] for line in audit] == [1, 2]
  assert audit[1]["attempts"] == [1, 2] and audit[1]["attempt"] == 2
  assert [(r["attempt"], r["global_step"], r["epoch_step"], r["skipped_batches"])
          for r in audit[1]["resumed_from"]] == [(2, 8, -1, {"chief:0": 2})]
  # Retention: the mid-epoch directory keeps 2; the epoch checkpoints are all there.
  kept = glob.glob(os.path.join(model_dir, "mid_epoch", "*.index"))
  assert len(kept) == mid_epoch.MAX_TO_KEEP
  assert len(glob.glob(os.path.join(model_dir, "model.ckpt-epoch*.index"))) == EPOCHS
  # The newest mid-epoch checkpoint (epoch 1) is older than the epoch 1 checkpoint: stale.
  assert mid_epoch.checkpoint_to_restore(model_dir) is None


def test_tensorflows_chief_session_creator_with_the_restore_hook_resumes_exactly(tmp_path):
  model_dir = str(tmp_path)
  with pytest.raises(RuntimeError, match="crash"):
    _run(model_dir, crash_at=9, creator="stock+hook")
  history = _run(model_dir, creator="stock+hook")
  assert [(s.epoch, s.batches, s.skipped_batches) for s in history] == [(1, 6, 2)]
  newest = tf.train.latest_checkpoint(model_dir)
  assert tf.train.load_variable(newest, "total") == EPOCHS * sum(range(EXAMPLES))
  assert tf.train.load_variable(newest, "global_step") == EPOCHS * EXAMPLES // BATCH


def test_tensorflows_chief_session_creator_alone_warns_what_it_trains_again(tmp_path, caplog):
  """Without the restore hook the epoch is trained again from its start: exact, but the
  mid-epoch progress is lost; the chief says so once, with the one-line change."""
  model_dir = str(tmp_path)
  with pytest.raises(RuntimeError, match="crash"):
    _run(model_dir, crash_at=9, creator="stock")
  history = _run(model_dir, creator="stock")
  assert [(s.epoch, s.batches, s.skipped_batches) for s in history] == [(1, 6, 0)]
  warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and
              "not the newer mid-epoch checkpoint" in r.getMessage()]
  assert len(warnings) == 1, warnings
  assert "model.ckpt-epoch0001-8" in warnings[0] and "epoch 1 is trained again" in warnings[0]
  assert "hooks.MidEpochRestoreHook(model_dir, num_workers)" in warnings[0]


def test_a_resume_with_a_shard_of_another_size_is_refused(tmp_path):
  model_dir = str(tmp_path)
  with pytest.raises(RuntimeError, match="crash"):
    _run(model_dir, crash_at=9)
  with pytest.raises(ConfigError, match=r"had 6 batches .* has 7 now.*delete <model_dir>/mid_epoch"):
    _run(model_dir, examples=EXAMPLES + 2)


def test_a_resume_with_another_worker_count_is_refused(tmp_path):
  model_dir = str(tmp_path)
  with pytest.raises(RuntimeError, match="crash"):
    _run(model_dir, crash_at=9)
  with pytest.raises(ConfigError, match=r"saved by a job of 1 workers and this job has 2.*"
                                        r"restart with 1 workers, or resume from the last epoch "
                                        r"checkpoint instead \(delete <model_dir>/mid_epoch"):
    _run(model_dir, num_workers=2)


def test_no_mid_epoch_checkpoint_restores_the_epoch_checkpoint(tmp_path):
  assert mid_epoch.checkpoint_to_restore(str(tmp_path)) is None
  with pytest.raises(RuntimeError, match="crash"):
    _run(str(tmp_path), crash_at=5, save_steps=100)  # no mid-epoch save yet: epoch 0 again
  assert not glob.glob(os.path.join(str(tmp_path), "mid_epoch", "*.index"))
  history = _run(str(tmp_path), save_steps=100)
  assert [(s.epoch, s.batches, s.skipped_batches) for s in history] == [(0, 6, 0), (1, 6, 0)]


def test_the_save_period_is_exactly_one_of_secs_and_steps():
  epoch_input = EpochInput(tf.data.Dataset.range(3), num_epochs=1)
  barrier = EpochBarrierHook(epoch_input, 1, 0, ps_device=LOCAL)
  with pytest.raises(ConfigError, match="exactly one of save_secs=600 and save_steps=5"):
    mid_epoch.MidEpochSaveHook(epoch_input, barrier, "/tmp/x", save_secs=600, save_steps=5)
