"""The graph pieces of one WorkerDoneSyncReplicasOptimizer, built by its apply_gradients().

The ps-side state (marker and token queues, progress, the epoch count, the markers to await),
the gradient accumulators, the worker's step and DONE marker, and the chief's control ops.
hooks.sync.aggregation_graph builds the chief's aggregation from these; see
hooks/sync/optimizer.py for the protocol. The order of the calls decides the ops' names.

Typical usage (WorkerDoneSyncReplicasOptimizer.apply_gradients):
  local = local_step(name, step.dtype.base_dtype)
  state = ps_state(name, num_workers, step)
  with tf.name_scope(name):
    applies, accums = accumulate(grads_and_vars, name, divide_by_initial, local)
    worker = worker_ops(state, worker_id, step, local, applies, train_op_name)
"""

import dataclasses
from typing import Any, List, Optional, Sequence, Tuple

import tensorflow as tf

from hooks import graph_keys
from hooks.sync.aggregation_graph import DONE, GRAD, STOP
from hooks.sync.elastic_steps import IDLE

__all__ = ["ABORT_TOKEN", "PROGRESS_ACTIVE", "PROGRESS_DONE", "PsState", "WorkerOps",
           "local_step", "ps_state", "accumulate", "worker_ops", "control_ops"]

_v1 = tf.compat.v1
ABORT_TOKEN = -1  # A token no step has: it ends a step blocked on its token (the job is failing).
PROGRESS_DONE, PROGRESS_ACTIVE = -1, -2  # progress[i]: step of i's last GRAD marker, or these.


@dataclasses.dataclass(frozen=True)
class PsState:
  """One optimizer's queues and variables on global_step's ps task."""
  markers: Any                 # (worker id, kind, local_step) per step and worker
  tokens: Sequence[Any]        # one token queue per worker
  progress: tf.Variable        # per worker: the step of its last GRAD marker, or PROGRESS_*
  completed_epochs: tf.Variable
  num_active: tf.Variable      # how many markers the next aggregation dequeues (not saved)


@dataclasses.dataclass(frozen=True)
class WorkerOps:
  """What every worker runs: its step, its DONE marker, its local step's (re)initialisation."""
  train_op: tf.Tensor
  local_step_init: tf.Tensor
  hook_started: tf.Operation
  done_op: tf.Operation
  refresh: tf.Operation
  idle_op: Optional[tf.Tensor] = None  # (elastic) a step without a batch: an IDLE marker


def local_step(name: str, dtype) -> tf.Variable:
  """The worker's local step, on the worker (never on a ps), set only by SafeSyncTokensHook."""
  local_anchor = tf.no_op(name=f"{name}_local_anchor")
  with _v1.get_default_graph().colocate_with(local_anchor):  # Keeps it off the ps tasks.
    # In no collection: no initializer sets it, only SafeSyncTokensHook (local_step_init_op).
    # Without the hook no task aggregates, so a step fails at once on reading it ("Attempting
    # to use uninitialized value ..._local_step_set_by_SafeSyncTokensHook") instead of waiting
    # for its token forever, and without an op of its own in the step.
    return _v1.Variable(0, trainable=False, dtype=dtype, collections=[],
                        name=f"{name}_local_step_set_by_SafeSyncTokensHook")


def ps_state(name: str, n_workers: int, step: tf.Variable) -> PsState:
  """The queues and variables of optimizer `name` on `step`'s device."""
  dtype = step.dtype.base_dtype
  with _v1.name_scope(name + "/"), tf.device(step.device):  # absolute, also in a head's scope
    markers = tf.queue.FIFOQueue(-1, [tf.int32, tf.int32, tf.int64], shapes=[(), (), ()],
                                 name="marker_q", shared_name=f"{name}/marker_q")
    tokens = [tf.queue.FIFOQueue(-1, dtype, shapes=[()], name=f"token_q_{i}",
                                 shared_name=f"{name}/token_q_{i}")
              for i in range(n_workers)]
    progress = _v1.Variable(tf.fill([n_workers], tf.constant(PROGRESS_ACTIVE, tf.int64)),
                            trainable=False, name="progress")
    completed_epochs = _v1.Variable(0, trainable=False, dtype=tf.int64, name="completed_epochs")
    # How many markers the next aggregation dequeues: a ps variable, not a feed (bench.run_cost);
    # not saved; each step sets its g, chief_init_op and count_epoch_op num_workers.
    num_active = _v1.Variable(n_workers, trainable=False, dtype=tf.int32, collections=[],
                              use_resource=False, name="num_active")  # Read without an op.
  return PsState(markers, tokens, progress, completed_epochs, num_active)


