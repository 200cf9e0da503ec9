"""The synchronous step's elastic pieces (hooks.sync.elastic_steps) on a local session: the marker
in the queue's lock, the owed markers the chief sends for a lost worker, and the gradient
queues' filter. The protocol on real processes: tests/test_elastic_sync_cluster.py."""

import types

import numpy as np
import pytest
import tensorflow as tf

from hooks.errors import FENCED_MARK
from hooks.sync import gradient_queues
from hooks.sync.aggregation_graph import DONE, GRAD
from hooks.sync.elastic_steps import IDLE, ElasticSteps
from hooks.workqueue.elastic_graph import CLOSED, JOINED, NOT_FENCED
from local_queue import LocalQueue

_v1 = tf.compat.v1
WORKERS = 3


class _Steps:
  """ElasticSteps over a LocalQueue of 3 units and 3 workers, with its own marker queue."""

  def __init__(self):
    self.queue = LocalQueue(units=3, workers=WORKERS, elastic=True)
    with self.queue.graph.as_default():
      self.step = _v1.Variable(5, dtype=tf.int64, name="step")
      completed = _v1.Variable(0, dtype=tf.int64, name="completed_epochs")
      self.markers = tf.queue.FIFOQueue(-1, [tf.int32, tf.int32, tf.int64], shapes=[(), (), ()])
      state = types.SimpleNamespace(markers=self.markers, completed_epochs=completed)
      self.steps = ElasticSteps(self.queue.ops, state, self.step, WORKERS)
      self.local = _v1.Variable(5, dtype=tf.int64, name="local")
      self.grad = {w: self.steps.marker(w, GRAD, self.local) for w in range(WORKERS)}
      self.done = self.steps.marker(2, DONE, self.local)
      self.idle = self.steps.marker(0, IDLE, self.local)
      self.lost_worker = _v1.placeholder(tf.int64, [])
      self.lost = self.steps.lost_marker(self.lost_worker)
      self.receivers = _v1.placeholder(tf.int32, [WORKERS])
      self.token = _v1.placeholder(tf.int64, [])
      self.tokens = self.steps.after_tokens(self.receivers, self.token,
                                            tf.zeros([WORKERS], tf.int32))
      self.take = self.markers.dequeue_many(self.markers.size())
      self.started = self.steps.guest.started.read_value()
      self.epoch_start = self.steps.epoch_start(self.token, tf.constant(1, tf.int64))
      self.owed = self.steps.owed.read_value()
      run = self.queue.session.run
      run([self.step.initializer, completed.initializer, self.local.initializer,
           self.steps.owed.initializer])
      run(self.steps.init)

  def run(self, fetches, feeds=None):
    return self.queue.session.run(fetches, feeds)

  def markers_sent(self):
    ids, kinds, steps = self.run(self.take)
    return list(zip(ids.tolist(), kinds.tolist(), steps.tolist()))


def test_a_marker_clears_what_its_worker_owes_and_a_grad_marker_counts_its_batch():
  s = _Steps()
  assert s.run(s.owed).tolist() == [5, 5, 5]  # every worker owes the step's marker
  for w in range(WORKERS):
    s.queue.claim(0, worker=w, seq=0)
  s.run(s.grad[1])
  s.run(s.done)
  s.run(s.idle)
  assert s.markers_sent() == [(1, GRAD, 5), (2, DONE, 5), (0, IDLE, 5)]
  assert s.run(s.owed).tolist() == [-2, -2, -1]  # in a round not aggregated yet; done
  gated = s.run(s.queue.ops.gated)[:WORKERS] % 2**32
  assert gated.tolist() == [0, 1, 0]  # only the GRAD marker is a batch


