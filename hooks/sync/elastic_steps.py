"""Synchronous steps that survive a lost worker (elastic): the graph pieces of the sync optimizer.

With an elastic work queue (hooks.workqueue.elastic_graph) the optimizer builds, besides its
gradient queues (hooks.sync.gradient_queues: the chief takes only the step's senders'):
  - **the marker in the queue's lock**: a worker's GRAD marker goes out after all its gradients,
    in one run of the work queue's critical section that refuses a fenced worker and counts the
    batch as the worker's (`gated`): a marker means all of its gradient is in, and the batch is
    in the model exactly when its marker passed. The chief's reclaim puts a lost worker's unit
    back after those batches, in the same lock: nothing is trained twice or lost;
  - **owed markers**: per worker, the step of the marker the aggregation waits for from it (-1:
    none; _IN_ROUND: its marker is in a round not aggregated yet). Each marker clears it; the
    aggregation sets it for every worker it hands a token; an epoch's start sets it for all.
    The chief sends a lost worker's owed marker as DONE (its `lost_marker`), or the
    aggregation does for a fenced sender, or the epoch's start for a fenced worker: exactly one
    of the three, all inside the lock, so the step never waits for a lost worker and never
    counts one twice;
  - **IDLE markers**: a worker whose claim answers WAIT (a unit in flight may come back) sends
    an IDLE marker instead of a gradient and stays in the steps; a round of IDLE markers alone
    applies nothing and hands out tokens of the same step;
  - **a guest's join** (`join`): a relaunched worker joins the running epoch in the lock (the
    marker its earlier process owes is sent first, as DONE; elastic_graph.guest_join); once its
    session is ready for its first step (`ready`), the next aggregation that hands out tokens
    takes it into the steps: it owes the marker of the tokens' step (the steps wait for it only
    from then on), waits for `started` instead of a token, and arrives itself at the epoch's
    barrier (its DONE then precedes the next epoch's markers, as every worker's). A round that
    ends the epoch takes no guest, nor does one after the chief's gather stood in for it
    (`still_lost` cancels the join): it starts with the next epoch instead.

Typical usage (WorkerDoneSyncReplicasOptimizer.apply_gradients, with an elastic queue):
  steps = ElasticSteps(hooks.workqueue.elastic_graph.registered(), state, step, n_workers)
  marker = steps.marker(wid, GRAD, local_step, after=gradient_enqueues)
  joined = steps.after_tokens(receivers, token, applied)   # inside the aggregation: guests
  answer, held = session.run(steps.guest.join, {steps.guest.worker: 1, ...})  # a relaunch
"""

import dataclasses
import functools
from typing import Any, Sequence

import tensorflow as tf

from hooks import graph_keys
from hooks.sync.aggregation_graph import DONE, GRAD
from hooks.workqueue import elastic_graph
from hooks.workqueue.state_ops import execute_unrecorded

__all__ = ["ElasticSteps", "GuestOps", "IDLE", "IDLE_ROUND"]

_v1 = tf.compat.v1
IDLE = 2  # A marker kind: the sender has no batch now (its claim answered WAIT); no gradient.
IDLE_ROUND = -3  # What an aggregation of IDLE markers alone returns: nothing was applied (no
# sum of marker kinds is -3: a STOP marker makes it below -2**20 + the workers).


@dataclasses.dataclass(frozen=True)
class GuestOps:
  """A relaunched worker's (or a spare's) join of the running epoch (hooks.elastic.rejoin):
  `join` (feeds `worker`, `epoch`, `token`, `spares`) answers [elastic_graph's JOINED,
  NOT_FENCED, CLOSED or FULL; the batches of `epoch` its earlier process trained]; `ready`
  (feeds `worker`, `epoch`): its session is ready for its first step, the next aggregation may
  take it in (its join stays pending until then); `started[worker]`: the step of its first
  marker once an aggregation took it into the steps, -1 before (from its join, and from the
  next epoch's start on); the step then waits for its marker, so it reads its first step from
  the step, as every worker.
  `membership`: the queue's MembershipOps with the chief's `still_lost` of a synchronous job
  (it cancels a guest's join no step took in yet, so the chief arrives for it). `spares`: the
  job's spare workers, fed to `join` (FULL: the process stands by; MembershipOps)."""
  worker: tf.Tensor
  epoch: tf.Tensor
  token: tf.Tensor
  join: tf.Tensor
  ready: tf.Tensor
  started: tf.Variable
  membership: Any
  spares: tf.Tensor


_IN_ROUND = -2  # An `owed` value: its GRAD or IDLE marker passed, its round is not over.


