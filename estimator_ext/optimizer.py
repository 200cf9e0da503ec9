"""The one-line switch for model_fn authors: wrap the optimizer, train synchronously.

`sync_optimizer(opt)` returns an optimizer that, in the training graph that
`estimator_ext.train_and_evaluate` builds with sync on, becomes a
`hooks.sync.optimizer.WorkerDoneSyncReplicasOptimizer` (worker-done-aware aggregation, its own
step counter so that a canned head may increment global_step itself and two optimizers may share
a step); anywhere else (sync off, local mode, evaluation) it is `opt` itself.

Typical usage (in a model_fn, or as a canned estimator's optimizer argument):
  optimizer = estimator_ext.sync_optimizer(tf.compat.v1.train.AdagradOptimizer(0.05))
  train_op = optimizer.minimize(loss, global_step=tf.compat.v1.train.get_global_step())
"""

import dataclasses
import weakref
from typing import List, Optional, Sequence

import tensorflow as tf

from hooks import log as logging
from hooks.errors import ConfigError
from hooks.sync.optimizer import DelegatingOptimizer, WorkerDoneSyncReplicasOptimizer

__all__ = ["EpochSyncOptimizer", "sync_optimizer", "mark_training_graph", "sync_optimizers"]

_v1 = tf.compat.v1


@dataclasses.dataclass
class _Build:
  """What the training graph being built needs to know to make synchronous optimizers."""
  sync: bool
  num_workers: int
  worker_id: int
  worker_names: Sequence[str]
  divide_by_initial_workers: bool
  optimizers: List[WorkerDoneSyncReplicasOptimizer] = dataclasses.field(default_factory=list)


_BUILDS: "weakref.WeakKeyDictionary[tf.Graph, _Build]" = weakref.WeakKeyDictionary()
_warned_outside = False


def mark_training_graph(graph: tf.Graph, *, sync: bool, num_workers: int, worker_id: int,
                        worker_names: Sequence[str], divide_by_initial_workers: bool = False
                        ) -> None:
  """Marks `graph` as train_and_evaluate's training graph (before its model_fn is called)."""
  _BUILDS[graph] = _Build(sync, num_workers, worker_id, tuple(worker_names),
                          divide_by_initial_workers)


def sync_optimizers(graph: tf.Graph) -> List[WorkerDoneSyncReplicasOptimizer]:
  """The synchronous optimizers built in `graph`, in the order model_fn applied them."""
  build = _BUILDS.get(graph)
  return list(build.optimizers) if build else []


class EpochSyncOptimizer(DelegatingOptimizer):
  """An optimizer that trains synchronously under `estimator_ext.train_and_evaluate`.

  Prefer `sync_optimizer(opt)`. It computes gradients with `opt`; `apply_gradients` builds a
  `WorkerDoneSyncReplicasOptimizer` around `opt` in a training graph with sync on (one per
  graph, so the same object serves every graph the Estimator builds), else applies with `opt`.

      optimizer = EpochSyncOptimizer(tf.compat.v1.train.FtrlOptimizer(0.1))
      est = tf.compat.v1.estimator.LinearRegressor(columns, optimizer=optimizer, config=config)

  Args:
    opt: the `tf.compat.v1.train.Optimizer` that computes and applies the gradients.
    name: `str` prefix of the synchronous optimizer's ops and shared queues; default
      "epochsync_sync_<k>" for the k-th one built in a graph. Give distinct names if you name them.

  Raises:
    ConfigError: `opt` is not a tf.compat.v1.train.Optimizer (e.g. a Keras optimizer).
  """

  def __init__(self, opt: _v1.train.Optimizer, name: Optional[str] = None):
    if not isinstance(opt, _v1.train.Optimizer):
      raise ConfigError(f"sync_optimizer: opt={opt!r} is not a tf.compat.v1.train.Optimizer; "
                        "pass a tf.compat.v1.train optimizer (canned estimators: use the "
                        "tf.compat.v1.estimator ones, which take them)")
    super().__init__(use_locking=False, name=name or f"EpochSync{opt.get_name()}")
    self._opt, self._sync_name = opt, name

  def apply_gradients(self, grads_and_vars, global_step=None, name=None):
    """Synchronous in train_and_evaluate's training graph with sync on, else `opt`'s own.

    Raises:
      ConfigError: two synchronous optimizers of one graph have the same name.
    """
    build = _BUILDS.get(_v1.get_default_graph())
    if build is None:
      global _warned_outside
      if not _warned_outside:
        _warned_outside = True
        logging.warning("sync_optimizer: apply_gradients outside estimator_ext.train_and_"
                        "evaluate's training graph; %s applies gradients as it is (not "
                        "synchronously)", self._opt.get_name())
      return self._opt.apply_gradients(grads_and_vars, global_step, name)
    if not build.sync:
      return self._opt.apply_gradients(grads_and_vars, global_step, name)
    sync_name = self._sync_name or f"epochsync_sync_{len(build.optimizers)}"
    if sync_name in [o.get_name() for o in build.optimizers]:
      raise ConfigError(f"two synchronous optimizers are named {sync_name!r}; they would share "
                        "their queues: give each sync_optimizer(opt, name=...) its own name")
    sync = WorkerDoneSyncReplicasOptimizer(
        self._opt, build.num_workers, build.worker_id, build.divide_by_initial_workers,
        build.worker_names, name=sync_name, own_step_counter=True)
    build.optimizers.append(sync)
    return sync.apply_gradients(grads_and_vars, global_step, name)


def sync_optimizer(opt: _v1.train.Optimizer, name: Optional[str] = None) -> EpochSyncOptimizer:
  """`opt`, trained synchronously under estimator_ext.train_and_evaluate when sync is on.

  The one line a model_fn (or a canned estimator's `optimizer=` argument) changes:

      optimizer = estimator_ext.sync_optimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1))

  Args:
    opt: a `tf.compat.v1.train.Optimizer`.
    name: optional prefix of its synchronous ops (see EpochSyncOptimizer).

  Raises:
    ConfigError: `opt` is not a tf.compat.v1.train.Optimizer.
  """
  return EpochSyncOptimizer(opt, name)
