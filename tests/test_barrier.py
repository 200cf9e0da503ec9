"""Tests for hooks/epoch/barrier.py: EpochBarrierHook validation, the chief's path and its timeouts.

In-process: the barrier state lives on the local session's own device (ps_device=LOCAL).
Two-task tests run two sessions, one per thread, against one in-process server
(`create_local_server()`, whose single task is also "/job:localhost/replica:0/task:0").
"""

import re
import threading
import time

import numpy as np
import pytest
import tensorflow as tf

from hooks.epoch import barrier as barrier_lib
from hooks.epoch.audit import read_audit
from hooks.epoch.barrier import EpochBarrierHook
from hooks.checkpoint.epoch_save import ChiefSaveAfterBarrierHook
from hooks.data.epoch_input import EpochInput, EpochListener
from hooks.errors import BarrierTimeoutError, ConfigError, EpochIncompleteError
from hooks.session.creators import FastWorkerSessionCreator
from tf_unit import LOCAL, graph, v1  # noqa: F401  (graph: a fresh graph per test)
from tf_unit import user_loop as _train


SHARD = np.arange(10, dtype=np.float32)  # batches of 4 -> 3 batches (4, 4, 2) per epoch


def _model(values=SHARD, num_epochs=3, task_name="worker:0"):
  epoch_input = EpochInput(tf.data.Dataset.from_tensor_slices(
      np.asarray(values, np.float32)).batch(4), num_epochs=num_epochs, task_name=task_name)
  global_step = v1.train.get_or_create_global_step()
  total = v1.get_variable("total", [], tf.float32, v1.zeros_initializer(), use_resource=False)
  train_op = tf.group(v1.assign_add(total, tf.reduce_sum(epoch_input.get_next()), use_locking=True),
                      v1.assign_add(global_step, 1, use_locking=True))
  return epoch_input, train_op, total


def _barrier(epoch_input, **kwargs):
  args = dict(num_workers=1, worker_id=0, ps_device=LOCAL)
  args.update(kwargs)
  return EpochBarrierHook(epoch_input, **args)


class _ReadAtEnd(v1.train.SessionRunHook):
  """Reads graph elements by name in `end()` (the last moment the session is usable)."""

  def __init__(self, *names):
    self._names, self.values = names, None

  def end(self, session):
    g = v1.get_default_graph()
    self.values = session.run([g.as_graph_element(n) for n in self._names])


@pytest.mark.parametrize("fetch", ["_release", "_gather_and_release"])
def test_the_audited_global_step_is_the_one_before_the_release(graph, fetch):
  """A step taken right after the release must not show in the value fetched by it.

  An Identity of a ref variable aliases its buffer: the fetched value is read when it is sent,
  after everything else in the run. Here a step (+5) runs in the same run, after the release.
  """
  epoch_input, _, _ = _model()
  barrier = _barrier(epoch_input, num_workers=1)
  barrier.begin()
  global_step = v1.train.get_global_step()
  parts = getattr(barrier, fetch)
  released, step = (parts[0], parts[1]) if fetch == "_release" else (parts[2], parts[3])
  with tf.control_dependencies([released]):
    later_step = v1.assign_add(global_step, 5)
  with v1.Session() as sess:
    sess.run(v1.global_variables_initializer())
    got, after = sess.run([step, later_step], {barrier._seq: 0, barrier._release_value: 0,
                                               barrier._new_completed: 0, barrier._zero: 0})
  assert (int(got), int(after)) == (0, 5)


