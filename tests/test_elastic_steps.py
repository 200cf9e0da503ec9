"""The synchronous step's elastic pieces (hooks.sync.elastic_steps) on a local session: the marker
in the queue's lock, the owed markers the chief sends for a lost worker, and the gradient
queues' filter. The protocol on real processes: tests/test_elastic_sync_cluster.py."""

import types

import numpy as np
import pytest
import tensorflow as tf

from hooks.errors import FENCED_MARK, ConfigError
from hooks.sync.aggregation_graph import DONE, GRAD
from hooks.sync.elastic_steps import IDLE, ElasticSteps
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
  assert s.run(s.owed).tolist() == [-1, -1, -1]
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
  assert s.run(s.tokens, {s.receivers: [1, 1, 1], s.token: 6}) == 1
  assert s.markers_sent() == [(2, DONE, 6)]  # its marker of the next step, sent for it
  assert s.run(s.owed).tolist() == [6, 6, -1]
  assert s.run(s.lost, {s.lost_worker: 2}) == 0  # never twice


def test_the_mean_takes_the_steps_senders_gradients_only():
  graph = tf.Graph()
  with graph.as_default():
    queue = tf.queue.FIFOQueue(-1, [tf.int32, tf.int64, tf.float32], shapes=[(), (), (2,)])
    var = _v1.Variable([0.0, 0.0])
    rows = [(0, 7, [1.0, 2.0]), (1, 7, [100.0, 100.0]),  # worker 1 sent no marker
            (2, 6, [50.0, 50.0]),  # a late gradient of an earlier step
            (2, 7, [3.0, 4.0])]
    fill = [queue.enqueue((tf.constant(w), tf.constant(s, tf.int64), tf.constant(g)))
            for w, s, g in rows]
    senders = tf.constant([1, 0, 1])
    g_on = tf.constant(2)
    [(mean, _)] = ElasticSteps.mean_gradients([(queue, var)], senders, tf.constant(7, tf.int64),
                                              g_on, g_on)
    with _v1.Session() as session:
      session.run(fill)
      np.testing.assert_allclose(session.run(mean), [2.0, 3.0])
      assert session.run(queue.size()) == 0  # the rest is dropped


def test_a_sparse_gradient_is_a_config_error_that_names_the_variable():
  s = _Steps()
  with s.queue.graph.as_default():
    table = _v1.Variable(tf.zeros([4, 2]), name="table")
    sparse = tf.IndexedSlices(tf.ones([1, 2]), tf.constant([1]), tf.constant([4, 2]))
    with pytest.raises(ConfigError, match="table.*sparse.*--epochsync_sync=false"):
      s.steps.gradient_queues([(sparse, table)], "opt", s.local, 0)
