"""An asynchronous elastic worker's optimizer: each step's batch counts exactly when it is applied.

Without it, an asynchronous elastic step's batch counts as the worker's at its gate, before the
forward pass (hooks.workqueue.elastic_graph.gate); a worker frozen between that gate and its
apply (SIGSTOP, a long pause) has its batch counted in its epoch while the apply lands when it
wakes, in a later epoch, or never if it dies frozen. With it, the step's gradients first go to
their variables' ps tasks; then the step is admitted on ps:0 (its worker's admission word
counted up: one atomic op, no lock) unless the chief fenced the worker, the gradients applied
and the batch counted, all on the ps tasks. The chief fences a lost worker's word and waits for
the steps admitted before to be done before it reads the worker's count, so the epoch's
checkpoint and audit hold exactly the batches applied, and a woken worker's step applies
nothing. No lock is shared by the workers' steps (the batch gate's is the work queue's, one for
every step of every worker).

Typical usage (in an asynchronous elastic job, after the work queue input):
  epoch_input = hooks.workqueue.work_queue_input(units, unit_fn, ..., settings=settings)
  opt = hooks.ElasticOptimizer(tf.compat.v1.train.AdagradOptimizer(0.05))
  train_op = opt.minimize(loss, global_step=global_step)
"""

from typing import Any, List, Tuple

import tensorflow as tf

from hooks.errors import ConfigError
from hooks.sync.optimizer import DelegatingOptimizer
from hooks.workqueue import elastic_graph

__all__ = ["ElasticOptimizer"]

_v1 = tf.compat.v1


class ElasticOptimizer(DelegatingOptimizer):
  """`opt`, whose apply in an asynchronous elastic job counts its batch only once applied.

  Use it in an asynchronous job with `--epochsync_elastic`, built after the work queue's input
  (`hooks.workqueue.work_queue_input`, with the same settings); anywhere else (not elastic, or
  no work queue in the graph) it is `opt` itself. One per model: the batch is counted by the
  one apply (a model with two optimizers keeps the batch gate).

    opt = hooks.ElasticOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1))
    train_op = opt.minimize(loss, global_step=global_step)

  Args:
    opt: the `tf.compat.v1.train.Optimizer` that applies the gradients.
    name: `str`, for its ops.

  Raises:
    ConfigError: (at apply_gradients) a second ElasticOptimizer in the same graph.
  """

  def __init__(self, opt: _v1.train.Optimizer, name: str = "epochsync_elastic"):
    if not isinstance(opt, _v1.train.Optimizer):
      raise ConfigError(f"opt={opt!r} must be a tf.compat.v1.train.Optimizer")
    super().__init__(use_locking=False, name=name)
    self._opt = opt

  def apply_gradients(self, grads_and_vars, global_step=None, name=None) -> tf.Operation:
    grads_and_vars = list(grads_and_vars)
    queue = elastic_graph.registered_asynchronous()
    if queue is None:  # Not an asynchronous elastic job: the plain apply.
      return self._opt.apply_gradients(grads_and_vars, global_step, name)
    graph = _v1.get_default_graph()
    if elastic_graph.applies_if_admitted(graph):
      raise ConfigError(
          "a second ElasticOptimizer in one graph: the step's batch is counted by one apply; "
          "use one optimizer for the model, or the plain optimizers (the batch gate then "
          "counts the batch as it enters the step)")
    staged = _on_their_ps(grads_and_vars)
    return elastic_graph.apply_if_member(
        queue.ops, queue.worker_id, queue.identity, _tensors(staged),
        lambda: self._opt.apply_gradients(staged, global_step, name))


def _on_their_ps(grads_and_vars) -> List[Tuple[Any, tf.Variable]]:
  """Each gradient copied to its variable's device first: the apply in the lock then waits for
  nothing on the worker (a worker frozen after this still has its step applied)."""
  staged = []
  for grad, var in grads_and_vars:
    if grad is not None:
      with _v1.device(var.device), tf.name_scope("epochsync_staged"):
        if isinstance(grad, tf.IndexedSlices):
          grad = tf.IndexedSlices(tf.identity(grad.values), tf.identity(grad.indices),
                                  grad.dense_shape)
        else:
          grad = tf.identity(grad)
    staged.append((grad, var))
  return staged


def _tensors(staged) -> List[tf.Tensor]:
  out: List[tf.Tensor] = []
  for grad, _ in staged:
    if isinstance(grad, tf.IndexedSlices):
      out += [grad.values, grad.indices]
    elif grad is not None:
      out.append(grad)
  return out

