"""Tests for hooks/checkpoint/partial_restore.py and the chief's partial restore in EpochSyncChiefSessionCreator."""

import numpy as np
import pytest
import tensorflow as tf

from hooks import graph_keys
from hooks.checkpoint import partial_restore as restore_lib
from hooks.session.creators import EpochSyncChiefSessionCreator
from tf_unit import graph, v1  # noqa: F401  (graph: a fresh graph per test)


def test_exports():
  assert sorted(restore_lib.__all__) == ["RestorePlan", "checkpoint_key", "restore_plan"]


def _model(num_workers=None):
  """w, b, global_step, a partitioned table; with num_workers, tf-epochsync-like state."""
  w = v1.get_variable("w", [3], initializer=v1.constant_initializer(0.5), use_resource=False)
  emb = v1.get_variable("emb", [6, 2], initializer=v1.ones_initializer(), use_resource=False,
                        partitioner=v1.fixed_size_partitioner(2))
  step = v1.train.get_or_create_global_step()
  state = []
  if num_workers:
    state = [v1.get_variable("epochsync/completed_epochs", [], tf.int64,
                             v1.zeros_initializer(), use_resource=False),
             v1.get_variable("epochsync/done_epochs", [num_workers], tf.int64,
                             v1.zeros_initializer(), use_resource=False)]
    for var in state:
      v1.add_to_collection(graph_keys.STATE_VARIABLES, var)
  return w, emb, step, state


def _save(tmp_path, num_workers=None, w_value=2.0, done=None):
  with tf.Graph().as_default():
    w, _, step, state = _model(num_workers)
    with v1.Session() as sess:
      sess.run(v1.global_variables_initializer())
      sess.run([w.assign(tf.fill([3], w_value)), step.assign(17)])
      if done is not None:
        sess.run([state[0].assign(2), state[1].assign(done)])
      return v1.train.Saver().save(sess, str(tmp_path / "model.ckpt"))


def test_a_stock_checkpoint_restores_the_model_and_starts_the_state_fresh(tmp_path):
  path = _save(tmp_path)  # no tf-epochsync state in it
  w, emb, step, state = _model(num_workers=3)
  plan = restore_lib.restore_plan(path, v1.global_variables())
  assert plan.fresh == state
  assert set(plan.restore) == {w, step, *emb}
  assert plan.reasons == ["epochsync/completed_epochs is not in the checkpoint",
                          "epochsync/done_epochs is not in the checkpoint"]
  creator = EpochSyncChiefSessionCreator(checkpoint_dir=str(tmp_path), task_name="chief:0")
  with v1.train.MonitoredSession(session_creator=creator) as sess:
    values = sess.run([w, step] + state)
  np.testing.assert_array_equal(values[0], [2.0, 2.0, 2.0])
  assert values[1] == 17 and values[2] == 0 and list(values[3]) == [0, 0, 0]


def test_another_worker_count_resizes_the_state_and_keeps_the_epoch(tmp_path):
  path = _save(tmp_path, num_workers=3, done=[2, 2, 2])
  w, _, step, state = _model(num_workers=2)
  plan = restore_lib.restore_plan(path, v1.global_variables())
  assert plan.fresh == [state[1]]
  assert plan.reasons == ["epochsync/done_epochs has shape [3] there and [2] here (the "
                          "checkpoint was written with another number of workers)"]
  creator = EpochSyncChiefSessionCreator(checkpoint_dir=str(tmp_path), task_name="chief:0")
  with v1.train.MonitoredSession(session_creator=creator) as sess:
    completed, done, restored_step = sess.run(state + [step])
  assert completed == 2 and list(done) == [0, 0] and restored_step == 17


def test_a_checkpoint_with_all_the_state_is_restored_as_usual(tmp_path):
  path = _save(tmp_path, num_workers=2, done=[2, 2])
  _, _, _, state = _model(num_workers=2)
  assert restore_lib.restore_plan(path, v1.global_variables()).fresh == []
  creator = EpochSyncChiefSessionCreator(checkpoint_dir=str(tmp_path), task_name="chief:0")
  with v1.train.MonitoredSession(session_creator=creator) as sess:
    assert [int(v) for v in sess.run(state[1])] == [2, 2]


def test_a_missing_model_variable_still_fails_as_in_stock_tensorflow(tmp_path):
  _save(tmp_path)
  _model(num_workers=2)
  v1.get_variable("new_layer", [2], use_resource=False)
  creator = EpochSyncChiefSessionCreator(checkpoint_dir=str(tmp_path), task_name="chief:0")
  with pytest.raises(tf.errors.NotFoundError, match="new_layer"):
    v1.train.MonitoredSession(session_creator=creator)


def test_a_stock_sync_replicas_checkpoint_is_a_stock_checkpoint(tmp_path):
  """Stock SyncReplicasOptimizer saves nothing of its own (its local step is a local variable,
  its queues and accumulators are no variables): switching on from it is switching on from a
  stock checkpoint."""
  with tf.Graph().as_default():
    w, _, step, _ = _model()
    opt = v1.train.SyncReplicasOptimizer(v1.train.GradientDescentOptimizer(0.1), 2, 2)
    opt.minimize(tf.reduce_sum(w * w), global_step=step)
    assert {v.op.name for v in v1.global_variables()} == {"w", "emb/part_0", "emb/part_1",
                                                           "global_step"}
    with v1.Session() as sess:
      sess.run(v1.global_variables_initializer())
      path = v1.train.Saver().save(sess, str(tmp_path / "model.ckpt"))
  _, _, _, state = _model(num_workers=2)
  assert restore_lib.restore_plan(path, v1.global_variables()).fresh == state


def test_state_saved_under_a_callers_scope_is_restored_into_the_absolute_names(tmp_path):
  """A canned estimator's sync state was saved as head/epochsync_sync_0/progress: it restores."""
  with tf.Graph().as_default():
    w, _, step, _ = _model()
    with tf.name_scope("head"):
      progress = v1.Variable([4, -1, 7], dtype=tf.int64, name="epochsync_sync_0/progress")
    assert progress.op.name == "head/epochsync_sync_0/progress"
    with v1.Session() as sess:
      sess.run(v1.global_variables_initializer())
      path = v1.train.Saver().save(sess, str(tmp_path / "model.ckpt"))
  w, emb, step, _ = _model()
  progress = v1.Variable([0, 0, 0], dtype=tf.int64, name="epochsync_sync_0/progress")
  v1.add_to_collection(graph_keys.STATE_VARIABLES, progress)
  plan = restore_lib.restore_plan(path, v1.global_variables())
  assert plan.renamed == {"head/epochsync_sync_0/progress": progress} and plan.fresh == []
  assert "epochsync_sync_0/progress from head/epochsync_sync_0/progress" in plan.describe()
  creator = EpochSyncChiefSessionCreator(checkpoint_dir=str(tmp_path), task_name="chief:0")
  with v1.train.MonitoredSession(session_creator=creator) as sess:
    assert list(sess.run(progress)) == [4, -1, 7]
