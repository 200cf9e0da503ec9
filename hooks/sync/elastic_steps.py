"""Synchronous steps that survive a lost worker (elastic): the graph pieces of the sync optimizer.

A ConditionalAccumulator cannot drop one worker's gradient once it is in, and a worker that dies
while sending its gradients (one apply per variable) would leave part of it in some. So with
an elastic work queue (hooks.workqueue.elastic_graph) the optimizer builds, instead:
  - **gradient queues**: per variable, one FIFOQueue of (worker id, local step, gradient); the
    chief's aggregation takes what is in it and sums the gradients of the step's GRAD senders
    only (a lost worker's part, or a fenced one's late gradient, is dropped);
  - **the marker in the queue's lock**: a worker's GRAD marker goes out after all its gradients,
    in one run of the work queue's critical section that refuses a fenced worker and counts the
    batch as the worker's (`gated`): a marker means all of its gradient is in, and the batch is
    in the model exactly when its marker passed. The chief's reclaim puts a lost worker's unit
    back after those batches, in the same lock: nothing is trained twice or lost;
  - **owed markers**: per worker, the step of the marker the aggregation waits for from it (-1:
    none). Each marker clears it; the aggregation sets it for every worker it hands a token;
    an epoch's start sets it for all. The chief sends a lost worker's owed marker as DONE (its
    `lost_marker`), or the aggregation does for a fenced sender, or the epoch's start for a
    fenced worker: exactly one of the three, all inside the lock, so the step never waits for a
    lost worker and never counts one twice;
  - **IDLE markers**: a worker whose claim answers WAIT (a unit in flight may come back) sends
    an IDLE marker instead of a gradient and stays in the steps; a round of IDLE markers alone
    applies nothing and hands out tokens of the same step.

Typical usage (WorkerDoneSyncReplicasOptimizer.apply_gradients, with an elastic queue):
  steps = ElasticSteps(hooks.workqueue.elastic_graph.registered(), state, step, n_workers)
  applies, queues = steps.gradient_queues(grads_and_vars, name, local_step, wid)
  marker = steps.marker(wid, GRAD, local_step, after=applies)
  taken = steps.mean_gradients(queues, grads_of_worker, step_now, g_on, divisor)
"""

import functools
from typing import Any, List, Sequence, Tuple

import tensorflow as tf

from hooks import graph_keys
from hooks.errors import FENCED_MARK, ConfigError
from hooks.sync.aggregation_graph import DONE, GRAD
from hooks.workqueue import elastic_graph
from hooks.workqueue.state_ops import execute_unrecorded

__all__ = ["ElasticSteps", "IDLE", "IDLE_ROUND"]

_v1 = tf.compat.v1
IDLE = 2  # A marker kind: the sender has no batch now (its claim answered WAIT); no gradient.
IDLE_ROUND = -3  # What an aggregation of IDLE markers alone returns: nothing was applied (no
# sum of marker kinds is -3: a STOP marker makes it below -2**20 + the workers).


