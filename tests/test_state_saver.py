"""Tests for hooks/checkpoint/state_saver.py: TensorFlow's own ChiefSessionCreator restores a
checkpoint of another worker count through the chief's StateResizingSaver."""

import os

import numpy as np
import pytest
import tensorflow as tf

from hooks import graph_keys
from hooks.checkpoint.state_saver import StateResizingSaver, StateSaverHook
from tf_unit import graph, v1  # noqa: F401  (graph: a fresh graph per test)


def _model(num_workers):
  """w, a partitioned table, global_step, and tf-epochsync-like state for `num_workers`."""
  w = v1.get_variable("w", [3], initializer=v1.constant_initializer(0.5), use_resource=False)
  emb = v1.get_variable("emb", [6, 2], initializer=v1.ones_initializer(), use_resource=False,
                        partitioner=v1.fixed_size_partitioner(2))
  step = v1.train.get_or_create_global_step()
  state = [v1.get_variable("epochsync/completed_epochs", [], tf.int64, v1.zeros_initializer(),
                           use_resource=False),
           v1.get_variable("epochsync/arrived_barrier", [num_workers], tf.int64,
                           v1.constant_initializer(-1), use_resource=False)]
  for var in state:
    v1.add_to_collection(graph_keys.STATE_VARIABLES, var)
  return w, emb, step, state


def _save(model_dir, num_workers):
  """A stock Saver's checkpoint: w=2, emb=7, global_step 17, 2 epochs, arrivals 0..n-1."""
  with tf.Graph().as_default():
    w, emb, step, state = _model(num_workers)
    with v1.Session() as sess:
      sess.run(v1.global_variables_initializer())
      sess.run([w.assign(tf.fill([3], 2.0)), step.assign(17), state[0].assign(2),
                state[1].assign(tf.range(num_workers, dtype=tf.int64))]
               + [p.assign(tf.fill(p.shape, 7.0)) for p in emb])
      return v1.train.Saver().save(sess, os.path.join(model_dir, "model.ckpt"))


def _restore_with_tensorflows_creator(model_dir, hooks):
  w, emb, step, state = _model(num_workers=3)
  creator = v1.train.ChiefSessionCreator(checkpoint_dir=model_dir)
  with v1.train.MonitoredSession(session_creator=creator, hooks=hooks) as sess:
    return sess.run({"w": w, "emb": list(emb), "step": step, "epochs": state[0],
                     "arrived": state[1]})


@pytest.mark.parametrize("saved_workers", [4, 2])
def test_state_of_another_worker_count_restores_fresh_and_the_model_as_saved(tmp_path,
                                                                             saved_workers):
  _save(str(tmp_path), saved_workers)
  got = _restore_with_tensorflows_creator(str(tmp_path), [StateSaverHook(str(tmp_path))])
  np.testing.assert_array_equal(got["w"], [2.0, 2.0, 2.0])
  assert all((part == 7.0).all() for part in got["emb"])
  assert got["step"] == 17 and got["epochs"] == 2  # epoch counting goes on
  assert list(got["arrived"]) == [-1, -1, -1]  # its initial value, sized for 3


def test_state_of_the_same_worker_count_restores_as_saved(tmp_path):
  _save(str(tmp_path), 3)
  got = _restore_with_tensorflows_creator(str(tmp_path), [StateSaverHook(str(tmp_path))])
  assert got["epochs"] == 2 and list(got["arrived"]) == [0, 1, 2]


def test_without_the_hook_tensorflow_refuses_another_worker_count(tmp_path):
  """What the hook is for: the default Saver fails on the per-worker state's shape."""
  _save(str(tmp_path), 4)
  with pytest.raises(tf.errors.InvalidArgumentError, match="shapes of both tensors to match"):
    _restore_with_tensorflows_creator(str(tmp_path), [])


def test_its_checkpoints_are_a_stock_savers(tmp_path):
  """Saved under the usual names and shapes: a stock Saver restores them."""
  w, _, step, state = _model(num_workers=3)
  saver = StateResizingSaver()
  v1.add_to_collection(v1.GraphKeys.SAVERS, saver)
  assign = [w.assign(tf.fill([3], 4.0)), state[1].assign([5, 6, 7]), step.assign(3)]
  with v1.train.MonitoredSession(hooks=[]) as sess:
    sess.run(assign)
    path = saver.save(sess._tf_sess(), str(tmp_path / "model.ckpt"))  # pylint: disable=protected-access
  stored = dict(tf.train.list_variables(path))
  assert stored["epochsync/arrived_barrier"] == [3] and stored["w"] == [3]
  assert list(tf.train.load_variable(path, "epochsync/arrived_barrier")) == [5, 6, 7]


def test_a_saver_the_job_chose_is_left_alone():
  _model(num_workers=3)
  own = v1.train.Saver()
  v1.add_to_collection(v1.GraphKeys.SAVERS, own)
  StateSaverHook(None).begin()
  assert v1.get_collection(v1.GraphKeys.SAVERS) == [own]


def test_it_covers_what_the_graph_holds_when_the_scaffold_finalizes(tmp_path):
  """Built at finalize: a variable a later hook creates in its begin() is saved too."""
  _model(num_workers=3)
  hook = StateSaverHook(str(tmp_path))
  hook.begin()

  class _LateVariable(v1.train.SessionRunHook):
    def begin(self):
      v1.get_variable("late", [], initializer=v1.ones_initializer(), use_resource=False)

  with v1.train.MonitoredSession(
      session_creator=v1.train.ChiefSessionCreator(checkpoint_dir=str(tmp_path)),
      hooks=[_LateVariable()]) as sess:
    saver = v1.get_collection(v1.GraphKeys.SAVERS)[0]
    path = saver.save(sess._tf_sess(), str(tmp_path / "model.ckpt"))  # pylint: disable=protected-access
  assert "late" in dict(tf.train.list_variables(path))


def test_it_says_when_the_state_is_resized(tmp_path, caplog):
  _save(str(tmp_path), 4)
  caplog.set_level("INFO", logger="tensorflow")  # the verbosity hooks.log follows (an earlier
  caplog.set_level("INFO")                        # test of the process may have raised it)
  _restore_with_tensorflows_creator(str(tmp_path), [StateSaverHook(str(tmp_path))])
  assert "epochsync/arrived_barrier [4] there, [3] here" in caplog.text
  assert "epoch counting goes on" in caplog.text
