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
import sys
import weakref
from typing import Callable, List, Optional, Sequence, Union

import tensorflow as tf

from hooks import log as logging
from hooks.errors import ConfigError
from hooks.sync.optimizer import DelegatingOptimizer, WorkerDoneSyncReplicasOptimizer

__all__ = ["CANNED_OPTIMIZERS", "EpochSyncOptimizer", "sync_optimizer", "mark_training_graph",
           "sync_optimizers"]

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


# The names canned estimators accept (tensorflow_estimator's canned/optimizers.py), by class.
CANNED_OPTIMIZERS = {"Adagrad": _v1.train.AdagradOptimizer, "Adam": _v1.train.AdamOptimizer,
                     "Ftrl": _v1.train.FtrlOptimizer, "RMSProp": _v1.train.RMSPropOptimizer,
                     "SGD": _v1.train.GradientDescentOptimizer}


def _canned_learning_rate() -> Optional[float]:
  """The learning_rate of the canned estimator's get_optimizer_instance() calling us, if any.

  Canned estimators call an optimizer argument that is callable inside their model_fn, from
  `optimizers.get_optimizer_instance(opt, learning_rate=<their default>)`: that call's
  `learning_rate` is the one they would give a name (0.05 for a DNN, 0.001 and
  min(0.005, 1/sqrt(#columns)) for wide & deep, ...).
  """
  try:
    # pylint: disable=g-import-not-at-top
    from tensorflow_estimator.python.estimator.canned import optimizers
  except ImportError:
    return None
  code = optimizers.get_optimizer_instance.__code__
  frame = sys._getframe(1)  # pylint: disable=protected-access
  for _ in range(4):  # EpochSyncOptimizer.__call__ <- get_optimizer_instance
    frame = frame.f_back
    if frame is None:
      return None
    if frame.f_code is code:
      return frame.f_locals.get("learning_rate")
  return None


class EpochSyncOptimizer(DelegatingOptimizer):
  """An optimizer that trains synchronously under `estimator_ext.train_and_evaluate`.

  Prefer `sync_optimizer(opt)`. It computes gradients with `opt`; `apply_gradients` builds a
  `WorkerDoneSyncReplicasOptimizer` around `opt` in a training graph with sync on (one per
  graph, so the same object serves every graph the Estimator builds), else applies with `opt`.
  `opt` takes the forms a canned estimator's optimizer argument takes: an instance, a name
  (resolved as the canned estimator resolves it: its class and the estimator's default learning
  rate), or a callable returning an instance (called in each graph's model_fn, so a learning
  rate decayed on global_step works).

      optimizer = EpochSyncOptimizer(tf.compat.v1.train.FtrlOptimizer(0.1))
      optimizer = EpochSyncOptimizer("Adagrad")   # a canned estimator's default learning rate
      est = tf.compat.v1.estimator.LinearRegressor(columns, optimizer=optimizer, config=config)

  Args:
    opt: a `tf.compat.v1.train.Optimizer`; or one of the names "Adagrad", "Adam", "Ftrl",
      "RMSProp", "SGD"; or a callable returning a `tf.compat.v1.train.Optimizer`.
    name: `str` prefix of the synchronous optimizer's ops and shared queues; default
      "epochsync_sync_<k>" for the k-th one built in a graph. Give distinct names if you name them.
    learning_rate: `float` for a name used outside a canned estimator (in your own model_fn);
      default: the canned estimator's.

  Raises:
    ConfigError: `opt` is none of the three forms (e.g. a Keras optimizer, an unknown name).
  """

  def __init__(self, opt: Union[_v1.train.Optimizer, str, Callable[[], _v1.train.Optimizer]],
               name: Optional[str] = None, learning_rate: Optional[float] = None):
    if isinstance(opt, str) and opt not in CANNED_OPTIMIZERS:
      raise ConfigError(f"sync_optimizer: unknown optimizer name {opt!r}; the canned estimators' "
                        f"names are {', '.join(sorted(CANNED_OPTIMIZERS))}")
    if not isinstance(opt, (_v1.train.Optimizer, str)) and not callable(opt):
      raise ConfigError(f"sync_optimizer: opt={opt!r} is not a tf.compat.v1.train.Optimizer; "
                        "pass a tf.compat.v1.train optimizer, a canned name or a callable "
                        "returning one (canned estimators: use the tf.compat.v1.estimator ones, "
                        "which take them)")
    label = (opt.get_name() if isinstance(opt, _v1.train.Optimizer) else
             opt if isinstance(opt, str) else "Optimizer")
    super().__init__(use_locking=False, name=name or f"EpochSync{label}")
    self._given, self._sync_name, self._learning_rate = opt, name, learning_rate
    self._by_graph: "weakref.WeakKeyDictionary[tf.Graph, _v1.train.Optimizer]" = (
        weakref.WeakKeyDictionary())

  def __call__(self) -> "EpochSyncOptimizer":
    """What a canned estimator's model_fn calls: resolves a name or callable in its graph."""
    self._resolve(_canned_learning_rate())
    return self

  @property
  def _opt(self) -> _v1.train.Optimizer:
    """The optimizer of the default graph: the instance, or the name or callable resolved there."""
    return self._resolve(None)

  def _resolve(self, canned_learning_rate: Optional[float]) -> _v1.train.Optimizer:
    if isinstance(self._given, _v1.train.Optimizer):
      return self._given
    graph = _v1.get_default_graph()
    if graph in self._by_graph:
      return self._by_graph[graph]
    if isinstance(self._given, str):
      rate = self._learning_rate if self._learning_rate is not None else canned_learning_rate
      if rate is None:
        raise ConfigError(
            f"sync_optimizer({self._given!r}) has no learning rate outside a canned estimator: "
            f"pass sync_optimizer({self._given!r}, learning_rate=...) or an optimizer instance")
      opt = CANNED_OPTIMIZERS[self._given](learning_rate=rate)
    else:
      opt = self._given()
      if not isinstance(opt, _v1.train.Optimizer):
        raise ConfigError(f"sync_optimizer: the callable {self._given!r} returned {opt!r}, not a "
                          "tf.compat.v1.train.Optimizer; return one")
    self._by_graph[graph] = opt
    return opt

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


def sync_optimizer(opt: Union[_v1.train.Optimizer, str, Callable[[], _v1.train.Optimizer]],
                   name: Optional[str] = None,
                   learning_rate: Optional[float] = None) -> EpochSyncOptimizer:
  """`opt`, trained synchronously under estimator_ext.train_and_evaluate when sync is on.

  The one line a model_fn (or a canned estimator's `optimizer=` argument) changes; `opt` in any
  form a canned estimator takes:

      optimizer = estimator_ext.sync_optimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1))
      linear_optimizer = estimator_ext.sync_optimizer("Ftrl")   # the canned default rate
      dnn_optimizer = estimator_ext.sync_optimizer(lambda: tf.compat.v1.train.AdagradOptimizer(
          tf.compat.v1.train.exponential_decay(0.05, tf.compat.v1.train.get_global_step(),
                                               1000, 0.9)))

  Args:
    opt: a `tf.compat.v1.train.Optimizer`, a canned name ("Adagrad", "Adam", "Ftrl",
      "RMSProp", "SGD") or a callable returning an optimizer (called in the model_fn's graph).
    name: optional prefix of its synchronous ops (see EpochSyncOptimizer).
    learning_rate: `float` for a name outside a canned estimator; default: the canned one's.

  Raises:
    ConfigError: `opt` is none of these.
  """
  return EpochSyncOptimizer(opt, name, learning_rate)