class ElasticSteps:
  """The elastic pieces of one sync optimizer over the graph's elastic work queue.

  Args:
    queue: the work queue's QueueOps (built elastic, registered for a synchronous job).
    state: the optimizer's PsState (its marker queue and completed epochs, on `step`'s task).
    step: the variable that numbers the synchronous steps.
    num_workers: the job's workers.
  """

  def __init__(self, queue: Any, state: Any, step: tf.Variable, num_workers: int):
    self._queue, self._markers, self._n = queue, state.markers, num_workers
    with tf.device(step.device):  # Not saved: the chief's init sets it (`init`).
      self.owed = _v1.Variable(tf.fill([num_workers], tf.constant(-1, tf.int64)),
                               trainable=False, collections=[], use_resource=True,
                               name="owed_markers")
    # The queue's `accepted` (each worker's batches in the model, a mid-epoch checkpoint's
    # positions) counts from the running epoch's start; a resumed run's workers count from 0.
    self._ids = tf.reshape(tf.range(num_workers, dtype=tf.int64), [num_workers, 1])
    epoch = state.completed_epochs.read_value() * graph_keys.EPOCH_SHIFT
    self.init = tf.group(
        self.owed.assign(tf.fill([num_workers], tf.cast(step, tf.int64))),
        queue.accepted.scatter_nd_update(self._ids, tf.fill([num_workers], epoch)))

  def gradient_queues(self, grads_and_vars, name: str, local: tf.Variable, wid: int
                      ) -> Tuple[List[Any], List[Tuple[Any, tf.Variable]]]:
    """(the enqueue of each gradient, [(gradient queue, variable)]); dense gradients only."""
    enqueues, queues = [], []
    for grad, var in grads_and_vars:
      if grad is None:
        continue
      if isinstance(grad, tf.IndexedSlices):
        raise ConfigError(
            f"elastic synchronous training takes dense gradients only, and {var.name}'s is "
            "sparse (an embedding's IndexedSlices): train this model asynchronously "
            "(--epochsync_sync=false) to keep --epochsync_elastic, or turn elastic off")
      with tf.device(var.device):
        queue = tf.queue.FIFOQueue(-1, [tf.int32, tf.int64, grad.dtype],
                                   shapes=[(), (), var.shape],
                                   shared_name=f"{var.name}/{name}/grad_queue",
                                   name="grad_queue")
        enqueues.append(queue.enqueue((tf.constant(wid), tf.cast(local, tf.int64), grad)))
      queues.append((queue, var))
    return enqueues, queues

  def marker(self, wid: int, kind: int, local: tf.Variable, after: Sequence[Any] = ()
             ) -> tf.Operation:
    """Worker `wid`'s marker of `kind` (GRAD counts its batch as trained), after `after`, in
    the queue's lock; the run fails with errors.FENCED_MARK if the chief fenced the worker."""
    with tf.device(self.owed.device), tf.control_dependencies(list(after)):
      sent = tf.cast(local, tf.int64)
      passed = execute_unrecorded(self._queue.lock, functools.partial(
          self._send_marker, wid, kind, sent, kind == GRAD))
      return tf.group(tf.debugging.Assert(passed, [tf.constant(
          f"{FENCED_MARK}: worker id {wid}, found lost by the chief")], name="fence"))

  def _send_marker(self, wid: int, kind: int, sent: tf.Tensor, count: bool) -> tf.Tensor:
    passed = elastic_graph.admit(self._queue, wid, count=count)
    n = tf.cast(passed, tf.int32)
    enqueued = self._markers.enqueue_many((tf.fill([n], wid), tf.fill([n], kind),
                                           tf.fill([n], sent)))
    cleared = self.owed.scatter_nd_update([[wid]], tf.reshape(
        tf.where(passed, tf.constant(-1, tf.int64), self.owed[wid]), [1]))
    with tf.control_dependencies([enqueued, cleared]):
      return tf.identity(passed)

  def after_tokens(self, receivers: tf.Tensor, token: tf.Tensor, applied: tf.Tensor
                   ) -> tf.Tensor:
    """(The aggregation, before its tokens go out) Each token receiver (`receivers`: 0/1 per
    worker) owes its next marker at `token`; a fenced one's is sent for it, as DONE. Each
    worker's `applied` batches (its gradient in the step applied) count as accepted."""

    def account() -> tf.Tensor:
      counted = self._queue.accepted.scatter_nd_add(self._ids, tf.cast(applied, tf.int64))
      with tf.control_dependencies([counted]):
        return self._owe(receivers > 0, token)

    return execute_unrecorded(self._queue.lock, account)

  def _owe(self, owing: tf.Tensor, step: tf.Tensor) -> tf.Tensor:
    """(Inside the lock) `owing` workers owe a marker at `step`; the fenced ones get theirs."""
    fenced = elastic_graph.fenced(self._queue, self._n)
    lost = tf.logical_and(owing, fenced)
    ids = tf.cast(tf.where(lost)[:, 0], tf.int32)
    count = tf.size(ids)
    enqueued = self._markers.enqueue_many((ids, tf.fill([count], DONE), tf.fill([count], step)))
    owed = tf.where(owing, tf.where(fenced, tf.fill([self._n], tf.constant(-1, tf.int64)),
                                    tf.fill([self._n], step)), self.owed.read_value())
    with tf.control_dependencies([enqueued, self.owed.assign(owed)]):
      return tf.identity(count)

  def epoch_start(self, step: tf.Tensor, epoch: tf.Tensor) -> tf.Tensor:
    """(The chief, as it counts an epoch) Every worker owes the next epoch's (`epoch`) first
    marker, at `step`; a fenced one's is sent for it, and `epoch` closes to its join (a
    relaunched process joins a later one: hooks.elastic.rejoin)."""

    def start() -> tf.Tensor:
      closed = elastic_graph.close_fenced(self._queue, epoch, self._n)
      counted = self._queue.accepted.scatter_nd_update(
          self._ids, tf.fill([self._n], epoch * graph_keys.EPOCH_SHIFT))
      with tf.control_dependencies([closed, counted]):
        return self._owe(tf.ones([self._n], tf.bool), tf.cast(step, tf.int64))

    return execute_unrecorded(self._queue.lock, start)

  def lost_marker(self, worker: tf.Tensor) -> tf.Tensor:
    """(The chief, after it fenced `worker`) Sends the marker it owes, as DONE; 1 if it did."""
    def send() -> tf.Tensor:
      owed = self.owed[worker]
      due = tf.logical_and(elastic_graph.fenced(self._queue, self._n)[worker], owed >= 0)
      n = tf.cast(due, tf.int32)
      enqueued = self._markers.enqueue_many((tf.fill([n], tf.cast(worker, tf.int32)),
                                             tf.fill([n], DONE), tf.fill([n], owed)))
      cleared = self.owed.scatter_nd_update([[worker]], tf.reshape(
          tf.where(due, tf.constant(-1, tf.int64), owed), [1]))
      with tf.control_dependencies([enqueued, cleared]):
        return tf.identity(n)

    with tf.device(self.owed.device):
      return execute_unrecorded(self._queue.lock, send)

  @staticmethod
  def mean_gradients(queues: List[Tuple[Any, tf.Variable]], senders: tf.Tensor,
                     step_now: tf.Tensor, g_on: tf.Tensor, divisor: tf.Tensor
                     ) -> List[Tuple[tf.Tensor, tf.Variable]]:
    """[(the mean of the step's gradients, variable)]: of each queue, what it holds from the
    step's GRAD senders (`senders`, per worker) at `step_now`; the rest is dropped. Dead with
    `g_on` (no gradient this step)."""
    taken = []
    for queue, var in queues:
      with tf.device(var.device):
        with tf.control_dependencies([g_on]):
          size = queue.size()
        wids, steps, grads = queue.dequeue_many(size)
        keep = tf.logical_and(tf.gather(senders, wids) > 0, tf.equal(steps, step_now))
        total = tf.reduce_sum(tf.boolean_mask(grads, keep), axis=0)
        taken.append((total / tf.cast(divisor, grads.dtype), var))
    return taken

  @staticmethod
  def drain(queues: List[Tuple[Any, tf.Variable]]) -> List[Any]:
    """The ops that empty the gradient queues (the chief's reset at a run's start)."""
    return [queue.dequeue_many(queue.size()) for queue, _ in queues]
