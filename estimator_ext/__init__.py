"""Epoch-exact synchronous training for tf.estimator users: a RunConfig and train_and_evaluate.

Typical usage:
  import estimator_ext
  optimizer = estimator_ext.sync_optimizer(tf.compat.v1.train.AdagradOptimizer(0.05))  # model_fn
  config = estimator_ext.EpochSyncRunConfig(model_dir="/shared/run1", num_epochs=3)
  estimator = tf.compat.v1.estimator.Estimator(model_fn, config=config)
  estimator_ext.train_and_evaluate(estimator, train_spec, eval_spec)
Needs TensorFlow 2.15 with tensorflow-estimator 2.15.0; elsewhere (TensorFlow 2.16+, which has
no tf.estimator) the import raises hooks.errors.EstimatorUnavailableError (an ImportError).
"""

from hooks.config import tf_version as _tf_version

_tf_version.check_estimator()

# pylint: disable=g-import-not-at-top,wrong-import-position
from estimator_ext.early_stopping import EarlyStopping
from estimator_ext.eval_log import read_eval_log
from estimator_ext.evaluator import EvaluatorTimeoutError
from estimator_ext.optimizer import EpochSyncOptimizer, sync_optimizer
from estimator_ext.run_config import EpochSyncRunConfig
from estimator_ext.training import EpochResults, shard, train_and_evaluate, work_units

__all__ = [
    "EarlyStopping",
    "EpochResults",
    "EpochSyncOptimizer",
    "EpochSyncRunConfig",
    "EvaluatorTimeoutError",
    "read_eval_log",
    "shard",
    "work_units",
    "sync_optimizer",
    "train_and_evaluate",
]