def _write_where(vector: tf.Variable, worker: Any, when: tf.Tensor, value: Any) -> tf.Tensor:
  """(Inside the lock) vector[worker] = value where `when`, else unchanged."""
  return vector.scatter_nd_update([[worker]], tf.reshape(tf.where(
      when, tf.cast(value, tf.int64), vector[worker]), [1]))


def _stood_in(epoch: tf.Tensor) -> tf.Tensor:
  """A `joining` value: the chief's gather arrived for the worker at `epoch`'s end."""
  return -2 - epoch


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
    none = tf.fill([num_workers], tf.constant(-1, tf.int64))
    with tf.device(step.device):  # Not saved: the chief's init sets them (`init`).
      vector = functools.partial(_v1.Variable, none, trainable=False, collections=[],
                                 use_resource=True)
      self.owed = vector(name="owed_markers")
      # A guest's epoch until a step takes it in; -1; or _stood_in: too late to join it.
      self._joining = vector(name="joining_guests")
      self._ready = vector(name="ready_guests")  # 1: its first step is ready; else -1
      started = vector(name="guest_first_steps")  # GuestOps.started
      feeds = [_v1.placeholder(tf.int64, [], "guest_" + name)
               for name in ("worker", "epoch", "token")]
      spares = elastic_graph.spares_feed("guest_spares")
    # The queue's `accepted` (each worker's batches in the model, a mid-epoch checkpoint's
    # positions) counts from the running epoch's start; a resumed run's workers count from 0.
    self._ids = tf.reshape(tf.range(num_workers, dtype=tf.int64), [num_workers, 1])
    epoch = state.completed_epochs.read_value() * graph_keys.EPOCH_SHIFT
    self._started = started
    join = execute_unrecorded(queue.lock, functools.partial(self._join, *feeds, spares))
    membership = dataclasses.replace(queue.membership, still_lost=execute_unrecorded(
        queue.lock, functools.partial(self._still_lost, queue.membership.worker,
                                      queue.membership.epoch)))
    ready = execute_unrecorded(queue.lock, functools.partial(self._mark_ready, *feeds[:2]))
    self.guest = GuestOps(*feeds, join, ready, started, membership, spares)
    self.init = tf.group(
        self.owed.assign(tf.fill([num_workers], tf.cast(step, tf.int64))),
        queue.accepted.scatter_nd_update(self._ids, tf.fill([num_workers], epoch)),
        *self._clear_guests())

  def marker(self, wid: int, kind: int, local: tf.Variable, after: Sequence[Any] = ()
             ) -> tf.Operation:
    """Worker `wid`'s marker of `kind` (GRAD counts its batch as trained), after `after`, in
    the queue's lock; the run fails with errors.FENCED_MARK if the chief fenced the worker."""
    with tf.device(self.owed.device), tf.control_dependencies(list(after)):
      sent = tf.cast(local, tf.int64)
      passed = execute_unrecorded(self._queue.lock, functools.partial(
          self._send_marker, wid, kind, sent, kind == GRAD))
      return tf.group(elastic_graph.refuse_fenced(passed, wid))

  def _send_marker(self, wid: int, kind: int, sent: tf.Tensor, count: bool) -> tf.Tensor:
    passed = elastic_graph.admit(self._queue, wid, count=count)
    n = tf.cast(passed, tf.int32)
    enqueued = self._markers.enqueue_many((tf.fill([n], wid), tf.fill([n], kind),
                                           tf.fill([n], sent)))
    # A GRAD or IDLE sender owes nothing until its round's aggregation: _IN_ROUND till then.
    cleared = _write_where(self.owed, wid, passed, -1 if kind == DONE else _IN_ROUND)
    with tf.control_dependencies([enqueued, cleared]):
      return tf.identity(passed)

  def after_tokens(self, receivers: tf.Tensor, token: tf.Tensor, applied: tf.Tensor
                   ) -> tf.Tensor:
    """(The aggregation, before its tokens go out) Each token receiver (`receivers`: 0/1 per
    worker) owes its next marker at `token`; a fenced one's is sent for it, as DONE. Each
    worker's `applied` batches (its gradient in the step applied) count as accepted. Guests
    waiting to join owe theirs too (no token: they read GuestOps.started). Returns how many
    guests joined: the next aggregation awaits their markers too."""

    def account() -> tf.Tensor:
      counted = self._queue.accepted.scatter_nd_add(self._ids, tf.cast(applied, tf.int64))
      with tf.control_dependencies([counted]):
        # Guests join a round that goes on (not one that ends the epoch or stops the job).
        goes_on = tf.reduce_sum(receivers) > 0
        joining, started = self._joining.read_value(), self._started.read_value()
        closed = self._queue.closed[:self._n]
        guests = tf.logical_and(tf.logical_and(joining >= 0, goes_on), tf.logical_and(
            self._ready > 0, tf.logical_not(elastic_graph.fenced(self._queue, self._n))))
        with tf.control_dependencies([joining, started, closed]):  # read, then written
          taken = [self._started.assign(tf.where(guests, tf.fill([self._n], token), started)),
                   # A guest in the steps arrives itself at the epoch's barrier.
                   self._queue.closed[:self._n].assign(tf.where(guests, joining - 1, closed)),
                   self._joining.assign(tf.where(guests, tf.fill([self._n], tf.constant(
                       -1, tf.int64)), joining))]
        with tf.control_dependencies(taken):
          owing = tf.logical_or(receivers > 0, guests)
          with tf.control_dependencies([self._owe(owing, token)]):
            return tf.reduce_sum(tf.cast(guests, tf.int32))

    return execute_unrecorded(self._queue.lock, account)

  def _still_lost(self, worker: tf.Tensor, epoch: tf.Tensor) -> tf.Tensor:
    """(Inside the lock) The chief's check at `epoch`'s gather; a guest no step took in yet is
    stood in for (its join cancelled: it starts with the next epoch)."""
    answer = elastic_graph.still_lost(self._queue, worker, epoch)
    # A guest no step took in yet waits no more; none joins `epoch` after this stand-in.
    pending = tf.logical_or(tf.equal(self._joining[worker], epoch), answer[0] > 0)
    marked = _write_where(self._joining, worker, pending, _stood_in(epoch))
    with tf.control_dependencies([marked]):
      return tf.identity(answer)

  def _join(self, worker: tf.Tensor, epoch: tf.Tensor, token: tf.Tensor,
            spares: tf.Tensor) -> tf.Tensor:
    """(Inside the lock) GuestOps.join: the earlier process's owed marker goes first."""
    was_fenced = elastic_graph.fenced(self._queue, self._n)[worker]
    # Not while its earlier process's last marker waits for its round (that round would hand
    # the worker a token and owe its next marker: the guest would be in the steps twice).
    allowed = tf.logical_and(tf.not_equal(self._joining[worker], _stood_in(epoch)),
                             tf.not_equal(self.owed[worker], _IN_ROUND))
    with tf.control_dependencies([self._send_owed(worker), was_fenced, allowed]):
      answer = elastic_graph.guest_join(self._queue, worker, epoch, token, allowed, spares)
    joined = tf.logical_and(was_fenced, tf.equal(answer[0], elastic_graph.JOINED))
    # An earlier process of this worker a round took into `epoch` left its `started`: this one
    # is not in the steps until a round takes it in.
    with tf.control_dependencies([_write_where(self._joining, worker, joined, epoch),
                                  _write_where(self._ready, worker, joined, -1),
                                  _write_where(self._started, worker, joined, -1)]):
      return tf.identity(answer)

  def _mark_ready(self, worker: tf.Tensor, epoch: tf.Tensor) -> tf.Tensor:
    """(Inside the lock) GuestOps.ready: a guest whose join of `epoch` is pending may be taken
    in; 1 if it was (a stand-in of the chief's gather came first: 0, it starts later)."""
    pending = tf.equal(self._joining[worker], epoch)
    with tf.control_dependencies([_write_where(self._ready, worker, pending, 1)]):
      return tf.cast(pending, tf.int64)

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
      with tf.control_dependencies([closed, counted] + self._clear_guests()):
        return self._owe(tf.ones([self._n], tf.bool), tf.cast(step, tf.int64))

    return execute_unrecorded(self._queue.lock, start)

  def _clear_guests(self):
    none = tf.fill([self._n], tf.constant(-1, tf.int64))
    return [self._joining.assign(none), self._started.assign(none), self._ready.assign(none)]

  def lost_marker(self, worker: tf.Tensor) -> tf.Tensor:
    """(The chief, after it fenced `worker`) Sends the marker it owes, as DONE; 1 if it did."""
    with tf.device(self.owed.device):
      return execute_unrecorded(self._queue.lock, functools.partial(self._send_owed, worker))

  def _send_owed(self, worker: tf.Tensor) -> tf.Tensor:
    """(Inside the lock) A fenced `worker`'s owed marker, sent as DONE; 1 if it was due."""
    owed = self.owed[worker]
    due = tf.logical_and(elastic_graph.fenced(self._queue, self._n)[worker], owed >= 0)
    n = tf.cast(due, tf.int32)
    enqueued = self._markers.enqueue_many((tf.fill([n], tf.cast(worker, tf.int32)),
                                           tf.fill([n], DONE), tf.fill([n], owed)))
    cleared = _write_where(self.owed, worker, due, -1)
    with tf.control_dependencies([enqueued, cleared]):
      return tf.identity(n)
