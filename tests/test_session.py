"""FastWorkerSessionCreator: polls quickly and names the chief when its deadline passes."""

import re
import time

import pytest
import tensorflow as tf

from hooks.session import creators as session_lib
from hooks.errors import EpochSyncError, StartupTimeoutError, TaskDiedError
from hooks.faults.liveness import LivenessMonitor, Probe
from hooks.session.creators import EpochSyncChiefSessionCreator, FastWorkerSessionCreator
from tf_unit import graph, v1  # noqa: F401  (graph: a fresh graph per test)


def test_exports():
  assert sorted(session_lib.__all__) == ["EpochSyncChiefSessionCreator",
                                         "FastWorkerSessionCreator", "session_creator"]


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


class _Table:
  """A probe answering from a dict address -> Probe, for LivenessMonitor."""

  def __init__(self, **answers):
    self.answers = answers

  def probe(self, address, timeout):
    return self.answers[address]


def _monitor(table):
  addresses = {"chief:0": "chief", "ps:0": "ps0", "ps:1": "ps1"}
  return LivenessMonitor(addresses, "worker:0", period_secs=0.1, probe=table.probe)


@pytest.mark.timeout(30)
def test_a_chief_that_dies_while_a_worker_waits_for_it_is_named_within_a_second():
  v1.get_variable("w", [2], initializer=v1.zeros_initializer())  # nobody initialises it
  table = _Table(chief=Probe("up", 1), ps0=Probe("up", 2), ps1=Probe("up", 3))
  died_at = []
  probe = table.probe

  def chief_dies_once_seen_up(address, timeout):  # a chief never seen up may have finished
    answer = probe(address, timeout)
    if address == "chief" and answer.state == "up":
      table.answers["chief"] = Probe("down", None, "gone")
      died_at.append(time.monotonic())
    return answer

  table.probe = chief_dies_once_seen_up
  creator = FastWorkerSessionCreator(max_wait_secs=60, poll_secs=0.1, task_name="worker:0",
                                     chief_name="chief:0", liveness=_monitor(table))
  with pytest.raises(TaskDiedError, match=r"^chief:0 died while worker:0 waited for it for "
                                          r"chief:0 to initialise the model: its server at "
                                          r"chief is gone: gone\."):
    v1.train.MonitoredSession(session_creator=creator)
  assert time.monotonic() - died_at[0] < 2


@pytest.mark.timeout(30)
@pytest.mark.parametrize("chief", [Probe("down", None, "refused"), Probe("up", 1)],
                         ids=["finished-before-the-worker-started", "died-after-initialising"])
def test_a_chief_gone_after_initialising_the_model_does_not_stop_a_late_worker(graph, chief):
  """The chief may train alone and exit before a slow worker starts (no epoch barrier)."""
  var = v1.get_variable("w", [2], initializer=v1.ones_initializer(), use_resource=False)
  server = tf.distribute.Server.create_local_server()
  with v1.Session(server.target) as other:
    other.run(var.initializer)
  table = _Table(chief=chief, ps0=Probe("up", 2), ps1=Probe("up", 3))
  monitor = _monitor(table)
  monitor.probe(["chief:0"])  # seen once (if up) ...
  table.answers["chief"] = Probe("down", None, "gone")  # ... and gone before the worker asks
  creator = FastWorkerSessionCreator(master=server.target, max_wait_secs=5, poll_secs=0.1,
                                     task_name="worker:0", chief_name="chief:0",
                                     liveness=monitor)
  start = time.monotonic()
  with v1.train.MonitoredSession(session_creator=creator) as sess:
    assert list(sess.run(var)) == [1.0, 1.0]
  assert time.monotonic() - start < 3


@pytest.mark.timeout(30)
def test_a_worker_first_waits_for_its_ps_to_come_up():
  v1.get_variable("w", [2], initializer=v1.zeros_initializer())
  table = _Table(chief=Probe("up", 1), ps0=Probe("up", 2), ps1=Probe("down", None, "refused"))
  creator = FastWorkerSessionCreator(max_wait_secs=0.5, task_name="worker:0",
                                     chief_name="chief:0", liveness=_monitor(table))
  with pytest.raises(StartupTimeoutError, match=r"ps:1 never came up \(ps:1 at ps1: refused\)"):
    v1.train.MonitoredSession(session_creator=creator)


@pytest.mark.timeout(30)
def test_the_chief_waits_for_the_ps_tasks_within_its_startup_timeout():
  table = _Table(chief=Probe("up", 1), ps0=Probe("down", None, "refused"),
                 ps1=Probe("up", 3))
  creator = EpochSyncChiefSessionCreator(liveness=_monitor(table), startup_timeout_secs=0.5,
                                         task_name="chief:0")
  start = time.monotonic()
  with pytest.raises(StartupTimeoutError) as info:
    creator.create_session()
  assert time.monotonic() - start < 2
  assert info.value.missing == ("ps:0",)


def test_a_second_session_is_refused_naming_the_dead_task():
  v1.get_variable("w", [2], initializer=v1.zeros_initializer())
  table = _Table(chief=Probe("up", 1), ps0=Probe("up", 2), ps1=Probe("up", 3))
  creator = EpochSyncChiefSessionCreator(liveness=_monitor(table), task_name="chief:0")
  creator.create_session().close()
  table.answers["ps1"] = Probe("up", 4)  # ps:1 restarted: its variables are gone
  with pytest.raises(TaskDiedError, match=r"^ps:1 died while worker:0 waited for it when "
                                          r"MonitoredSession tried to re-create its lost session"
                                          r": it restarted"):
    creator.create_session()


def test_a_second_session_is_refused_even_without_liveness():
  creator = EpochSyncChiefSessionCreator(task_name="chief:0")
  creator.create_session().close()
  with pytest.raises(EpochSyncError, match=r"^chief:0 lost its session .* restart the whole job "
                                           r"\(every task\) from the same model_dir"):
    creator.create_session()


def test_a_refused_second_session_names_the_error_tensorflow_recovered_from(caplog):
  creator = EpochSyncChiefSessionCreator(task_name="chief:0")
  creator.create_session().close()
  verbosity = v1.logging.get_verbosity()
  v1.logging.set_verbosity(v1.logging.INFO)  # as under absl.app.run
  try:  # the line TensorFlow's _RecoverableSession logs before it re-creates the session
    v1.logging.info("An error was raised. This may be due to a preemption in a connected "
                    "worker or parameter server. The current session will be closed and a new "
                    "session will be created. Error: %s", "ABORTED: From /job:ps/replica:0/"
                    "task:0: The same RunGraph (Worker) request was received twice.")
    with pytest.raises(EpochSyncError, match=r"^chief:0 lost its session \(ABORTED: .*received "
                                             r"twice\.\) and .* restart the whole job"):
      creator.create_session()
  finally:
    v1.logging.set_verbosity(verbosity)
  assert any(r.levelname == "WARNING" and re.match(
      r"chief:0: TensorFlow's MonitoredSession lost its session in step \d+ of this task and "
      r"re-created it; the error: ABORTED: From /job:ps/replica:0/task:0: The same RunGraph",
      r.getMessage()) for r in caplog.records), [r.getMessage() for r in caplog.records]
