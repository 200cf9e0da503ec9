"""Synchronous SGD that aggregates each step over the workers still active in the epoch.

Per step, with all queues on global_step's ps task (one marker queue, one token queue per worker):

    worker i   marker (i, GRAD, local_step) | apply_grad(grads, local_step) -> token_q[i].dequeue
    worker i   at the end of its shard (DONE_OPS):  marker (i, DONE, local_step)
    chief      markers = dequeue_many(n); g = #GRAD; if g > 0: assert every marker's step ==
               global_step, take_grad(g) of each variable, apply it as soon as it is taken,
               global_step += 1, one token to each GRAD sender (hooks.sync.aggregation_graph); the next
               n is g, or num_workers when g == 0 (the epoch is over): a ps variable

Why dequeue_many(n) takes exactly one step's markers: each of the n active workers sends one
marker per step; a worker sends its step s+1 marker only after its step-s token, which is
enqueued only after all n step-s markers were dequeued; a DONE worker sends nothing more in the
epoch, and the epoch barrier releases epoch e+1 only after every DONE of epoch e was enqueued
(FIFO: they are dequeued first). A GRAD marker is sent at the start of the worker's step, in
the same run as its gradients, so the chief knows g before the gradients arrive and takes each
variable's g gradients the moment they are in (as stock's take_grad(N) does): the update
overlaps the workers' backward passes. A gradient whose local_step != global_step (silently
dropped by the accumulator) fails the assert, naming the markers, instead of hanging. A worker
that dies between its marker and its gradient leaves take_grad waiting: the workers' step
timeout (or liveness probe) names it, and the chief's failing session does not wait for that
run (its thread is a daemon the coordinator does not join).

With own_step_counter=True the steps are numbered by the optimizer's own `<name>/sync_step`
variable instead of global_step, so several optimizers can share one step (each aggregates the same
workers' gradients of that step) and global_step is left to whoever increments it (e.g. a canned
Estimator head, which adds 1 per worker step after `minimize(loss)` without global_step).

Typical usage:
  opt = WorkerDoneSyncReplicasOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1),
                                        num_workers=config.num_workers, worker_id=config.worker_id)
  train_op = opt.minimize(loss, global_step=tf.compat.v1.train.get_or_create_global_step())
  hooks = [opt.make_session_run_hook(config.is_chief, num_tokens=0)]  # + the epoch hooks
"""

import dataclasses
from typing import Any, List, Optional, Sequence, Tuple

import tensorflow as tf

from hooks import graph_keys
from hooks.errors import ConfigError
from hooks.sync.arguments import resolve_optimizer_arguments
from hooks.sync import elastic_steps, gradient_queues, step_graph
from hooks.sync.aggregation_graph import DONE, GRAD, STOP, aggregate_op, reset_op
from hooks.sync.elastic_aggregation import elastic_aggregate_op
from hooks.sync.tokens import SafeSyncTokensHook
from hooks.workqueue import elastic_graph

__all__ = ["WorkerDoneSyncReplicasOptimizer", "DelegatingOptimizer", "SyncOps", "GRAD", "DONE",
           "STOP", "ABORT_TOKEN"]

_v1 = tf.compat.v1
ABORT_TOKEN = step_graph.ABORT_TOKEN


