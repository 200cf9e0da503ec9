"""estimator_ext.sync_optimizer takes what canned estimators take: a name, an instance, a callable.

A canned wide & deep (DNNLinearCombinedClassifier) trained through each form must end with the
same variables as the job given the instances the canned estimator would build itself.
"""

import math
import os

import numpy as np
import pytest
import tensorflow as tf

import estimator_ext
from estimator_ext import optimizer as optimizer_lib
from hooks.errors import ConfigError

pytestmark = pytest.mark.estimator
v1 = tf.compat.v1
VOCAB, DIM, BATCH, BATCHES = 12, 3, 8, 3
# tensorflow_estimator's canned wide & deep defaults: the DNN's Adagrad at 0.001, the linear
# part's Ftrl at min(0.005, 1/sqrt(#linear columns)).
DNN_RATE, LINEAR_RATE = 0.001, min(0.005, 1 / math.sqrt(1))


@pytest.fixture(autouse=True)
def local_mode(monkeypatch):
  monkeypatch.delenv("TF_CONFIG", raising=False)
  for name in list(os.environ):
    if name.startswith("EPOCHSYNC_"):
      monkeypatch.delenv(name)


def _input_fn(config=None):
  del config
  rng = np.random.default_rng(7)
  ids = rng.integers(0, VOCAB, size=(BATCH * BATCHES, 1)).astype(np.int64)
  return tf.data.Dataset.from_tensor_slices(({"id": ids}, ids % 2)).batch(BATCH)


def _decayed(rate):
  """Adagrad at `rate`, decayed on global_step by a factor 1 (so equal to the constant rate)."""
  return lambda: v1.train.AdagradOptimizer(v1.train.exponential_decay(
      rate, v1.train.get_global_step(), decay_steps=1, decay_rate=1.0))


def _train(model_dir, dnn_optimizer, linear_optimizer):
  ids = v1.feature_column.categorical_column_with_identity("id", VOCAB)
  config = estimator_ext.EpochSyncRunConfig(str(model_dir), num_epochs=1, tf_random_seed=3)
  estimator = v1.estimator.DNNLinearCombinedClassifier(
      linear_feature_columns=[ids], linear_optimizer=linear_optimizer,
      dnn_feature_columns=[v1.feature_column.embedding_column(ids, DIM)],
      dnn_optimizer=dnn_optimizer, dnn_hidden_units=[4], config=config)
  estimator_ext.train_and_evaluate(estimator, tf.estimator.TrainSpec(_input_fn),
                                   tf.estimator.EvalSpec(lambda: _input_fn(), steps=None))
  return {name: estimator.get_variable_value(name) for name in estimator.get_variable_names()}


def test_wide_deep_by_name_and_by_callable_equals_the_instances(tmp_path):
  sync = estimator_ext.sync_optimizer
  want = _train(tmp_path / "instance", sync(v1.train.AdagradOptimizer(DNN_RATE)),
                sync(v1.train.FtrlOptimizer(LINEAR_RATE)))
  by_name = _train(tmp_path / "name", sync("Adagrad"), sync("Ftrl"))
  by_callable = _train(tmp_path / "callable", sync(_decayed(DNN_RATE)),
                       sync(lambda: v1.train.FtrlOptimizer(LINEAR_RATE)))
  assert want["global_step"] == BATCHES
  assert any(not np.allclose(v, 0) for k, v in want.items() if "dnn/hiddenlayer_0/kernel" in k)
  for got in (by_name, by_callable):
    trained = {k for k in want if "Adagrad" not in k and "Ftrl" not in k}
    assert trained <= set(got)
    for name in trained:
      np.testing.assert_allclose(got[name], want[name], rtol=1e-6, atol=1e-7, err_msg=name)


class TestForms:

  def test_a_name_outside_a_canned_estimator_needs_a_learning_rate(self):
    with tf.Graph().as_default():
      var = v1.get_variable("w", initializer=1.0)
      with pytest.raises(ConfigError, match=r"sync_optimizer\('Adam'\) has no learning rate "
                                            r"outside a canned estimator: pass sync_optimizer"
                                            r"\('Adam', learning_rate=...\)"):
        estimator_ext.sync_optimizer("Adam").minimize(var * var)
      opt = estimator_ext.sync_optimizer("Adam", learning_rate=0.5)
      opt.minimize(var * var)
      assert type(opt._opt) is v1.train.AdamOptimizer and opt._opt._lr == 0.5

  def test_a_callable_is_called_once_per_graph_in_that_graph(self):
    graphs = []

    def make():
      graphs.append(v1.get_default_graph())
      return v1.train.GradientDescentOptimizer(0.1)

    opt = estimator_ext.sync_optimizer(make)
    for _ in range(2):
      with tf.Graph().as_default() as graph:
        var = v1.get_variable("w", initializer=1.0)
        opt.minimize(var * var)
        opt.minimize(var * var)
    assert len(graphs) == 2 and graphs[1] is graph

  @pytest.mark.parametrize("opt, match", [
      ("Adadelta", r"unknown optimizer name 'Adadelta'; the canned estimators' names are "
                   r"Adagrad, Adam, Ftrl, RMSProp, SGD"),
      (3, r"opt=3 is not a tf.compat.v1.train.Optimizer; pass a tf.compat.v1.train optimizer, "
          r"a canned name or a callable returning one")])
  def test_bad_forms_are_named(self, opt, match):
    with pytest.raises(ConfigError, match=match):
      estimator_ext.sync_optimizer(opt)

  def test_a_callable_returning_something_else_is_named(self):
    with tf.Graph().as_default():
      var = v1.get_variable("w", initializer=1.0)
      with pytest.raises(ConfigError, match=r"returned 'SGD', not a tf.compat.v1.train.Optimizer"):
        estimator_ext.sync_optimizer(lambda: "SGD").minimize(var * var)

  def test_the_names_are_the_canned_estimators(self):
    from tensorflow_estimator.python.estimator.canned import optimizers  # pylint: disable=all
    assert optimizer_lib.CANNED_OPTIMIZERS == optimizers._OPTIMIZER_CLS_NAMES
