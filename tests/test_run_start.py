"""Tests for hooks/epoch/run_start.py: the chief cleans up and starts the run, workers wait for it."""

import threading
import time

import pytest
import tensorflow as tf

from hooks import graph_keys
from hooks.epoch import run_start
from hooks.errors import ConfigError, StartupTimeoutError
from hooks.faults.liveness import LivenessMonitor, Probe
from hooks.faults.restore_beat import restoring_beat
from hooks.epoch.run_start import RunStartHook
from tf_unit import LOCAL, graph, v1  # noqa: F401  (graph: a fresh graph per test)


def test_exports():
  assert run_start.__all__ == ["RunStartHook", "check_started", "rejoined_run"]


class _Probes:

  def __init__(self, chief_incarnation=7, own_incarnation=None):
    self.answers = {"chief": Probe("up", chief_incarnation)}
    if own_incarnation is not None:
      self.answers["me"] = Probe("up", own_incarnation)

  def probe(self, address, timeout):
    return self.answers[address]


def _hook(probes, is_chief, task_name="worker:1", timeout=5.0):
  addresses = {"chief:0": "chief"}
  if "me" in probes.answers:
    addresses[task_name] = "me"
  monitor = LivenessMonitor(addresses, task_name, probe=probes.probe)
  return RunStartHook(is_chief, "chief:0", monitor, task_name=task_name,
                      startup_timeout_secs=timeout, ps_device=LOCAL)


def _task_of(server, probes, is_chief, name, timeout=5.0):
  """A RunStartHook (with the run's roster) and a session on `server`, in a graph of its own
  as in a real cluster."""
  with tf.Graph().as_default():
    monitor = LivenessMonitor({"chief:0": "chief"}, name, probe=probes.probe)
    hook = RunStartHook(is_chief, "chief:0", monitor, task_name=name,
                        startup_timeout_secs=timeout, ps_device=LOCAL,
                        worker_id=0 if is_chief else 1, num_workers=2)
    hook.begin()
    sess = v1.Session(server.target)
  return hook, sess


def _session_with(hook, target=""):
  hook.begin()
  sess = v1.Session(target)
  hook.after_create_session(sess, None)
  return sess


@pytest.mark.timeout(30, method="thread")
class TestRunStartHook:

  def test_the_chief_runs_the_reset_ops_and_writes_its_incarnation(self, graph):
    queue = v1.FIFOQueue(-1, [tf.int64], shapes=[[]], shared_name="leftovers")
    v1.add_to_collection(graph_keys.RESET_OPS, queue.dequeue_many(queue.size()))
    hook = _hook(_Probes(chief_incarnation=0xABC), is_chief=True, task_name="chief:0")
    hook.begin()
    with v1.Session() as sess:
      sess.run(queue.enqueue_many([[1, 2, 3]]))  # what an earlier run left
      hook.after_create_session(sess, None)
      assert sess.run(queue.size()) == 0
      assert sess.run(graph.get_tensor_by_name("epochsync_run_start/epochsync_run_id:0")) == 0xABC

  def test_a_worker_waits_until_the_current_chief_started_the_run(self):
    server = tf.distribute.Server.create_local_server()
    chief_hook, chief = _task_of(server, _Probes(chief_incarnation=42), True, "chief:0")
    worker_hook, worker = _task_of(server, _Probes(chief_incarnation=42), False, "worker:1")
    chief.run(chief_hook._run_id.initializer)  # the previous run's chief left 0 there
    timer = threading.Timer(0.5, lambda: chief_hook.after_create_session(chief, None))
    start = time.monotonic()
    timer.start()
    worker_hook.after_create_session(worker, None)
    assert 0.4 <= time.monotonic() - start < 3
    timer.join()

  def test_a_worker_waits_for_a_chief_that_comes_up_after_it(self):
    """A worker on long-lived ps tasks finds the model ready at once and may get here before
    the relaunched chief's server is up: it waits for it instead of failing."""
    server = tf.distribute.Server.create_local_server()
    probes = _Probes(chief_incarnation=42)
    probes.answers["chief"] = Probe("down", None, "connection refused")

    def task(is_chief, name):
      with tf.Graph().as_default():
        hook = _hook(probes, is_chief=is_chief, task_name=name)
        hook.begin()
        sess = v1.Session(server.target)
      return hook, sess

    chief_hook, chief = task(True, "chief:0")
    worker_hook, worker = task(False, "worker:1")
    chief.run(chief_hook._run_id.initializer)

    def chief_comes_up():
      probes.answers["chief"] = Probe("up", 42)
      chief_hook.after_create_session(chief, None)

    timer = threading.Timer(0.6, chief_comes_up)
    start = time.monotonic()
    timer.start()
    worker_hook.after_create_session(worker, None)
    assert 0.5 <= time.monotonic() - start < 3
    timer.join()

  def test_a_restarted_worker_does_not_join_its_earlier_processs_run(self, monkeypatch, caplog):
    """OnFailure restarts a killed worker at once: the new process must not train the running
    epoch a second time beside the chief; it joins the next run."""
    server = tf.distribute.Server.create_local_server()
    probes = _Probes(chief_incarnation=42)
    task = lambda is_chief, name, timeout=5.0: _task_of(server, probes, is_chief, name, timeout)
    chief_hook, chief = task(True, "chief:0")
    chief_hook.after_create_session(chief, None)
    first_hook, first = task(False, "worker:1")
    first_hook.after_create_session(first, None)  # joins
    first_hook.after_create_session(first, None)  # the same process again: still its run
    monkeypatch.setattr(run_start, "_PROCESS_ID", run_start._PROCESS_ID + 1)  # relaunched
    second_hook, second = task(False, "worker:1", timeout=1.0)
    with pytest.raises(StartupTimeoutError, match=r"^worker:1 waited 1 s, the last 1 s without "
                                                  r"progress \(chief:0 has not started\), for "
                                                  r"chief:0 to end run 2a, which an earlier "
                                                  r"process of worker:1 had joined: restart"):
      second_hook.after_create_session(second, None)
    assert any("worker:1 restarted while chief:0's run 2a is going on" in r.getMessage()
               for r in caplog.records if r.levelname == "WARNING"), caplog.text
    probes.answers["chief"] = Probe("up", 43)  # the job restarted: a new chief, a new run
    new_chief_hook, new_chief = task(True, "chief:0")
    new_chief_hook.after_create_session(new_chief, None)
    second_hook, second = task(False, "worker:1")
    second_hook.after_create_session(second, None)  # joins the new run

  def test_a_worker_waits_past_its_timeout_while_the_chief_restores(self):
    """Long-lived ps tasks: the model is ready at once, the relaunched chief still restores."""
    server = tf.distribute.Server.create_local_server()
    chief_hook, chief = _task_of(server, _Probes(chief_incarnation=42), True, "chief:0", 2.0)
    worker_hook, worker = _task_of(server, _Probes(chief_incarnation=42), False, "worker:1", 2.0)
    chief.run(chief_hook._run_id.initializer)  # the previous run's chief left 0 there

    def restore_then_start():
      with restoring_beat(server.target, num_workers=2, ps_device=LOCAL):
        time.sleep(5.0)  # 2.5 timeouts of the worker; the beat is every second
        chief_hook.after_create_session(chief, None)

    timer = threading.Timer(0.1, restore_then_start)
    start = time.monotonic()
    timer.start()
    worker_hook.after_create_session(worker, None)  # no StartupTimeoutError
    assert 5.0 <= time.monotonic() - start < 10
    timer.join()

  def test_a_chief_that_never_comes_up_is_named_at_the_startup_timeout(self, graph):
    probes = _Probes()
    probes.answers["chief"] = Probe("down", None, "connection refused")
    with pytest.raises(StartupTimeoutError, match=r"^worker:1 gave up at the start of the run: "
                                                  r"chief:0 never came up \(chief:0 at chief: "
                                                  r"connection refused\)"):
      _session_with(_hook(probes, is_chief=False, timeout=0.5))

  def test_a_worker_gives_up_at_its_startup_timeout_naming_the_chief(self, graph):
    hook = _hook(_Probes(chief_incarnation=42), is_chief=False, timeout=0.5)
    start = time.monotonic()
    with pytest.raises(StartupTimeoutError, match=r"^worker:1 waited 0.5 s for chief:0 to start "
                                                  r"the run .* found nothing\): check its log"):
      _session_with(hook)
    assert time.monotonic() - start < 3

  def test_two_processes_claiming_one_task_are_refused(self, graph):
    # This in-process session's own task is /job:localhost/replica:0/task:0.
    hook = _hook(_Probes(own_incarnation=123456789), is_chief=True, task_name="localhost:0")
    with pytest.raises(ConfigError, match=r"^another process answers at me, the address of "
                                          r"localhost:0: two tasks claim localhost:0; give every "
                                          r"task its own index"):
      _session_with(hook)