@dataclasses.dataclass(frozen=True)
class SyncOps:
  """The graph pieces apply_gradients() built; SafeSyncTokensHook and tests use them."""
  train_op: tf.Tensor              # Every worker, once per step: returns the new local_step.
  done_op: tf.Operation            # Every worker, once per epoch after its last step (DONE_OPS).
  refresh_local_step_op: tf.Operation  # Every worker, at every epoch start (EPOCH_START_OPS).
  local_step_init_op: tf.Operation  # Every worker's SafeSyncTokensHook, at session creation.
  chief_init_op: tf.Operation      # The chief, before aggregating (sets its local step too).
  aggregate_op: tf.Tensor          # The chief, in a loop: #GRAD (0: epoch over, < 0: stopped).
  stop_op: tf.Operation            # The chief: num_workers STOP markers end the loop cleanly.
  close_markers_op: tf.Operation   # The chief: fails a blocked aggregation (error paths).
  diagnostics: Tuple[tf.Tensor, tf.Tensor]  # (step, progress vector) for the watchdog.
  completed_epochs: tf.Variable    # Epochs whose every DONE marker the chief has consumed.
  step: tf.Variable                # Numbers the synchronous steps: global_step or own sync_step.
  abort_step_op: Optional[tf.Operation] = None  # This task: an ABORT_TOKEN ends its blocked step.
  count_epoch_op: Optional[tf.Tensor] = None  # The chief, after aggregate_op returned 0: the
  # epochs completed, counted and read in one run (num_active reset to num_workers before).
  # The chief's loop runs aggregate_op as these two: a run on the ps only (no partition on the
  # chief's task, which TensorFlow could reject alone after the ps part ran), then a read.
  aggregate_and_store_op: Optional[tf.Operation] = None  # aggregate_op, kept on the ps.
  last_aggregate: Optional[tf.Tensor] = None  # What the last aggregate_and_store_op returned.
  aggregations_begun: Optional[tf.Variable] = None  # Aggregation runs started on every ps.
  # (Elastic: an elastic work queue in the graph; hooks.sync.elastic_steps.)
  idle_op: Optional[tf.Tensor] = None  # A worker whose claim waits: a step without a batch.
  lost_marker: Any = None  # The chief: (worker id feed, the op sending that lost one's marker).
  guest: Any = None  # A relaunched worker's join of the running epoch (elastic_steps.GuestOps).


class DelegatingOptimizer(_v1.train.Optimizer):
  """An Optimizer wrapping `self._opt`: gradients, slots and variables are the wrapped one's.

  Subclasses set `self._opt` and change apply_gradients() (as SyncReplicasOptimizer does).
  """

  def compute_gradients(self, *args, **kwargs) -> List[Tuple[Any, tf.Variable]]:
    """The wrapped optimizer's compute_gradients()."""
    return self._opt.compute_gradients(*args, **kwargs)

  def get_slot(self, *args, **kwargs):
    return self._opt.get_slot(*args, **kwargs)

  def get_slot_names(self, *args, **kwargs):
    return self._opt.get_slot_names(*args, **kwargs)

  def variables(self):
    return self._opt.variables()