def accumulate(grads_and_vars, name: str, divide_by_initial: bool, local: tf.Variable
               ) -> Tuple[List[Any], List[Tuple[Any, tf.Variable]]]:
  """(the ops that send each gradient, [(accumulator, variable)]), in the caller's scope."""
  applies, accums = [], []
  for grad, var in grads_and_vars:
    if grad is None:
      continue
    # An IndexedSlices goes as computed (repeated, unsorted ids, as stock's): the SUM
    # accumulator's merge keeps every row's sum and apply_gradients sums repeated ids.
    with tf.device(var.device):
      shared = f"{var.name}/{name}/grad_accum"
      if isinstance(grad, tf.IndexedSlices):
        accum = _v1.SparseConditionalAccumulator(grad.dtype, var.shape, shared_name=shared,
                                                 reduction_type="SUM")
        applies.append(accum.apply_indexed_slices_grad(grad, local))
      else:  # MEAN divides in place in take_grad, as stock does; SUM when scaled by 1/N.
        accum = _v1.ConditionalAccumulator(
            grad.dtype, var.shape, shared_name=shared,
            reduction_type="SUM" if divide_by_initial else "MEAN")
        applies.append(accum.apply_grad(grad, local))
    accums.append((accum, var))
  return applies, accums


def worker_ops(state: PsState, wid: int, step: tf.Variable, local: tf.Variable,
               applies: Sequence[Any], name: Optional[str], elastic: Any = None) -> WorkerOps:
  """Worker `wid`'s step (GRAD marker, gradients, then its token), DONE marker and refresh;
  with `elastic` (hooks.sync.elastic_steps.ElasticSteps) its markers go through the work
  queue's lock, the GRAD one after the gradients, and an IDLE step is built too."""
  dev = step.device
  # The GRAD marker does not wait for the gradients: the chief's take_grad(g) waits for each
  # variable's, so it applies every variable as soon as its g gradients are in, as stock does.
  # progress (read by the watchdog's messages only) says the gradients were sent.
  with tf.device(dev):
    worker = tf.constant(wid, name="worker_id")  # The marker's id and progress' index.
    sent_step = tf.cast(local, tf.int64)  # ps:0 receives it once per step.
    if elastic is None:
      grad_marked = state.markers.enqueue((worker, GRAD, sent_step))
    else:  # A marker means every gradient of the step is in (hooks.sync.elastic_steps).
      grad_marked = elastic.marker(wid, GRAD, local, after=applies)
    # After the step's batch is taken (EpochInput's gate): never in a step TensorFlow rejected.
    _v1.add_to_collection(graph_keys.STEP_START_OPS, grad_marked)
    with tf.control_dependencies(applies):
      sent = _v1.scatter_update(state.progress, worker, sent_step)
  with tf.control_dependencies([grad_marked, sent]), tf.device(dev):
    token = state.tokens[wid].dequeue()
  train_op = local.assign(token, name=name or "train_op")
  local_step_init = local.assign(step)
  hook_started = tf.group(local_step_init, name="hook_started")
  with tf.device(dev):
    done_marked = (state.markers.enqueue((wid, DONE, tf.cast(local, tf.int64)))
                   if elastic is None else elastic.marker(wid, DONE, local))
    done_op = tf.group(done_marked, _v1.scatter_update(state.progress, [wid],
                                                       [tf.constant(PROGRESS_DONE, tf.int64)]),
                       name="done")
    active = _v1.scatter_update(state.progress, [wid],
                                [tf.constant(PROGRESS_ACTIVE, tf.int64)])
  if elastic is None:
    refresh = tf.group(local_step_init, active, name="refresh_local_step")
    return WorkerOps(train_op, local_step_init, hook_started, done_op, refresh)
  # A relaunched process's queue may hold its earlier one's last token: drained at its session's
  # start (before any step of it: its first claim may answer WAIT and run an IDLE step) and at
  # each epoch's start. A guest (hooks.sync.elastic_steps) reads the step too: once a round
  # took it in, the step waits for its marker, so the step is the one it owes.
  with tf.device(dev):
    stale = state.tokens[wid].dequeue_many(state.tokens[wid].size())
  with tf.control_dependencies([stale]):
    hook_started = tf.group(local.assign(step), name="hook_started_drained")
  refresh = tf.group(local_step_init, active, stale, name="refresh_local_step")
  # No batch now (its claim waits): it stays in the steps without one.
  with tf.control_dependencies([elastic.marker(wid, IDLE, local)]), tf.device(dev):
    idle_token = state.tokens[wid].dequeue()
  idle_op = local.assign(idle_token, name="idle_step")
  return WorkerOps(train_op, local_step_init, hook_started, done_op, refresh, idle_op)


def control_ops(state: PsState, wid: int, step: tf.Variable) -> Tuple[Any, ...]:
  """(stop, close, count_epoch, diagnostics, abort_step): the chief's and the watchdog's."""
  n_workers, dtype = len(state.tokens), step.dtype.base_dtype
  with tf.device(step.device):
    stop = state.markers.enqueue_many((tf.fill([n_workers], wid), tf.fill([n_workers], STOP),
                                       tf.zeros([n_workers], tf.int64)))
    close = state.markers.close(cancel_pending_enqueues=False)
    with tf.control_dependencies([state.num_active.initializer]):  # One run counts and reads.
      count_epoch = tf.identity(state.completed_epochs.assign_add(1, use_locking=True),
                                name="count_epoch")
    diagnostics = (tf.identity(step), state.progress.read_value())
    abort_step = state.tokens[wid].enqueue(tf.constant(ABORT_TOKEN, dtype))
  return stop, close, count_epoch, diagnostics, abort_step