def test_a_fenced_workers_marker_is_refused_and_the_chief_sends_the_one_it_owes_once():
  s = _Steps()
  for w in range(WORKERS):
    s.queue.claim(0, worker=w, seq=0)
  s.queue.reclaim(0, worker=1)  # the chief fences worker 1
  with pytest.raises(tf.errors.InvalidArgumentError, match=FENCED_MARK):
    s.run(s.grad[1])
  assert s.markers_sent() == []
  assert s.run(s.lost, {s.lost_worker: 1}) == 1
  assert s.run(s.lost, {s.lost_worker: 1}) == 0  # run again: nothing more
  assert s.run(s.lost, {s.lost_worker: 2}) == 0  # not fenced: the chief sends nothing
  assert s.markers_sent() == [(1, DONE, 5)]


def test_the_aggregation_sends_a_fenced_receivers_next_marker_and_no_one_elses():
  s = _Steps()
  for w in range(WORKERS):
    s.queue.claim(0, worker=w, seq=0)
    s.run(s.grad[w])  # each sent its marker of step 5: nothing owed
  s.markers_sent()
  s.queue.reclaim(0, worker=2)  # fenced after its marker passed
  assert s.run(s.lost, {s.lost_worker: 2}) == 0  # it owes nothing yet
  assert s.run(s.tokens, {s.receivers: [1, 1, 1], s.token: 6}) == 0  # no guest joined
  assert s.markers_sent() == [(2, DONE, 6)]  # its marker of the next step, sent for it
  assert s.run(s.owed).tolist() == [6, 6, -1]
  assert s.run(s.lost, {s.lost_worker: 2}) == 0  # never twice


def _join(s, worker, epoch=0, token=11):
  ops = s.steps.guest
  return s.run(ops.join, {ops.worker: worker, ops.epoch: epoch, ops.token: token}).tolist()


def _ready(s, worker, epoch=0):
  """The guest's session is ready for its first step: 1 if its join was still pending."""
  ops = s.steps.guest
  return int(s.run(ops.ready, {ops.worker: worker, ops.epoch: epoch}))


def test_a_guest_joins_the_running_epoch_and_the_next_round_that_goes_on_takes_it_in():
  s = _Steps()
  for w in range(WORKERS):
    s.queue.claim(0, worker=w, seq=0, at=0)
  s.run(s.grad[1])  # worker 1's batch of step 5 is in (gated 1), then it dies
  s.markers_sent()
  s.queue.reclaim(0, worker=1)
  assert _join(s, 1) == [CLOSED, 1]  # its marker's round is not over: not yet
  s.run(s.tokens, {s.receivers: [1, 1, 1], s.token: 6})  # it got a token: DONE sent for it
  assert s.markers_sent() == [(1, DONE, 6)]
  assert _join(s, 2) == [NOT_FENCED, 0]  # worker 2's process is not lost
  assert _join(s, 1) == [JOINED, 1]  # its earlier process's batch of epoch 0 is in the model
  assert _join(s, 1) == [JOINED, 1]  # run again (its answer lost): the same, nothing more
  assert s.run(s.started).tolist() == [-1, -1, -1]
  assert s.run(s.tokens, {s.receivers: [1, 0, 1], s.token: 7}) == 0  # its session: not ready
  assert s.run(s.owed).tolist() == [7, -1, 7]  # the steps wait for it only once it is in
  assert _ready(s, 1) == 1
  assert s.run(s.tokens, {s.receivers: [1, 0, 1], s.token: 8}) == 1  # the guest is in
  assert s.run(s.started).tolist() == [-1, 8, -1]  # its first marker: step 8, no token
  assert s.run(s.owed).tolist() == [8, 8, 8]
  assert s.run(s.tokens, {s.receivers: [1, 1, 1], s.token: 9}) == 0  # in once
  assert _gather_check(s, 0, worker=1) == (False, 1)  # in the steps: it arrives itself
  s.run(s.epoch_start, {s.token: 10})
  assert s.run(s.started).tolist() == [-1, -1, -1]
  assert _gather_check(s, 1, worker=1) == (False, 0)