class WorkerDoneSyncReplicasOptimizer(DelegatingOptimizer):
  """A SyncReplicasOptimizer that never hangs on uneven shards: done workers leave the step.

  Use it like tf.compat.v1.train.SyncReplicasOptimizer with between-graph replication, plus hooks
  that run graph_keys.EPOCH_START_OPS at each epoch start and DONE_OPS when a shard is exhausted.
  Stock's constructor arguments work too (renaming the class is the whole change); the worker id
  and names then come from TF_CONFIG or the cluster flags (`hooks.config.flags.cluster_from_flags`).

    opt = WorkerDoneSyncReplicasOptimizer(sgd, num_workers=3, worker_id=config.worker_id)
    opt = WorkerDoneSyncReplicasOptimizer(sgd, replicas_to_aggregate=3, total_num_replicas=3)
    train_op = opt.minimize(loss, global_step=global_step)
    hook = opt.make_session_run_hook(config.is_chief, num_tokens=0, step_timeout_secs=600)

  Dense gradients use ConditionalAccumulator, IndexedSlices use SparseConditionalAccumulator
  (SUM, then divided here: a row absent from a worker's gradient counts as zero, unlike stock's
  per-row MEAN). Shared state lives on the ps tasks under `shared_name`s starting with `name`.

  Args:
    opt: `tf.compat.v1.train.Optimizer` that applies the aggregated gradients.
    num_workers: `int` training tasks (chief + workers), >= 1; default: total_num_replicas, else
      the cluster's (TF_CONFIG or flags).
    worker_id: `int` this task's index in [0, num_workers) (ClusterConfig.worker_id); default:
      the cluster's (TF_CONFIG or flags).
    divide_by_initial_workers: `bool` divide the summed gradients by num_workers instead of by
      the number of workers that contributed to the step.
    worker_names: `Sequence[str]` task names for messages (default: the cluster's when worker_id
      comes from it, else "worker:0"...).
    name: `str` prefix of the ops and of the shared queue / accumulator names; give every
      optimizer of one model its own.
    own_step_counter: `bool` number the steps with an own `<name>/sync_step` variable (on
      global_step's ps task) instead of global_step: apply_gradients() then accepts
      global_step=None and leaves global_step alone; a global_step it is given is incremented once
      per synchronous step. For several optimizers in one train_op, or a model that increments
      global_step itself.
    replicas_to_aggregate: `int` stock's argument; must equal total_num_replicas (no backup
      workers: every active worker's gradient is in every step).
    total_num_replicas: `int` stock's argument, the same as num_workers.
    variable_averages, variables_to_average: stock's; not supported (must be None).
    use_locking: `bool` stock's; passed to tf.compat.v1.train.Optimizer.

  Raises:
    ConfigError: a bad argument (message names it, its value and the rule), or worker_id missing
      and no cluster in TF_CONFIG or the flags.
  """

  def __init__(self, opt: _v1.train.Optimizer, num_workers: Optional[int] = None,
               worker_id: Optional[int] = None, divide_by_initial_workers: bool = False,
               worker_names: Optional[Sequence[str]] = None,
               name: str = "worker_done_sync_replicas", own_step_counter: bool = False, *,
               replicas_to_aggregate: Optional[int] = None,
               total_num_replicas: Optional[int] = None, variable_averages: Any = None,
               variables_to_average: Any = None, use_locking: bool = False):
    num_workers, worker_id, names = resolve_optimizer_arguments(
        opt, num_workers, worker_id, worker_names, replicas_to_aggregate, total_num_replicas,
        variable_averages)
    del variables_to_average  # Only meaningful with variable_averages, which is refused.
    super().__init__(use_locking=bool(use_locking), name=name)
    self._opt, self._num_workers, self._worker_id = opt, num_workers, worker_id
    self._divide_by_initial = bool(divide_by_initial_workers)
    self._own_step_counter = bool(own_step_counter)
    self.worker_names = names
    self.sync_ops: Optional[SyncOps] = None

  num_workers = property(lambda self: self._num_workers)
  worker_id = property(lambda self: self._worker_id)

  def make_session_run_hook(self, is_chief: bool, num_tokens: int = 0,
                            **kwargs) -> SafeSyncTokensHook:
    """A SafeSyncTokensHook (kwargs: step_timeout_secs, warn_after_secs, log_every_secs)."""
    return SafeSyncTokensHook(self, is_chief, num_tokens=num_tokens, **kwargs)

  def apply_gradients(self, grads_and_vars, global_step=None, name=None) -> tf.Tensor:
    """Builds the worker step, the DONE marker and the chief's aggregation; returns train_op.

    Raises:
      ConfigError: no gradients, no global_step (without own_step_counter), or called twice.
    """
    grads_and_vars = [(g, v) for g, v in grads_and_vars]
    if not any(g is not None for g, _ in grads_and_vars):
      raise ConfigError("apply_gradients got no gradients: pass the output of compute_gradients()")
    if global_step is None and not self._own_step_counter:
      raise ConfigError("global_step=None: pass tf.compat.v1.train.get_or_create_global_step(), "
                        "it checks staleness and numbers the tokens (or construct the optimizer "
                        "with own_step_counter=True if something else increments global_step)")
    if self.sync_ops is not None:
      raise ConfigError("apply_gradients() was already called: build one train_op per optimizer")
    # `step` numbers the synchronous steps: staleness, tokens, local steps all refer to it.
    step = self._own_step(global_step) if self._own_step_counter else global_step
    extra_step = global_step if step is not global_step else None  # Also += 1 per step.
    n_workers, wid = self._num_workers, self._worker_id
    local_step = step_graph.local_step(self._name, step.dtype.base_dtype)
    state = step_graph.ps_state(self._name, n_workers, step)
    queue = elastic_graph.registered()  # An elastic work queue: a lost worker is no stop.
    elastic = (None if queue is None else
               elastic_steps.ElasticSteps(queue, state, step, n_workers))
    with tf.name_scope(self._name):
      if elastic is None:
        applies, accums = step_graph.accumulate(grads_and_vars, self._name,
                                                self._divide_by_initial, local_step)
      else:
        applies, queues = gradient_queues.build(grads_and_vars, self._name, local_step, wid)
        accums = []
      worker = step_graph.worker_ops(state, wid, step, local_step, applies, name, elastic)
      train_op, done_op, refresh, hook_started = (worker.train_op, worker.done_op,
                                                  worker.refresh, worker.hook_started)
      with tf.device(step.device):  # In no collection: only the chief_init_op sets it.
        begun = _v1.Variable(0, dtype=tf.int64, trainable=False, collections=[],
                             name="aggregations_begun")
      if elastic is None:
        aggregate = aggregate_op(self._opt, n_workers, self._divide_by_initial,
                                 state.num_active, state.markers, state.tokens, accums, step,
                                 extra_step, begun)
      else:
        aggregate = elastic_aggregate_op(self._opt, elastic, n_workers, self._divide_by_initial,
                                         state, queues, step, extra_step, begun)
      with tf.device(step.device):  # In no collection: only the chief_init_op sets it.
        last = _v1.Variable(0, dtype=aggregate.dtype, trainable=False, collections=[],
                            name="last_aggregate")
        store = last.assign(aggregate).op
        last_read = tf.identity(last)
      chief_init = tf.group([worker.local_step_init, state.num_active.initializer,
                             last.initializer, begun.initializer] +
                            [a.set_global_step(step) for a, _ in accums] +
                            ([elastic.init] if elastic else []))
      stop, close, count_epoch, diagnostics, abort_step = step_graph.control_ops(state, wid, step)
      reset = reset_op(state.markers, state.tokens, accums, state.progress,
                       step_graph.PROGRESS_ACTIVE)
      lost_marker = None
      if elastic is not None:  # Each epoch's start owes every worker's marker (lost: sent).
        with tf.control_dependencies([elastic.epoch_start(step, count_epoch)]):
          count_epoch = tf.identity(count_epoch, name="count_epoch_elastic")
        reset = tf.group(reset, *gradient_queues.drain(queues))
        lost_worker = _v1.placeholder(tf.int64, [], "lost_worker")
        lost_marker = (lost_worker, elastic.lost_marker(lost_worker))
    completed_epochs = state.completed_epochs
    _v1.add_to_collection(graph_keys.DONE_OPS, done_op)
    _v1.add_to_collection(graph_keys.RESET_OPS, reset)
    for var in [state.progress, completed_epochs] + ([step] if step is not global_step else []):
      _v1.add_to_collection(graph_keys.STATE_VARIABLES, var)
    _v1.add_to_collection(graph_keys.EPOCH_START_OPS, refresh)
    _v1.add_to_collection(graph_keys.SYNC_TRAIN_OPS, train_op)
    self.sync_ops = SyncOps(train_op, done_op, refresh, hook_started, chief_init, aggregate,
                            stop, close, diagnostics, completed_epochs, step, abort_step,
                            count_epoch, store, last_read, begun, worker.idle_op, lost_marker,
                            elastic.guest if elastic else None)
    return train_op

  def _own_step(self, global_step):
    """`<name>/sync_step` beside global_step (given or the graph's), else where the scope says."""
    anchor = global_step if global_step is not None else _v1.train.get_global_step()
    # An absolute scope: `<name>/sync_step` wherever minimize() is called (e.g. in a head's scope).
    with _v1.name_scope(self._name + "/"), tf.device(anchor.device if anchor is not None else ""):
      return _v1.Variable(0, trainable=False, dtype=tf.int64, name="sync_step")