def test_a_task_answering_at_its_own_address_passes_the_check(graph):
  """The real probe and the session's own devices agree on the incarnation (unsigned)."""
  server = tf.distribute.Server.create_local_server()
  monitor = LivenessMonitor({"localhost:0": server.target[len("grpc://"):]}, "localhost:0")
  hook = RunStartHook(True, "localhost:0", monitor, task_name="localhost:0", ps_device=LOCAL)
  hook.begin()
  with v1.Session(server.target) as sess:
    hook.after_create_session(sess, None)  # no ConfigError
    run_id = sess.run(hook._run_id)
  assert run_id == monitor.probe(["localhost:0"])["localhost:0"].incarnation & (2**63 - 1)


def test_a_hook_placed_before_the_run_start_is_refused(graph):
  """The chief's aggregation must not start before its clean-up of the ps-side queues."""
  import hooks.sync.tokens  # noqa: F401  (the check is what SafeSyncTokensHook calls)
  hook = _hook(_Probes(chief_incarnation=1), is_chief=True, task_name="chief:0")
  hook.begin()
  with pytest.raises(ConfigError, match=r"^SafeSyncTokensHook runs before the RunStartHook: put "
                                        r"the RunStartHook first"):
    run_start.check_started("SafeSyncTokensHook")
  with v1.Session() as sess:
    hook.after_create_session(sess, None)
  run_start.check_started("SafeSyncTokensHook")  # now it has run


def test_the_graph_still_exports_without_a_warning(graph):
  """Every chief save exports the meta graph: no Python object of ours may sit in a collection.

  (A RunStartHook in a collection made each save log "Issue encountered when serializing
  epochsync_run_start_hooks" and "'RunStartHook' object has no attribute 'name'".)
  """
  import gc
  import logging
  records = []
  handler = logging.Handler(logging.WARNING)
  handler.emit = records.append
  # Earlier tests' graphs, collected at any allocation, make tf_should_use log "Object was never
  # used" for their tensors: collect them first, and ignore any that still arrive (not ours).
  gc.collect()
  tf.get_logger().addHandler(handler)
  try:
    _hook(_Probes(chief_incarnation=1), is_chief=True, task_name="chief:0").begin()
    v1.train.export_meta_graph(graph=graph)
  finally:
    tf.get_logger().removeHandler(handler)
  assert [r.getMessage() for r in records if not r.pathname.endswith("tf_should_use.py")] == []
  assert not [k for k in graph.get_all_collection_keys() if "run_start" in k]