@pytest.mark.parametrize("dtype", [tf.int64, tf.int32])  # an int32 global_step: older jobs
def test_the_release_run_computes_the_audited_step_instead_of_aliasing_it(graph, dtype):
  """The release run alone, as the chief runs it, in the graph TensorFlow really executes.

  Its graph has no assign op, so grappler rewrites `global_step + 0` (a constant zero) into an
  Identity, which aliases the ref variable: a CI run audited 171 where the checkpoint saved 169.
  """
  epoch_input, _, _ = _model()
  ref_step = v1.get_variable("ref_step", [], dtype, v1.constant_initializer(7), trainable=False,
                             use_resource=False, collections=[v1.GraphKeys.GLOBAL_VARIABLES])
  v1.get_default_graph().clear_collection(v1.GraphKeys.GLOBAL_STEP)
  v1.add_to_collection(v1.GraphKeys.GLOBAL_STEP, ref_step)  # a ref global_step, as in jobs
  barrier = _barrier(epoch_input, num_workers=2)
  barrier.begin()
  server = v1.train.Server.create_local_server()
  with v1.Session(server.target) as sess:
    sess.run(v1.global_variables_initializer())
    metadata = v1.RunMetadata()
    _, step = sess.run(barrier._release, barrier._release_feed(0),
                       options=v1.RunOptions(output_partition_graphs=True), run_metadata=metadata)
  assert step == 7
  ops = {n.name: n.op for g in metadata.partition_graphs for n in g.node}
  assert ops["epochsync_barrier/global_step_at_release"] not in ("Identity", "Snapshot"), ops


def test_exports():
  assert sorted(barrier_lib.__all__) == ["ChiefAction", "EpochBarrierHook"]


class TestEpochBarrierHookValidation:

  @pytest.fixture
  def epoch_input(self):
    return EpochInput(tf.data.Dataset.range(3), num_epochs=1)

  @pytest.mark.parametrize("kwargs,pattern", [
      (dict(num_workers=0, worker_id=0), r"num_workers=0 must be an integer >= 1"),
      (dict(num_workers=-2, worker_id=0), r"num_workers=-2 must be an integer >= 1"),
      (dict(num_workers=3, worker_id=3), r"worker_id=3 is out of range: it must be in \[0, 3\)"),
      (dict(num_workers=3, worker_id=-1), r"worker_id=-1 is out of range: it must be in \[0, 3\)"),
      (dict(num_workers=2, worker_id=0, worker_names=("chief:0", "worker:0", "worker:1")),
       r"worker_names has 3 names but num_workers=2"),
      (dict(num_workers=2, worker_id=1, worker_names=("chief:0",)),
       r"worker_names has 1 names but num_workers=2"),
      (dict(num_workers=1, worker_id=0, timeout_secs=0),
       r"timeout_secs, startup_timeout_secs, warn_after_secs and log_every_secs must be > 0 "
       r"\(--epochsync_barrier_timeout_secs"),
      (dict(num_workers=1, worker_id=0, startup_timeout_secs=-1), r"must be > 0"),
      (dict(num_workers=1, worker_id=0, warn_after_secs=0), r"must be > 0"),
      (dict(num_workers=1, worker_id=0, log_every_secs=0), r"must be > 0"),
      (dict(num_workers=1, worker_id=0, log_every_secs=0.0009),
       r"log_every_secs=0.0009 must be >= 0.001 \(--epochsync_log_every_secs\)"),
  ], ids=["no-workers", "negative-workers", "id-too-big", "id-negative", "too-many-names",
          "too-few-names", "timeout-0", "startup-negative", "warn-0", "log-every-0",
          "log-every-below-1ms"])
  def test_rejects(self, epoch_input, kwargs, pattern):
    with pytest.raises(ConfigError, match=r"^EpochBarrierHook: .*" + pattern):
      EpochBarrierHook(epoch_input, **kwargs)
    assert epoch_input.listeners == []  # a rejected hook is not registered

  def test_reports_all_problems_together(self, epoch_input):
    with pytest.raises(ConfigError) as info:
      EpochBarrierHook(epoch_input, num_workers=2, worker_id=5, worker_names=("a",),
                       timeout_secs=0)
    message = str(info.value)
    assert "worker_id=5" in message and "worker_names has 1" in message
    assert "must be > 0" in message

  def test_validates_before_any_graph_op_exists(self, epoch_input, graph):
    ops_before = len(graph.get_operations())
    barrier = EpochBarrierHook(epoch_input, num_workers=3, worker_id=2,
                               worker_names=("chief:0", "worker:0", "worker:1"))
    assert len(graph.get_operations()) == ops_before
    assert (barrier.task_name, barrier.is_chief) == ("worker:1", False)
    assert barrier.worker_names == ("chief:0", "worker:0", "worker:1")
    assert epoch_input.listeners == [barrier]

  def test_default_names_and_chief(self, epoch_input):
    barrier = EpochBarrierHook(epoch_input, num_workers=2, worker_id=0)
    assert (barrier.task_name, barrier.is_chief, barrier.worker_names) == (
        "worker:0", True, ("worker:0", "worker:1"))