def _gather_check(s, epoch, worker):
  """The chief's check at `epoch`'s gather (the sync optimizer's): (it arrives for `worker`,
  the worker's batches of `epoch` in the model)."""
  ops = s.steps.guest.membership
  lost, held = s.run(ops.still_lost, {ops.epoch: epoch, ops.worker: worker})
  return bool(lost), int(held)


def test_the_chiefs_gather_stands_in_for_a_guest_no_step_took_in_and_cancels_its_join():
  s = _Steps()
  for w in range(WORKERS):
    s.queue.claim(0, worker=w, seq=0)
  s.run(s.grad[1])
  s.queue.reclaim(0, worker=1)
  s.run(s.tokens, {s.receivers: [1, 1, 1], s.token: 6})  # its round: DONE sent for it
  assert _join(s, 1) == [JOINED, 1]
  assert _gather_check(s, 0, worker=1) == (True, 1)  # the chief arrives for it, with its batch
  assert _ready(s, 1) == 0  # its session is ready too late: it starts with the next epoch
  assert s.run(s.tokens, {s.receivers: [1, 0, 1], s.token: 6}) == 0  # too late to take it in
  assert s.run(s.started).tolist() == [-1, -1, -1]
  assert _gather_check(s, 0, worker=1) == (True, 1)  # asked again: the same


def test_a_guest_cannot_join_an_epoch_the_chiefs_gather_stood_in_for_it():
  s = _Steps()
  for w in range(WORKERS):
    s.queue.claim(0, worker=w, seq=0)
  s.queue.reclaim(0, worker=1)
  assert _gather_check(s, 0, worker=1) == (True, 0)  # the chief arrives for it at epoch 0
  assert _join(s, 1) == [CLOSED, 0]  # so its relaunched process joins no step of epoch 0
  assert s.run(s.tokens, {s.receivers: [1, 0, 1], s.token: 6}) == 0
  s.run(s.epoch_start, {s.token: 7})
  assert _join(s, 1, epoch=1) == [JOINED, 0]  # it joins epoch 1
  assert _ready(s, 1, epoch=0) == 0 and _ready(s, 1, epoch=1) == 1
  assert s.run(s.tokens, {s.receivers: [1, 0, 1], s.token: 8}) == 1


def test_a_guest_that_joins_when_the_epoch_ends_starts_with_the_next_one():
  s = _Steps()
  for w in range(WORKERS):
    s.queue.claim(0, worker=w, seq=0)
  s.queue.reclaim(0, worker=1)
  assert _join(s, 1) == [JOINED, 0]  # the marker it owed (step 5) goes first, as DONE
  assert s.markers_sent() == [(1, DONE, 5)]
  assert s.run(s.tokens, {s.receivers: [0, 0, 0], s.token: 5}) == 0  # the epoch's last round
  s.run(s.epoch_start, {s.token: 5})
  assert s.run(s.started).tolist() == [-1, -1, -1]
  assert s.run(s.owed).tolist() == [5, 5, 5]  # a member of the next epoch from its start
  assert s.run(s.tokens, {s.receivers: [1, 1, 1], s.token: 6}) == 0  # never a guest there


def test_a_guest_lost_again_before_a_round_took_it_in_is_not_taken_in():
  s = _Steps()
  for w in range(WORKERS):
    s.queue.claim(0, worker=w, seq=0)
  s.queue.reclaim(0, worker=1)
  assert _join(s, 1)[0] == JOINED and _ready(s, 1) == 1
  s.queue.reclaim(0, worker=1)  # its new process is lost too
  assert s.run(s.tokens, {s.receivers: [1, 0, 1], s.token: 6}) == 0
  assert s.run(s.started).tolist() == [-1, -1, -1]
  assert _join(s, 1, token=12)[0] == JOINED  # a third process joins: ready again first
  assert s.run(s.tokens, {s.receivers: [1, 0, 1], s.token: 7}) == 0
  assert _ready(s, 1) == 1
  assert s.run(s.tokens, {s.receivers: [1, 0, 1], s.token: 8}) == 1


