"""Tests for hooks/faults/liveness.py: who is up, who died, who restarted; probes of real servers."""

import threading
import time

import portpicker
import pytest
import tensorflow as tf

from hooks.faults import liveness
from hooks.config.cluster import ClusterConfig
from hooks.errors import EpochSyncError, StartupTimeoutError, TaskDiedError
from hooks.faults.liveness import LivenessMonitor, Probe

ADDRESSES = {"chief:0": "h0:1", "worker:0": "h1:1", "ps:0": "h2:1", "ps:1": "h3:1"}


class FakeCluster:
  """Answers probes from a table: address -> Probe; a clock the test advances."""

  def __init__(self):
    self.answers = {addr: Probe("up", 100 + i) for i, addr in enumerate(ADDRESSES.values())}
    self.now = 0.0
    self.probed = []

  def probe(self, address, timeout):
    self.probed.append(address)
    return self.answers[address]

  def kill(self, name):
    self.answers[ADDRESSES[name]] = Probe("down", None, "UNAVAILABLE: Connection refused")

  def monitor(self, **kwargs):
    return LivenessMonitor(ADDRESSES, "worker:0", probe=self.probe, clock=lambda: self.now,
                           **kwargs)


def test_exports():
  assert sorted(liveness.__all__) == ["LivenessMonitor", "PERIOD_SECS", "Probe",
                                      "explain_lost_session", "monitor_for"]


class TestLivenessMonitor:

  def test_a_task_that_answered_and_then_is_gone_is_dead(self):
    cluster = FakeCluster()
    monitor = cluster.monitor()
    monitor.check(["chief:0", "ps:1"], where="at step 3")  # both up: nothing
    cluster.kill("ps:1")
    cluster.now = 1.0
    with pytest.raises(TaskDiedError) as info:
      monitor.check(["chief:0", "ps:1"], where='at barrier "epoch_end" in epoch 2')
    assert (info.value.task, info.value.where) == ("ps:1", 'at barrier "epoch_end" in epoch 2')
    assert str(info.value).startswith(
        'ps:1 died while worker:0 waited for it at barrier "epoch_end" in epoch 2: its server '
        "at h3:1 is gone: UNAVAILABLE: Connection refused. Restart the whole job")

  def test_a_task_that_never_answered_is_not_dead_but_not_up(self):
    cluster = FakeCluster()
    cluster.kill("worker:0")
    monitor = cluster.monitor()
    assert monitor.dead(["worker:0"]) == []

  def test_a_new_incarnation_is_a_restart(self):
    cluster = FakeCluster()
    monitor = cluster.monitor()
    monitor.probe(["ps:0"])
    cluster.answers["h2:1"] = Probe("up", 999)
    assert monitor.dead(["ps:0"]) == [
        ("ps:0", "it restarted (a new process answers at h2:1; the old one's state is lost)")]

  def test_a_learnt_address_is_probed_as_a_new_task_and_the_given_ones_are_kept(self):
    """(a worker beyond the launch's cluster) The chief learns its address at its join; one
    learnt again (a relaunched process) forgets the old process's incarnation."""
    cluster = FakeCluster()
    cluster.answers.update({"h9:1": Probe("up", 7), "h8:1": Probe("up", 8)})
    monitor = cluster.monitor()
    readers_copy = monitor.addresses
    monitor.learn_address("worker:3", "h9:1")
    assert monitor.dead(["worker:3"]) == [] and cluster.probed[-1] == "h9:1"
    assert "worker:3" not in readers_copy  # replaced, not changed: a reader's view holds
    monitor.learn_address("worker:3", "h8:1")  # its relaunch, elsewhere: a first answer
    assert monitor.dead(["worker:3"]) == [] and cluster.probed[-1] == "h8:1"
    assert monitor.given == frozenset(ADDRESSES)

  def test_a_busy_task_is_not_dead(self):
    cluster = FakeCluster()
    monitor = cluster.monitor()
    monitor.probe(["chief:0"])
    cluster.answers["h0:1"] = Probe("busy", None, "DEADLINE_EXCEEDED")
    assert monitor.dead(["chief:0"]) == []

  def test_a_task_silent_for_stalled_after_secs_is_lost_and_an_answer_resets_it(self):
    cluster = FakeCluster()
    monitor = cluster.monitor()
    monitor.probe(["chief:0"])
    cluster.answers["h0:1"] = Probe("busy", None, "DEADLINE_EXCEEDED")  # SIGSTOPped
    assert monitor.dead(["chief:0"], stalled_after_secs=6) == []  # silent from now
    cluster.now = 5.9
    assert monitor.dead(["chief:0"], stalled_after_secs=6) == []
    cluster.answers["h0:1"] = Probe("up", 100)  # it answered once: the silence starts again
    assert monitor.dead(["chief:0"], stalled_after_secs=6) == []
    cluster.answers["h0:1"] = Probe("busy", None, "DEADLINE_EXCEEDED")
    assert monitor.dead(["chief:0"], stalled_after_secs=6) == []
    cluster.now = 12.0
    assert monitor.dead(["chief:0"]) == []  # without stalled_after_secs: busy is not dead
    assert monitor.dead(["chief:0"], stalled_after_secs=6) == [
        ("chief:0", "it has answered no probe for 6 s: the process is frozen (SIGSTOP, a long "
                    "pause) or cut off from this task")]

  def test_check_probes_at_most_once_per_period(self):
    cluster = FakeCluster()
    monitor = cluster.monitor(period_secs=1.0)
    for now in (0.0, 0.5, 0.99, 1.0, 1.5, 2.0):
      cluster.now = now
      monitor.check(["ps:0"], where="x")
    assert len(cluster.probed) == 3  # at 0.0, 1.0 and 2.0
    monitor.check(["ps:0"], where="x", force=True)
    assert len(cluster.probed) == 4

  def test_wait_until_up_names_the_tasks_that_never_came(self):
    cluster = FakeCluster()
    cluster.kill("ps:1")
    monitor = cluster.monitor()
    with pytest.raises(StartupTimeoutError) as info:
      monitor.wait_until_up(["ps:0", "ps:1"], deadline=-1, where="before creating its session")
    assert info.value.missing == ("ps:1",)
    assert str(info.value) == (
        "worker:0 gave up before creating its session: ps:1 never came up (ps:1 at h3:1: "
        "UNAVAILABLE: Connection refused); start them, check the addresses in TF_CONFIG, or "
        "raise --epochsync_startup_timeout_secs")

  def test_wait_until_up_returns_once_all_answered(self):
    cluster = FakeCluster()
    up = cluster.monitor().wait_until_up(list(ADDRESSES), deadline=10, where="x")
    assert sorted(cluster.probed) == sorted(ADDRESSES.values())
    assert {n: a.incarnation for n, a in up.items()} == {"chief:0": 100, "worker:0": 101,
                                                          "ps:0": 102, "ps:1": 103}

  def test_explain_lost_session(self):
    cluster = FakeCluster()
    monitor = cluster.monitor()
    monitor.probe(list(ADDRESSES))
    cluster.kill("ps:0")
    lost = tf.errors.UnavailableError(None, None, "Socket closed")
    error = liveness.explain_lost_session(lost, monitor, "worker:0", "at step 4")
    assert isinstance(error, TaskDiedError) and error.task == "ps:0"
    error = liveness.explain_lost_session(lost, None, "worker:0", "at step 4")
    assert type(error) is EpochSyncError
    assert str(error).startswith("worker:0 lost its session at step 4: UnavailableError: "
                                 "Socket closed. A task or the network failed; restart the whole")