class TestEpochBarrierHookChiefAlone:

  def test_passes_every_barrier_and_records_completed_epochs(self, tmp_path):
    epoch_input, train_op, total = _model(num_epochs=3)
    barrier = _barrier(epoch_input, audit_dir=str(tmp_path))
    calls = []

    def action(session, epoch, arrivals):
      completed = session.run(v1.get_default_graph().as_graph_element(
          "epochsync/completed_epochs:0"))
      calls.append((epoch, int(completed), float(session.run(total)),
                    {name: (s.epoch, s.batches, s.examples) for name, s in arrivals.items()}))
      return {"action_epoch": epoch}

    barrier.add_chief_action(action)
    final = _ReadAtEnd("epochsync/completed_epochs:0", "global_step:0")
    with v1.train.MonitoredSession(hooks=[barrier, epoch_input.hook, final]) as sess:
      assert _train(sess, train_op) == 9
    # The chief action runs once per epoch, after the epoch's last step, completed = epoch + 1.
    assert calls == [(e, e + 1, 45.0 * (e + 1), {"worker:0": (e, 3, 10)}) for e in range(3)]
    assert final.values == [3, 9]
    assert [(s.epoch, s.batches) for s in epoch_input.hook.history] == [(0, 3), (1, 3), (2, 3)]

    audit = read_audit(str(tmp_path))
    assert [line["epoch"] for line in audit] == [0, 1, 2]
    assert [line["global_step"] for line in audit] == [3, 6, 9]
    assert [line["action_epoch"] for line in audit] == [0, 1, 2]
    for line, stats in zip(audit, epoch_input.hook.history):
      assert list(line["workers"]) == ["worker:0"]
      worker = line["workers"]["worker:0"]
      assert (worker["batches"], worker["examples"]) == (3, 10)
      assert worker["started_at"] == stats.started_at
      assert worker["arrived_at"] == stats.ended_at <= line["released_at"]
      assert worker["barrier_wait_secs"] == round(line["released_at"] - stats.ended_at, 4)

  def test_empty_shard_still_passes_every_barrier(self, tmp_path):
    epoch_input, train_op, _ = _model(values=np.zeros([0], np.float32), num_epochs=2)
    barrier = _barrier(epoch_input, audit_dir=str(tmp_path))
    epochs = []
    barrier.add_chief_action(lambda session, epoch, arrivals: epochs.append(epoch))
    final = _ReadAtEnd("epochsync/completed_epochs:0")
    with v1.train.MonitoredSession(hooks=[barrier, epoch_input.hook, final]) as sess:
      assert sess.should_stop()
    assert epochs == [0, 1] and final.values == [2]
    audit = read_audit(str(tmp_path))
    assert [(line["epoch"], line["workers"]["worker:0"]["batches"],
             line["workers"]["worker:0"]["examples"]) for line in audit] == [(0, 0, 0), (1, 0, 0)]

  def test_no_audit_without_audit_dir(self, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    epoch_input, train_op, _ = _model(num_epochs=1)
    barrier = _barrier(epoch_input)
    with v1.train.MonitoredSession(hooks=[barrier, epoch_input.hook]) as sess:
      _train(sess, train_op)
    assert list(tmp_path.iterdir()) == []

  def test_a_failing_chief_action_propagates(self):
    epoch_input, train_op, _ = _model(num_epochs=2)
    barrier = _barrier(epoch_input)

    def action(session, epoch, arrivals):
      raise OSError(f"disk full in epoch {epoch}")

    barrier.add_chief_action(action)
    with pytest.raises(OSError, match="disk full in epoch 0"):
      with v1.train.MonitoredSession(hooks=[barrier, epoch_input.hook]) as sess:
        _train(sess, train_op)
    assert epoch_input.hook.history == []  # the epoch did not end

  def test_barrier_acts_after_the_done_signal(self):
    epoch_input, _, _ = _model()
    early, late = EpochListener(), EpochListener()
    early.order, late.order = 10, 30
    epoch_input.add_listener(late)
    epoch_input.add_listener(early)
    barrier = _barrier(epoch_input)
    assert epoch_input.listeners == [early, barrier, late]

  def test_restart_trains_only_the_remaining_epochs(self, tmp_path):
    model_dir = str(tmp_path)
    with tf.Graph().as_default():
      epoch_input, train_op, _ = _model(num_epochs=2)
      barrier = _barrier(epoch_input, audit_dir=model_dir)
      save = ChiefSaveAfterBarrierHook(barrier, model_dir)
      creator = v1.train.ChiefSessionCreator(checkpoint_dir=model_dir)
      with v1.train.MonitoredSession(creator, hooks=[barrier, save, epoch_input.hook]) as sess:
        assert _train(sess, train_op) == 6
      assert [s.epoch for s in epoch_input.hook.history] == [0, 1]

    with tf.Graph().as_default():  # the restarted job: a new graph restoring epoch 1's save
      epoch_input, train_op, _ = _model(num_epochs=3)
      barrier = _barrier(epoch_input, audit_dir=model_dir)
      save = ChiefSaveAfterBarrierHook(barrier, model_dir)
      created = []

      class _Start(EpochListener):
        def session_created(self, session, start_epoch):
          created.append(start_epoch)

      epoch_input.add_listener(_Start())
      final = _ReadAtEnd("epochsync/completed_epochs:0", "global_step:0", "total:0")
      creator = v1.train.ChiefSessionCreator(checkpoint_dir=model_dir)
      with v1.train.MonitoredSession(creator,
                                     hooks=[barrier, save, epoch_input.hook, final]) as sess:
        assert _train(sess, train_op) == 3
      assert [s.epoch for s in epoch_input.hook.history] == [2]
      assert created == [2]
      assert final.values == [3, 9, 3 * 45.0]
    assert [line["epoch"] for line in read_audit(model_dir)] == [0, 1, 2]

  def test_restart_after_the_last_epoch_trains_nothing(self, tmp_path):
    model_dir = str(tmp_path)
    for expected_steps in (3, 0):
      with tf.Graph().as_default():
        epoch_input, train_op, _ = _model(num_epochs=1)
        barrier = _barrier(epoch_input)
        save = ChiefSaveAfterBarrierHook(barrier, model_dir)
        creator = v1.train.ChiefSessionCreator(checkpoint_dir=model_dir)
        with v1.train.MonitoredSession(creator, hooks=[barrier, save, epoch_input.hook]) as sess:
          assert _train(sess, train_op) == expected_steps
    assert epoch_input.hook.history == [] and save.saved == {}


@pytest.mark.timeout(30, method="thread")  # a barrier that ignores its deadline hangs
class TestEpochBarrierHookTimeouts:

  FAST = dict(timeout_secs=1, startup_timeout_secs=1, warn_after_secs=0.5, log_every_secs=0.3)

  def test_chief_times_out_at_start_naming_the_missing_worker(self):
    epoch_input, _, _ = _model()
    barrier = _barrier(epoch_input, num_workers=2, worker_id=0, **self.FAST)
    start = time.monotonic()
    with pytest.raises(BarrierTimeoutError) as info:
      v1.train.MonitoredSession(hooks=[barrier, epoch_input.hook])
    elapsed = time.monotonic() - start
    assert 1 <= elapsed < 3
    assert info.value.missing == ("worker:1",)
    message = str(info.value)
    assert info.match(r'^barrier "start" timed out .* epoch 0 on worker:0: 1/2 arrived; '
                      r"missing worker:1 ")
    assert info.match(r"\(limit 1 s\)")
    assert info.match(r"\(check their logs or raise --epochsync_startup_timeout_secs\)$"), message

  @pytest.mark.parametrize("log_every_secs", [0.001, 3600])
  @pytest.mark.parametrize("worker_id,earliest,latest", [(0, 1, 2.5), (1, 3, 4.5)],
                           ids=["chief", "worker"])
  def test_the_deadline_holds_for_every_log_period(self, log_every_secs, worker_id, earliest,
                                                   latest):
    # The chief gives up at its deadline, a worker 2 s later (the chief's abort's grace).
    epoch_input, _, _ = _model(task_name=f"worker:{worker_id}")
    barrier = _barrier(epoch_input, num_workers=2, worker_id=worker_id, timeout_secs=1,
                       startup_timeout_secs=1, warn_after_secs=0.5,
                       log_every_secs=log_every_secs)
    start = time.monotonic()
    with pytest.raises(BarrierTimeoutError, match=r'^barrier "start" timed out .* 1/2 arrived'):
      v1.train.MonitoredSession(hooks=[barrier, epoch_input.hook])
    assert earliest <= time.monotonic() - start < latest

  def test_chief_names_every_missing_worker(self):
    epoch_input, _, _ = _model()
    names = ("chief:0", "worker:0", "worker:1")
    barrier = _barrier(epoch_input, num_workers=3, worker_id=0, worker_names=names, **self.FAST)
    with pytest.raises(BarrierTimeoutError,
                       match=r"on chief:0: 1/3 arrived; missing worker:0 \(not started: no "
                             r"heartbeat\), worker:1 \(not started: no heartbeat\) ") as info:
      v1.train.MonitoredSession(hooks=[barrier, epoch_input.hook])
    assert info.value.missing == ("worker:0", "worker:1")

  def test_worker_times_out_at_start_when_the_chief_never_comes(self):
    epoch_input, _, _ = _model(task_name="worker:1")
    barrier = _barrier(epoch_input, num_workers=2, worker_id=1, **self.FAST)
    start = time.monotonic()
    with pytest.raises(BarrierTimeoutError,
                       match=r'^barrier "start" timed out .* epoch 0 on worker:1: 1/2 arrived; '
                             r"missing worker:0 ") as info:
      v1.train.MonitoredSession(hooks=[barrier, epoch_input.hook])
    # A worker waits for its deadline plus a 2 s grace for the chief's abort to arrive.
    assert 3 <= time.monotonic() - start < 4.5
    assert info.value.missing == ("worker:0",)


def _run_tasks(tmp_path, shards, num_epochs, worker_steps=None, **timeouts):
  """Runs one thread per entry of `shards` ({worker_id: values}) against one in-process server.

  Task names are "chief:0", "worker:0", ...; `num_workers` is the highest id + 1, so an id
  left out of `shards` never comes. `worker_steps` ({worker_id: n}) makes that task quit
  after n steps. Returns {task name: (exception or None, history)} and the audit.
  """
  server = tf.distribute.Server.create_local_server()
  num_workers = max(shards) + 1
  names = ("chief:0",) + tuple(f"worker:{i}" for i in range(num_workers - 1))
  worker_steps = worker_steps or {}
  results = {}

  def run(worker_id, shard):
    name = names[worker_id]
    history = []
    try:
      with tf.Graph().as_default():
        epoch_input, train_op, _ = _model(values=shard, num_epochs=num_epochs, task_name=name)
        history = epoch_input.hook.history
        barrier = EpochBarrierHook(epoch_input, num_workers=num_workers, worker_id=worker_id,
                                   worker_names=names, audit_dir=str(tmp_path), ps_device=LOCAL,
                                   **timeouts)
        if worker_id == 0:
          creator = v1.train.ChiefSessionCreator(master=server.target)
        else:
          creator = FastWorkerSessionCreator(master=server.target, max_wait_secs=10,
                                             poll_secs=0.05)
        with v1.train.MonitoredSession(creator, hooks=[barrier, epoch_input.hook]) as sess:
          steps = 0
          while not sess.should_stop():
            if steps == worker_steps.get(worker_id):
              break  # the task quits mid-epoch (its session's end() then raises)
            sess.run(train_op)
            steps += 1
      results[name] = (None, history)
    except Exception as e:  # handed to the test, which asserts on it
      results[name] = (e, history)

  threads = [threading.Thread(target=run, args=(i, shard), daemon=True)
             for i, shard in shards.items()]
  for t in threads:
    t.start()
  for t in threads:
    t.join(timeout=20)
  assert not any(t.is_alive() for t in threads), "a task hung"
  return results, read_audit(str(tmp_path))


class TestEpochBarrierHookSeveralTasks:

  @pytest.mark.timeout(60, method="thread")
  def test_chief_gathers_the_worker_stats_each_epoch(self, tmp_path):
    results, audit = _run_tasks(tmp_path, {0: SHARD, 1: np.arange(5)}, num_epochs=2,
                                timeout_secs=10, startup_timeout_secs=10)
    # Both tasks were given audit_dir; one line per epoch shows that only the chief writes.
    assert results["chief:0"][0] is None and results["worker:0"][0] is None, results
    assert [(s.epoch, s.batches, s.examples) for s in results["worker:0"][1]] == [
        (0, 2, 5), (1, 2, 5)]
    assert [line["epoch"] for line in audit] == [0, 1]
    for line in audit:
      e = line["epoch"]
      workers = {w: (s["batches"], s["examples"]) for w, s in line["workers"].items()}
      assert workers == {"chief:0": (3, 10), "worker:0": (2, 5)}
      # Nobody starts epoch e+1 before everybody finished epoch e: 3 + 2 steps per epoch.
      assert line["global_step"] == 5 * (e + 1)
      assert all(s["arrived_at"] <= line["released_at"] for s in line["workers"].values())

  @pytest.mark.timeout(60, method="thread")
  def test_chief_times_out_at_epoch_end_naming_the_dead_worker(self, tmp_path):
    start = time.monotonic()
    results, audit = _run_tasks(tmp_path, {0: SHARD, 1: np.arange(5)}, num_epochs=2,
                                worker_steps={1: 1}, timeout_secs=1, startup_timeout_secs=10,
                                log_every_secs=0.3)
    error = results["chief:0"][0]
    assert isinstance(error, BarrierTimeoutError), results
    assert error.missing == ("worker:0",)
    assert re.match(r'barrier "epoch_end" timed out after 1 s, the last 1 s without progress of '
                    r"the tasks it waits for \(limit 1 s\) in epoch 0 on chief:0: 1/2 arrived; "
                    r"missing worker:0 \(no step for \d+ s, at batch [01] of epoch 0, training\) "
                    r"\(check their logs or raise --epochsync_barrier_timeout_secs\)$",
                    str(error)), str(error)
    assert isinstance(results["worker:0"][0], EpochIncompleteError), results
    assert audit == []
    assert time.monotonic() - start < 10

  @pytest.mark.timeout(60, method="thread")
  def test_names_only_the_workers_that_did_not_arrive(self, tmp_path):
    # chief:0 and worker:1 start; worker:0 never comes.
    results, audit = _run_tasks(tmp_path, {0: SHARD, 2: SHARD}, num_epochs=1,
                                startup_timeout_secs=1.5, log_every_secs=0.3)
    error = results["chief:0"][0]
    assert isinstance(error, BarrierTimeoutError), results
    assert error.missing == ("worker:0",)
    assert str(error).startswith('barrier "start" timed out after ')
    assert ("in epoch 0 on chief:0: 2/3 arrived; missing worker:0 (not started: no heartbeat) "
            "(check" in str(error))
    # The chief's abort releases the waiting worker at once, with the same diagnosis.
    error = results["worker:1"][0]
    assert isinstance(error, BarrierTimeoutError), results
    assert error.missing == ("worker:0",)
    assert ("in epoch 0 on worker:1: the chief gave up: 2/3 arrived; missing worker:0 "
            in str(error))
    assert audit == []


def _run_sessions(tasks, timeout_secs=10):
  """One thread per (worker_id, task_name, num_workers, num_epochs) against one server.

  Returns {index in `tasks`: the exception raised, or None}.
  """
  server = tf.distribute.Server.create_local_server()
  results = {}

  def run(i, worker_id, name, num_workers, num_epochs):
    try:
      with tf.Graph().as_default():
        epoch_input, train_op, _ = _model(num_epochs=num_epochs, task_name=name)
        names = ("chief:0",) + tuple(f"worker:{k}" for k in range(num_workers - 1))
        barrier = EpochBarrierHook(epoch_input, num_workers=num_workers, worker_id=worker_id,
                                   worker_names=names, ps_device=LOCAL,
                                   timeout_secs=timeout_secs, startup_timeout_secs=timeout_secs)
        creator = (v1.train.ChiefSessionCreator(master=server.target) if worker_id == 0 else
                   FastWorkerSessionCreator(master=server.target, max_wait_secs=10,
                                            poll_secs=0.05))
        with v1.train.MonitoredSession(creator, hooks=[barrier, epoch_input.hook]) as sess:
          _train(sess, train_op)
      results[i] = None
    except Exception as e:  # handed to the test, which asserts on it
      results[i] = e

  threads = [threading.Thread(target=run, args=(i,) + task, daemon=True)
             for i, task in enumerate(tasks)]
  for t in threads:
    t.start()
  for t in threads:
    t.join(timeout=30)
  assert not any(t.is_alive() for t in threads), "a task hung"
  return results


@pytest.mark.timeout(60, method="thread")
class TestEpochBarrierHookRefusesInconsistentTasks:

  def test_two_tasks_with_one_index(self):
    results = _run_sessions([(0, "chief:0", 3, 2), (1, "worker:0", 3, 2),
                             (1, "worker:0", 3, 2)])
    assert isinstance(results[0], ConfigError), results
    assert str(results[0]) == (
        "chief:0 at start of epoch 0: two tasks arrived as worker:0: check that each task has "
        "its own task index in TF_CONFIG (or --task_index)")
    # One release per worker id: one duplicate gets the refusal, the other times out (with
    # liveness probes it would name the chief, which has exited, within seconds).
    refused = [results[i] for i in (1, 2) if isinstance(results[i], ConfigError)]
    assert len(refused) == 1, results
    assert "worker:0: chief:0 refused the tasks' settings at start of epoch 0" in str(refused[0])
    assert any(isinstance(results[i], BarrierTimeoutError) for i in (1, 2)), results

  def test_tasks_started_with_different_num_epochs(self):
    results = _run_sessions([(0, "chief:0", 2, 3), (1, "worker:0", 2, 2)])
    assert isinstance(results[0], ConfigError), results
    assert ("worker:0 was started with 2 workers and num_epochs=2, chief:0 with 2 and 3: "
            "start every task with the same cluster and --epochsync_num_epochs") in str(results[0])
    assert isinstance(results[1], ConfigError), results