def _mean(rows, sparse_rows=None):
  """gradient_queues.mean over a dense queue (and a sparse one) filled with `rows` (worker,
  step, gradient), for senders 0 and 2 at step 7."""
  graph = tf.Graph()
  with graph.as_default():
    var = _v1.Variable(tf.zeros([4, 2]))
    local = _v1.Variable(0, dtype=tf.int64)
    fills, queues = [], []
    for w, step, grad in rows:
      enqueues, queues = gradient_queues.build([(grad(), var)], "opt", local, w)
      fills.append((step, enqueues))
    senders, g_on = tf.constant([1, 0, 1]), tf.constant(2)
    [(mean, _)] = gradient_queues.mean(queues, senders, tf.constant(7, tf.int64), g_on, g_on)
    if isinstance(mean, tf.IndexedSlices):
      mean = tf.math.unsorted_segment_sum(mean.values, mean.indices, 4)
    with _v1.Session() as session:
      session.run(_v1.global_variables_initializer())
      for step, enqueues in fills:
        session.run(local.assign(step))
        session.run(enqueues)
      return session.run(mean), session.run(queues[0].queue.size())


def test_the_mean_takes_the_steps_senders_gradients_only():
  dense = lambda value: lambda: tf.fill([4, 2], value)
  rows = [(0, 7, dense(1.0)), (1, 7, dense(100.0)),  # worker 1 sent no marker
          (2, 6, dense(50.0)),  # a late gradient of an earlier step
          (2, 7, dense(3.0))]
  mean, left = _mean(rows)
  np.testing.assert_allclose(mean, np.full([4, 2], 2.0))
  assert left == 0  # the rest is dropped


def test_a_sparse_mean_keeps_the_senders_rows_of_any_length_and_drops_the_padding():
  def rows_of(ids, value):
    return lambda: tf.IndexedSlices(tf.fill([len(ids), 2], value), tf.constant(ids),
                                    tf.constant([4, 2]))
  rows = [(0, 7, rows_of([0, 3], 1.0)),
          (1, 7, rows_of([0, 1, 2], 100.0)),  # no marker
          (2, 6, rows_of([1], 50.0)),  # late
          (2, 7, rows_of([3, 3, 1], 2.0))]  # repeated ids are summed
  mean, left = _mean(rows)
  np.testing.assert_allclose(mean, [[0.5, 0.5], [1.0, 1.0], [0.0, 0.0], [2.5, 2.5]])
  assert left == 0


def test_a_guest_relaunched_again_in_the_same_epoch_waits_for_a_new_round_to_take_it_in():
  """A guest a round took in is lost, and its next process joins the same epoch: until a round
  takes that one in, `started` must say -1. Seen in bench.elastic_chaos: the new process read
  its earlier process's `started`, took the running step as its own without any round waiting
  for its marker, and its marker displaced another in the FIFO of markers: the chief's
  aggregation failed with "a marker of another step"."""
  s = _Steps()
  for w in range(WORKERS):
    s.queue.claim(0, worker=w, seq=0)
  s.queue.reclaim(0, worker=1)
  assert _join(s, 1)[0] == JOINED and _ready(s, 1) == 1
  assert s.run(s.tokens, {s.receivers: [1, 0, 1], s.token: 6}) == 1  # taken in at step 6
  assert s.run(s.started).tolist() == [-1, 6, -1]
  s.queue.reclaim(0, worker=1)  # that process is lost in its turn; the chief sends its marker
  s.run(s.lost, {s.lost_worker: 1})
  assert _join(s, 1, token=12)[0] == JOINED  # its next process joins epoch 0
  assert s.run(s.started).tolist() == [-1, -1, -1]  # not in the steps yet
  assert _ready(s, 1) == 1
  assert s.run(s.tokens, {s.receivers: [1, 0, 1], s.token: 7}) == 1
  assert s.run(s.started).tolist() == [-1, 7, -1]
