"""FastWorkerSessionCreator: polls quickly and names the chief when its deadline passes."""

import time

import pytest
import tensorflow as tf

from hooks import session as session_lib
from hooks.errors import StartupTimeoutError
from hooks.session import FastWorkerSessionCreator
from tf_unit import graph, v1  # noqa: F401  (graph: a fresh graph per test)


def test_exports():
  assert sorted(session_lib.__all__) == ["FastWorkerSessionCreator", "session_creator"]


def test_an_uninitialised_model_times_out_naming_the_chief():
  v1.get_variable("w", [2], initializer=v1.zeros_initializer())  # nobody initialises it
  creator = FastWorkerSessionCreator(max_wait_secs=1.0, poll_secs=0.1, task_name="worker:1",
                                     chief_name="chief:0")
  start = time.monotonic()
  with pytest.raises(StartupTimeoutError) as info:
    v1.train.MonitoredSession(session_creator=creator)
  assert time.monotonic() - start < 3
  assert info.value.missing == ("chief:0",)
  assert str(info.value) == (
      "session creation timed out after 1 s on worker:1: the model is still not initialised; "
      "missing chief:0 (check its log or raise --epochsync_startup_timeout_secs)")


def test_a_model_initialised_by_someone_else_is_found_at_the_next_poll(graph):
  var = v1.get_variable("w", [2], initializer=v1.ones_initializer(), use_resource=False)
  server = tf.distribute.Server.create_local_server()
  with v1.Session(server.target) as chief:  # the "chief" initialises after the worker asks
    creator = FastWorkerSessionCreator(master=server.target, max_wait_secs=10, poll_secs=0.1)
    import threading
    timer = threading.Timer(0.5, lambda: chief.run(var.initializer))
    timer.start()
    start = time.monotonic()
    with v1.train.MonitoredSession(session_creator=creator) as sess:
      assert list(sess.run(var)) == [1.0, 1.0]
    timer.join()
  assert time.monotonic() - start < 3  # TensorFlow's own creator would sleep 30 s here
