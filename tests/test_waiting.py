"""Tests for hooks/faults/waiting.py: BackgroundRun waits with ticks and a deadline, never cancels early."""

import threading
import time

import pytest
import tensorflow as tf

from hooks.faults import waiting
from hooks.faults.waiting import BackgroundRun


class _BlockingSession:
  """A session whose run() blocks until `release` is set; records the options it got."""

  def __init__(self, value=42, error=None):
    self.release = threading.Event()
    self.value, self.error = value, error
    self.options = []
    self.finished = threading.Event()

  def run(self, fetches, feed_dict=None, options=None):
    self.options.append(options)
    self.release.wait(10)
    self.finished.set()
    if self.error is not None:
      raise self.error
    return self.value


def test_exports():
  assert waiting.__all__ == ["BackgroundRun", "GRACE_SECS", "MAX_WAIT_SECS", "RunThread",
                              "run_options", "run_uncancelled"]


def test_run_options_never_below_one_millisecond():
  assert waiting.run_options(0.0).timeout_in_ms == 1
  assert waiting.run_options(1.5).timeout_in_ms == 1500


@pytest.mark.timeout(20, method="thread")
class TestBackgroundRun:

  def test_returns_the_value_and_ticks_while_it_waits(self):
    session = _BlockingSession()
    ticks = []

    def on_tick(waited):
      ticks.append(waited)
      if len(ticks) == 3:
        session.release.set()

    call = BackgroundRun(session, "fetch", deadline=time.monotonic() + 10)
    assert call.wait_until_deadline(tick_secs=0.01, on_tick=on_tick)
    assert call.result() == 42 and call.done
    assert len(ticks) == 3 and ticks == sorted(ticks) and ticks[0] >= 0.01

  def test_the_run_deadline_comes_after_the_callers(self):
    session = _BlockingSession()
    session.release.set()
    call = BackgroundRun(session, "fetch", deadline=time.monotonic() + 3, grace_secs=5)
    assert call.wait_until_deadline(tick_secs=1)
    assert 7900 <= session.options[0].timeout_in_ms <= 8000

  def test_gives_up_at_the_deadline_without_waiting_for_the_run(self):
    session = _BlockingSession()
    start = time.monotonic()
    call = BackgroundRun(session, "fetch", deadline=start + 0.2)
    assert not call.wait_until_deadline(tick_secs=0.05)
    assert 0.2 <= time.monotonic() - start < 1.0
    assert not call.done and not session.finished.is_set()  # abandoned, still blocked
    with pytest.raises(RuntimeError, match="before the run ended"):
      call.result()
    session.release.set()

  def test_a_tick_longer_than_the_deadline_does_not_delay_it(self):
    session = _BlockingSession()
    start = time.monotonic()
    call = BackgroundRun(session, "fetch", deadline=start + 0.2)
    assert not call.wait_until_deadline(tick_secs=3600)
    assert time.monotonic() - start < 1.0
    session.release.set()

  def test_re_raises_the_runs_error(self):
    session = _BlockingSession(error=tf.errors.UnavailableError(None, None, "ps:0 is gone"))
    session.release.set()
    call = BackgroundRun(session, "fetch", deadline=time.monotonic() + 5)
    assert call.wait_until_deadline(tick_secs=1)
    with pytest.raises(tf.errors.UnavailableError, match="ps:0 is gone"):
      call.result()

  def test_an_error_in_on_tick_propagates(self):
    session = _BlockingSession()
    call = BackgroundRun(session, "fetch", deadline=time.monotonic() + 5)

    def on_tick(waited):
      raise KeyError("log failed")

    with pytest.raises(KeyError, match="log failed"):
      call.wait_until_deadline(tick_secs=0.01, on_tick=on_tick)
    session.release.set()

  def test_a_finished_run_wins_over_a_passed_deadline(self):
    session = _BlockingSession()
    session.release.set()
    call = BackgroundRun(session, "fetch", deadline=time.monotonic() + 1)
    assert session.finished.wait(5)
    time.sleep(0.01)  # let the thread publish its result
    assert call.done
    assert BackgroundRun.wait_until_deadline(call, tick_secs=0.1)


@pytest.mark.timeout(60, method="thread")
def test_no_element_is_lost_by_a_wait_that_ticks_every_millisecond():
  """Against a real in-process gRPC server: 300 dequeues, each waited on with 1 ms ticks
  while another session enqueues at random moments; every element arrives, in order."""
  import numpy as np
  v1 = tf.compat.v1
  server = tf.distribute.Server.create_local_server()
  with tf.Graph().as_default():
    queue = v1.FIFOQueue(-1, [tf.int64], shapes=[[]], shared_name="waiting_test_q")
    value = v1.placeholder(tf.int64, [])
    enqueue, dequeue = queue.enqueue([value]), queue.dequeue()
    producer, consumer = v1.Session(server.target), v1.Session(server.target)
    rng = np.random.default_rng(0)
    n, got = 300, []

    def produce():
      for i in range(n):
        time.sleep(float(rng.uniform(0, 0.004)))
        producer.run(enqueue, {value: i})

    thread = threading.Thread(target=produce, daemon=True)
    thread.start()
    for _ in range(n):
      call = BackgroundRun(consumer, dequeue, deadline=time.monotonic() + 10)
      assert call.wait_until_deadline(tick_secs=0.001), f"lost an element after {got[-1:]}"
      got.append(int(call.result()))
    thread.join(10)
    assert got == list(range(n))


def test_run_uncancelled_gives_up_without_cancelling_and_the_run_ends_later():
  graph = tf.Graph()
  with graph.as_default():
    queue = tf.queue.FIFOQueue(2, tf.int64)
    take, put, size = queue.dequeue(), queue.enqueue(7), queue.size()
  with tf.compat.v1.Session(graph=graph) as session:
    started = time.monotonic()
    with pytest.raises(tf.errors.DeadlineExceededError, match="the run was left to end"):
      waiting.run_uncancelled(session, take, wait_secs=0.2)
    assert 0.2 <= time.monotonic() - started < 5
    session.run(put)  # the dequeue left behind takes it: it was never cancelled
    deadline = time.monotonic() + 10
    while session.run(size) and time.monotonic() < deadline:
      time.sleep(0.01)
    assert session.run(size) == 0
    assert waiting.run_uncancelled(session, put, wait_secs=5) is None


def test_run_uncancelled_gives_its_run_no_deadline_of_the_callers():
  session = _BlockingSession()
  session.release.set()
  assert waiting.run_uncancelled(session, "x", wait_secs=0.5) == 42
  assert session.options[0].timeout_in_ms >= waiting.MAX_WAIT_SECS * 1000


def test_a_run_thread_serves_calls_in_order_and_ends_when_idle():
  session = _BlockingSession()
  runs = waiting.RunThread("test-runs", idle_secs=0.2)
  first, second = runs.submit(session, "a"), runs.submit(session, "b")
  assert not first.wait(0.1)  # blocked: the caller gave up waiting, nothing was cancelled
  session.release.set()
  assert first.wait(5) and second.wait(5) and first.result() == second.result() == 42
  assert all(o.timeout_in_ms >= waiting.MAX_WAIT_SECS * 1000 for o in session.options)
  deadline = time.monotonic() + 5
  while runs._thread is not None and time.monotonic() < deadline:  # pylint: disable=protected-access
    time.sleep(0.05)
  assert runs._thread is None  # pylint: disable=protected-access
  assert runs.submit(session, "c").wait(5)  # a new thread serves it
