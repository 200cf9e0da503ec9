"""Tests for estimator_ext/warm_start.py: WarmStartSettings leave tf-epochsync's state fresh."""

import numpy as np
import pytest
import tensorflow as tf

from estimator_ext import warm_start as warm_start_lib
from hooks import graph_keys
from tf_unit import graph, v1  # noqa: F401  (graph: a fresh graph per test)


def test_exports():
  assert warm_start_lib.__all__ == ["without_epochsync_state"]


def _model(num_workers):
  """w, a table in 2 partitions, global_step, and sync-optimizer-like state for num_workers."""
  w = v1.get_variable("w", [3], initializer=v1.zeros_initializer(), use_resource=False)
  emb = v1.get_variable("emb", [4, 2], initializer=v1.zeros_initializer(), use_resource=False,
                        partitioner=v1.fixed_size_partitioner(2))
  step = v1.train.get_or_create_global_step()
  progress = v1.Variable(tf.fill([num_workers], tf.constant(-1, tf.int64)), trainable=False,
                         name="epochsync_sync_0/progress")
  v1.add_to_collection(graph_keys.STATE_VARIABLES, progress)
  return w, emb, step, progress


@pytest.fixture
def source(tmp_path):
  """A checkpoint of the model written with 2 workers: w=2, emb=3, global_step=17."""
  with tf.Graph().as_default():
    w, emb, step, progress = _model(num_workers=2)
    with v1.Session() as sess:
      sess.run(v1.global_variables_initializer())
      sess.run([w.assign(tf.fill([3], 2.0)), step.assign(17), progress.assign([5, 5])] +
               [part.assign(tf.fill(part.shape, 3.0)) for part in emb])
      return v1.train.Saver().save(sess, str(tmp_path / "source.ckpt"))


def test_a_list_of_scopes_warm_starts_everything_but_the_state(source):
  w, emb, step, progress = _model(num_workers=3)  # another worker count than the source
  settings = tf.estimator.WarmStartSettings(source, vars_to_warm_start=[".*"])
  with pytest.raises(ValueError, match=r"epochsync_sync_0/progress.*doesn't match"):
    v1.train.warm_start(*settings)  # what stock does with the state in the list
  kept = warm_start_lib.without_epochsync_state(settings)
  assert progress not in kept.vars_to_warm_start
  assert set(kept.vars_to_warm_start) == {w, step, *emb}
  assert kept.ckpt_to_initialize_from == source
  v1.train.warm_start(*kept)
  with v1.Session() as sess:
    sess.run(v1.global_variables_initializer())
    values = sess.run([w, step, progress] + list(emb))
  np.testing.assert_array_equal(values[0], [2.0, 2.0, 2.0])
  assert values[1] == 17 and list(values[2]) == [-1, -1, -1]  # the state's own initial value
  np.testing.assert_array_equal(np.concatenate(values[3:]), np.full([4, 2], 3.0))


def test_a_list_of_variables_loses_only_the_state(source):
  w, _, _, progress = _model(num_workers=2)
  kept = warm_start_lib.without_epochsync_state(
      tf.estimator.WarmStartSettings(source, vars_to_warm_start=[w, progress]))
  assert kept.vars_to_warm_start == [w]


@pytest.mark.parametrize("wanted", [".*", "w", None, ["w"]])
def test_settings_that_select_no_state_are_passed_on_unchanged(source, wanted):
  _model(num_workers=2)
  settings = tf.estimator.WarmStartSettings(source, vars_to_warm_start=wanted)
  assert warm_start_lib.without_epochsync_state(settings) is settings