def test_monitor_for_is_one_per_process_and_leaves_the_evaluator_out():
  cluster = {"chief": ["h0:1"], "worker": ["h1:1"], "ps": ["h2:1"], "evaluator": ["h9:1"]}
  config = ClusterConfig(cluster, "worker", 0)
  monitor = liveness.monitor_for(config)
  assert monitor is liveness.monitor_for(ClusterConfig(dict(cluster), "worker", 0))
  assert monitor.addresses == {"chief:0": "h0:1", "worker:0": "h1:1", "ps:0": "h2:1"}
  assert monitor.task_name == "worker:0"


@pytest.mark.timeout(30)
def test_the_grpc_probe_of_a_real_server_and_of_a_closed_port():
  server = tf.distribute.Server.create_local_server()
  address = server.target[len("grpc://"):]
  closed = f"localhost:{portpicker.pick_unused_port()}"
  monitor = LivenessMonitor({"ps:0": address, "ps:1": closed}, "worker:0")
  start = time.monotonic()
  answers = monitor.probe(["ps:0", "ps:1"])
  assert time.monotonic() - start < 2.5
  assert answers["ps:0"].state == "up" and answers["ps:0"].incarnation != 0
  assert monitor.probe(["ps:0"])["ps:0"].incarnation == answers["ps:0"].incarnation
  assert answers["ps:1"].state == "down" and "UNAVAILABLE" in answers["ps:1"].detail


@pytest.mark.timeout(30)
def test_a_task_that_comes_up_after_a_failed_probe_is_seen_up_at_once():
  """gRPC's default reconnect backoff (1 s) would hide it for up to a second after it came up.

  At start-up every task waits for others this way (ps tasks before the session, the chief's
  server in the run start), one after the other: each such second was start-up time.
  """
  port = portpicker.pick_unused_port()
  monitor = LivenessMonitor({"ps:0": f"localhost:{port}"}, "worker:0")
  assert monitor.probe(["ps:0"])["ps:0"].state == "down"  # the channel's connection failed
  up_at = []

  def start_the_server_later():
    time.sleep(0.5)
    up_at.append((tf.distribute.Server(tf.train.ClusterSpec({"ps": [f"localhost:{port}"]}),
                                       "ps", 0), time.monotonic()))

  thread = threading.Thread(target=start_the_server_later)
  thread.start()
  monitor.wait_until_up(["ps:0"], deadline=time.monotonic() + 20, where="in the test")
  seen_at = time.monotonic()
  thread.join()
  assert seen_at - up_at[0][1] < 0.4  # 1.1 s after the first probe, i.e. 0.6 s late, before


def test_a_dead_ps_is_named_first_with_the_others_that_are_gone():
  cluster = FakeCluster()
  monitor = cluster.monitor()
  monitor.probe(list(ADDRESSES))
  cluster.kill("chief:0")  # the chief exited because ps:1 died
  cluster.kill("ps:1")
  with pytest.raises(TaskDiedError) as info:
    monitor.check(["chief:0", "ps:0", "ps:1"], where="at step 2")
  assert info.value.task == "ps:1"
  assert "Connection refused (also gone: chief:0). Restart" in str(info.value)
