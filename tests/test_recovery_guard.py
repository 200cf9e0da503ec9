"""Tests for hooks/faults/recovery_guard.py: TensorFlow's own session recovery never resumes an
epoch-synchronized task, nor spins on a dead task; in-process, with an injected exit."""

import os
import sys
import threading
import time

import pytest
import tensorflow as tf

import hooks
from hooks import graph_keys
from hooks.faults import recovery_guard
from hooks.faults import process_exit as recovery_stack
from hooks.errors import EpochSyncError, TaskDiedError
from hooks.faults.liveness import LivenessMonitor, Probe
from hooks.faults.recovery_guard import RecoveryGuardHook
from hooks.faults.step_retry import retry_duplicate_steps
from hooks.faults.stuck_step import StuckStepWatchdog
from tf_unit import graph, v1  # noqa: F401  (graph: a fresh graph per test)

ADDRESSES = {"worker:0": "w0", "ps:0": "p0", "ps:1": "p1"}
GRACE = 0.3


def test_exports():
  assert sorted(recovery_guard.__all__) == ["EXIT_STATUS", "GRACE_SECS", "RecoveryGuardHook"]


class _Cluster:
  """Probe answers by address; `exits` records the guard's exit statuses (and when)."""

  def __init__(self):
    self.answers = {a: Probe("up", 10 + i) for i, a in enumerate(ADDRESSES.values())}
    self.exits, self.caps = [], []
    self.exited = threading.Event()

  def probe(self, address, timeout):
    return self.answers[address]

  def kill(self, name, restart=False):
    self.answers[ADDRESSES[name]] = (Probe("up", 99) if restart else
                                     Probe("down", None, "UNAVAILABLE: Connection refused"))

  def exit(self, status):
    self.exits.append((status, time.monotonic()))
    self.exited.set()

  def guard(self, grace=GRACE, **kwargs):
    monitor = LivenessMonitor(ADDRESSES, "worker:0", probe=self.probe)
    monitor.probe(sorted(ADDRESSES))  # as the start barrier: every task's first answer
    return RecoveryGuardHook(monitor, "worker:0", sorted(ADDRESSES), grace_secs=grace,
                             exit_fn=self.exit, cap_fn=self.caps.append, **kwargs)


class _LoseSession(v1.train.SessionRunHook):
  """Raises UnavailableError from the first step (TensorFlow then re-creates the session)."""

  def __init__(self, before=lambda: None, error=None, after_steps=0):
    self._before, self.lost = before, False
    self._error = error or tf.errors.UnavailableError(None, None, "the ps went away")
    self._steps = after_steps

  def after_run(self, run_context, run_values):
    self._steps -= 1
    if not self.lost and self._steps < 0:
      self.lost = True
      self._before()
      raise self._error


class _FailingCreator(v1.train.SessionCreator):
  """A real session first (unless `first=False`); then UNAVAILABLE every 10 ms, as
  CreateSession against a dead ps, until the guard has ended the "process" (then a RuntimeError
  ends the test's session) or `give_up_secs` passed (the guard never ended it)."""

  def __init__(self, cluster, first=True, give_up_secs=8.0):
    self._cluster, self._first, self.calls = cluster, first, 0
    self._deadline = time.monotonic() + give_up_secs

  def create_session(self):
    self.calls += 1
    if self.calls == 1 and self._first:
      return v1.train.ChiefSessionCreator().create_session()
    if self._cluster.exited.wait(0.01):
      raise RuntimeError("the process would have ended here")
    if time.monotonic() > self._deadline:
      raise RuntimeError("the guard never ended the process")
    raise tf.errors.UnavailableError(None, None, "CreateSession failed: ps:1 UNAVAILABLE")


class _StopThroughTheCoordinator(v1.train.SessionRunHook):
  """After the first step: ps:1 dies and a stop is requested with TaskDiedError through the
  coordinator, as the sync hook's threads do (the step itself ended normally)."""

  def __init__(self, cluster, kill=True):
    self._cluster, self._coord, self._kill = cluster, None, kill

  def after_create_session(self, session, coord):
    self._coord = coord

  def after_run(self, run_context, run_values):
    if not self._coord.should_stop():
      if self._kill:
        self._cluster.kill("ps:1")
      error = TaskDiedError("ps:1 died while worker:0 waited for it while aggregating the "
                            "gradients", "ps:1", "while aggregating the gradients")
      self._coord.request_stop((TaskDiedError, error, None))


class _StuckEnd(v1.train.SessionRunHook):
  """An end() that waits for the dead ps (as a checkpoint save would) until the process ends."""

  def __init__(self, cluster):
    self._cluster, self.started = cluster, None

  def end(self, session):
    self.started = time.monotonic()
    self._cluster.exited.wait(8.0)


def _step():
  return v1.assign_add(v1.train.get_or_create_global_step(), 1)


class TestRecreatedSession:

  def test_a_session_on_a_restarted_ps_is_refused_naming_it(self):
    cluster = _Cluster()
    guard = cluster.guard()
    lose = _LoseSession(before=lambda: cluster.kill("ps:1", restart=True))
    step = _step()
    with pytest.raises(TaskDiedError, match=r"^ps:1 died while worker:0 waited for it when "
                       r"TensorFlow's MonitoredSession re-created its lost session: it "
                       r"restarted") as info:
      with v1.train.MonitoredSession(hooks=[guard, lose]) as sess:
        sess.run(step)  # TensorFlow re-creates the session, here on the "restarted" ps
    assert info.value.task == "ps:1" and lose.lost
    assert not cluster.exits

  def test_a_recreated_session_without_a_dead_task_is_refused(self):
    cluster, step = _Cluster(), _step()
    with pytest.raises(EpochSyncError, match=r"re-created its lost session .* cannot resume on "
                                             r"one task alone: restart the whole job"):
      with v1.train.MonitoredSession(hooks=[cluster.guard(), _LoseSession()]) as sess:
        sess.run(step)


  def test_the_error_tensorflow_recovered_from_is_logged_at_warning_with_task_and_step(
      self, caplog):
    """A transient ABORTED with every task alive: the WARNING names the task, its steps, the
    global step and TensorFlow's error, and the refusal says every task was alive."""
    cluster, step = _Cluster(), _step()
    twice = _LoseSession(error=tf.errors.AbortedError(
        None, None, "From /job:ps/replica:0/task:0: The same RunGraph (Worker) request was "
        "received twice. graph_handle: \"000000000000000a\""), after_steps=3)
    verbosity = v1.logging.get_verbosity()
    v1.logging.set_verbosity(v1.logging.INFO)  # as under absl.app.run: TF logs the error
    try:
      with pytest.raises(EpochSyncError, match=r"\(lost in step 4 of this task\), every task "
                         r"still alive .*transient error: .*received twice"):
        with v1.train.MonitoredSession(hooks=[cluster.guard(), twice]) as sess:
          for _ in range(4):
            sess.run(step)
    finally:
      v1.logging.set_verbosity(verbosity)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any("worker:0: TensorFlow's MonitoredSession lost its session in step 4 of this "
               "task (global step 0) and re-created it; the error: "
               "From /job:ps/replica:0/task:0: The same RunGraph (Worker) request was received "
               "twice" in w for w in warnings), warnings


def _twice(task):
  return tf.errors.AbortedError(
      None, None, f"Graph execution error:\n\nABORTED: From /job:{task.split(':')[0]}/replica:0/"
      f"task:{task.split(':')[1]}:\nThe same RunGraph (Worker) request was received twice. "
      'graph_handle: "000000000000000c" step_id: 4935712576186045')


class _RejectOnce(v1.train.SessionRunHook):
  """Makes the raw session's `at`-th step fail with `error` before it runs anything (as a
  task that rejects a duplicate RunGraph request); goes BEFORE the guard."""

  def __init__(self, error, at=2):
    self._error, self._at, self.rejected = error, at, 0

  def after_create_session(self, session, coord):
    run, calls = session.run, [0]

    def failing_run(*args, **kwargs):
      calls[0] += 1
      if calls[0] == self._at:
        self.rejected += 1
        raise self._error
      return run(*args, **kwargs)
    session.run = failing_run


class TestDuplicateRequest:

  def test_a_step_its_own_task_rejected_as_a_duplicate_is_retried_once_and_logged(
      self, caplog):
    cluster, step = _Cluster(), _step()
    reject = _RejectOnce(_twice("worker:0"), at=3)
    with v1.train.MonitoredSession(hooks=[reject, cluster.guard()]) as sess:
      values = [sess.run(step) for _ in range(4)]
    assert values == [1, 2, 3, 4] and reject.rejected == 1  # each step's update exactly once
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any(w.startswith("worker:0: step 3 of this task was rejected by worker:0 as a "
                            "duplicate RunGraph request") and "retry 1 of 3" in w
               and "received twice" in w for w in warnings), warnings
    assert not cluster.exits

  def test_a_step_only_a_ps_rejected_is_not_retried_and_the_job_ends_naming_it(self):
    cluster, step = _Cluster(), _step()
    reject = _RejectOnce(_twice("ps:0"))
    with pytest.raises(EpochSyncError, match=r"every task still alive"):
      with v1.train.MonitoredSession(hooks=[reject, cluster.guard()]) as sess:
        for _ in range(3):
          sess.run(step)
    assert reject.rejected == 1

  def test_a_step_a_gated_ps_rejected_is_retried_once(self, caplog):
    cluster, step = _Cluster(), _step()
    v1.add_to_collection(graph_keys.GATED_TASKS, "ps:0")  # EpochInput's step_gate did it
    reject = _RejectOnce(_twice("ps:0"), at=2)
    with v1.train.MonitoredSession(hooks=[reject, cluster.guard()]) as sess:
      values = [sess.run(step) for _ in range(3)]
    assert values == [1, 2, 3] and reject.rejected == 1
    assert "step 2 of this task was rejected by ps:0 as a duplicate" in caplog.text

  def test_a_run_of_a_hook_is_retried_only_when_a_ps_rejected_it(self):
    calls = []

    def run(*args, **kwargs):
      calls.append(args)
      if len(calls) == 1:
        raise _twice("ps:0")
      if len(calls) == 2:
        return "ok"
      raise _twice("worker:0")

    session = type("Session", (), {})()
    session.run = run
    retry_duplicate_steps(session, "worker:0")
    assert session.run("x") == "ok" and len(calls) == 2  # called from here: a hook's run
    with pytest.raises(tf.errors.AbortedError):
      session.run("x")
    assert len(calls) == 3


class _LoseOnce(v1.train.SessionRunHook):
  """Makes the raw session's `at`-th step a run TensorFlow lost: it never returns and runs
  nothing (its marker stays behind), as a run rejected on this task whose cancellation never
  reached the others; `released` lets it return at the test's end (`value`: as done)."""

  def __init__(self, at=3, times=1, value=False):
    self._at, self._times, self._value = at, times, value
    self.lost, self.released = 0, threading.Event()

  def after_create_session(self, session, coord):
    run, calls = session.run, [0]

    def losing_run(*args, **kwargs):
      if not kwargs.get("feed_dict"):  # not a step (they feed the marker): the watchdog's probe
        return run(*args, **kwargs)
      calls[0] += 1
      if self._at <= calls[0] < self._at + self._times:
        self.lost += 1
        self.released.wait(30)
        if not self._value:
          raise tf.errors.CancelledError(None, None, "the lost run, cancelled at last")
      return run(*args, **kwargs)
    session.run = losing_run


class _LocalWatchdog(StuckStepWatchdog):
  """Its step marker on this process's own device (the guard asks for /job:worker/task:0)."""

  def build(self, device):
    super().build("/cpu:0")


class TestLostRun:
  """A step TensorFlow lost (its part here never started) is left behind and run again."""

  def _guard(self, cluster):
    watchdog = _LocalWatchdog("worker:0", lost_after_secs=0.5, exit_fn=cluster.exit)
    return cluster.guard(stuck_step=watchdog), watchdog

  def test_a_lost_step_runs_again_once_and_the_session_is_left_open(self, caplog):
    caplog.set_level("INFO", logger="tensorflow")
    cluster, step = _Cluster(), _step()
    lose = _LoseOnce(at=3)
    guard, watchdog = self._guard(cluster)
    with v1.train.MonitoredSession(hooks=[lose, guard]) as sess:
      values = [sess.run(step) for _ in range(4)]
    assert values == [1, 2, 3, 4] and lose.lost == 1  # each step's update exactly once
    assert watchdog.lost_runs_left_behind == 1 and not cluster.exits
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any(w.startswith("worker:0: step 3 of this task has been in TensorFlow's "
                            "session.run for") and "its part on this task never started" in w
               and "runs again (retry 1 of 3)" in w for w in warnings), warnings
    assert "leaves its session open: 1 lost run(s) left behind" in caplog.text
    lose.released.set()  # the lost run ends with an error: nothing to do
    time.sleep(0.2)
    assert not cluster.exits

  def test_a_step_lost_more_than_max_lost_times_ends_the_process(self, caplog):
    from hooks.faults.stuck_step import MAX_LOST  # pylint: disable=import-outside-toplevel
    cluster, step = _Cluster(), _step()
    lose = _LoseOnce(at=2, times=MAX_LOST + 1)
    guard, _ = self._guard(cluster)
    session = v1.train.MonitoredSession(hooks=[lose, guard])
    session.run(step)
    failed = []

    def second_step():  # the "process" ends in it (its last run raises once released)
      try:
        session.run(step)
      except tf.errors.OpError as e:
        failed.append(e)
    threading.Thread(target=second_step, daemon=True).start()
    assert cluster.exited.wait(10)
    assert lose.lost == MAX_LOST + 1 and [s for s, _ in cluster.exits] == [1]
    assert f"The step was lost {MAX_LOST + 1} times; this process ends now" in caplog.text
    lose.released.set()

  def test_a_run_left_behind_that_comes_back_done_ends_the_process(self, caplog):
    cluster, step = _Cluster(), _step()
    lose = _LoseOnce(at=2, value=True)
    guard, _ = self._guard(cluster)
    with v1.train.MonitoredSession(hooks=[lose, guard]) as sess:
      values = [sess.run(step) for _ in range(3)]
      assert values == [1, 2, 3] and not cluster.exits
      lose.released.set()  # it ran after all: its step may be in the model twice
      assert cluster.exited.wait(5)
    assert "came back done, after the step ran again" in caplog.text


def test_a_step_is_retryable_only_when_every_rejecting_task_is_its_own_or_gated():
  from hooks.faults.step_retry import rejecting_tasks, step_retryable  # pylint: disable=import-outside-toplevel
  both = tf.errors.AbortedError(None, None, _twice("ps:1").message + "\n" +
                                _twice("worker:0").message)
  assert rejecting_tasks(both) == {"ps:1", "worker:0"}
  assert step_retryable(both, "worker:0", ["ps:0", "ps:1"])
  assert not step_retryable(both, "worker:0", ["ps:0"])  # ps:1 not gated: the batch may be gone
  assert not step_retryable(_twice("ps:0"), "worker:0", [])
  assert not step_retryable(tf.errors.AbortedError(None, None, "ABORTED: other"), "worker:0",
                            ["ps:0"])


def test_a_hooks_run_is_retryable_only_when_a_ps_rejected_it():
  from hooks.faults.step_retry import run_retryable  # pylint: disable=import-outside-toplevel
  assert run_retryable(_twice("ps:0"), "worker:0")
  # This task alone: the ps part ran (e.g. a barrier arrival), only the fetched result was lost.
  assert not run_retryable(_twice("worker:0"), "worker:0")
  assert not run_retryable(tf.errors.AbortedError(None, None, "ABORTED: other"), "worker:0")


def test_only_a_rejection_by_this_tasks_own_partition_counts():
  from hooks.faults.step_retry import rejected_by_own_task  # pylint: disable=import-outside-toplevel
  own = _twice("worker:1").message
  assert rejected_by_own_task(tf.errors.AbortedError(None, None, own), "worker:1")
  assert rejected_by_own_task(tf.errors.CancelledError(None, None, own), "worker:1")
  assert not rejected_by_own_task(tf.errors.AbortedError(None, None, own), "worker:11")
  assert not rejected_by_own_task(tf.errors.AbortedError(None, None, own), "ps:1")
  assert not rejected_by_own_task(tf.errors.UnavailableError(None, None, own), "worker:1")


class TestWatcher:

  def test_recovery_spinning_on_a_dead_ps_ends_the_process_after_the_grace(self, caplog):
    cluster = _Cluster()
    killed = []
    lose = _LoseSession(before=lambda: (cluster.kill("ps:1"), killed.append(time.monotonic())))
    creator, step = _FailingCreator(cluster), _step()
    with pytest.raises(RuntimeError, match="would have ended"):
      with v1.train.MonitoredSession(creator, hooks=[cluster.guard(), lose]) as sess:
        sess.run(step)
    assert [status for status, _ in cluster.exits] == [recovery_guard.EXIT_STATUS]
    took = cluster.exits[0][1] - killed[0]
    assert GRACE <= took < GRACE + 3.0, took
    assert creator.calls > 10  # it did spin until then
    assert ("ps:1 died while worker:0 waited for it in TensorFlow's session recovery "
            "(MonitoredSession re-creating or closing its session): its server at p1 is gone"
            in caplog.text)
    assert "worker:0 ends this process with exit status 1 (TaskDiedError above)" in caplog.text

  def test_a_ps_never_seen_up_here_that_dies_in_a_recovery_is_named(self, caplog):
    """No probe of this process ever got ps:1's answer in time (a loaded machine), but a session
    reached it: found down in a recovery, it has died (the old watcher waited for ever)."""
    cluster = _Cluster()
    cluster.answers["p1"] = Probe("busy", None, "DEADLINE_EXCEEDED")
    lose = _LoseSession(before=lambda: cluster.kill("ps:1"))
    creator, step = _FailingCreator(cluster), _step()
    with pytest.raises(RuntimeError, match="would have ended"):
      with v1.train.MonitoredSession(creator, hooks=[cluster.guard(), lose]) as sess:
        sess.run(step)
    assert [status for status, _ in cluster.exits] == [recovery_guard.EXIT_STATUS]
    assert ("ps:1 died while worker:0 waited for it in TensorFlow's session recovery"
            in caplog.text)

  def test_a_probe_that_raises_does_not_end_the_watcher(self, caplog):
    """A probe's own error (here a malformed answer) is logged; the watcher probes on and
    still ends the spinning recovery (the old one died with it, silently)."""
    cluster, raised = _Cluster(), []

    def probe(address, timeout):
      if cluster.answers["p1"].state == "down" and not raised:
        raised.append(address)
        raise ValueError("malformed varint in GetStatusResponse")
      return cluster.answers[address]

    cluster.probe = probe
    lose = _LoseSession(before=lambda: cluster.kill("ps:1"))
    creator, step = _FailingCreator(cluster), _step()
    with pytest.raises(RuntimeError, match="would have ended"):
      with v1.train.MonitoredSession(creator, hooks=[cluster.guard(), lose]) as sess:
        sess.run(step)
    assert raised and [status for status, _ in cluster.exits] == [recovery_guard.EXIT_STATUS]
    assert ("worker:0: probing the tasks failed (ValueError: malformed varint in "
            "GetStatusResponse)" in caplog.text)

  def test_a_healthy_run_and_its_end_never_exit(self):
    cluster = _Cluster()
    guard, step = cluster.guard(), _step()
    with v1.train.MonitoredSession(hooks=[guard]) as sess:
      for _ in range(3):
        sess.run(step)
      cluster.kill("ps:1")  # dead while the session is live: the hooks' own waits name it
      time.sleep(3 * GRACE)
    guard._thread.join(2.0)
    assert not guard._thread.is_alive() and not cluster.exits

  def test_a_session_ended_by_an_error_is_not_ended_again(self):
    cluster = _Cluster()
    guard, step = cluster.guard(), _step()
    with pytest.raises(ValueError):
      with v1.train.MonitoredSession(hooks=[guard]) as sess:
        sess.run(step)
        raise ValueError("the user's own error")
    cluster.kill("ps:1")
    guard._thread.join(2.0)
    assert not guard._thread.is_alive()
    time.sleep(2 * GRACE)
    assert not cluster.exits
    guard.at_exit()  # the interpreter exits: TensorFlow's teardown would wait for the dead ps
    assert cluster.caps == [GRACE] and not cluster.exits

  def test_an_error_requested_through_the_coordinator_keeps_the_watcher_armed(self, caplog):
    """A hook's thread (as the sync hook's aggregation) finds ps:1 dead and requests a stop
    with TaskDiedError; MonitoredSession's should_stop() swallows it, so the session ends
    through every hook's end() and its close. A later end() held by the dead ps (here a hook
    outside tf-epochsync) is ended by the watcher (the old guard stopped watching in its own
    end()), and the cap at exit stays armed."""
    cluster = _Cluster()
    guard, stuck, step = cluster.guard(), _StuckEnd(cluster), _step()
    with pytest.raises(TaskDiedError, match="^ps:1 died"):  # the coordinator's, from close()
      with v1.train.MonitoredSession(hooks=[guard, _StopThroughTheCoordinator(cluster),
                                            stuck]) as sess:
        while not sess.should_stop():
          sess.run(step)
    assert [status for status, _ in cluster.exits] == [recovery_guard.EXIT_STATUS]
    assert GRACE <= cluster.exits[0][1] - stuck.started < GRACE + 3.0
    assert "worker:0 ends this process with exit status 1" in caplog.text

  def test_an_error_requested_through_the_coordinator_keeps_the_cap_at_exit(self):
    """The same stop with a quick close: the interpreter's exit follows, and TensorFlow's
    teardown of a session spanning the dead ps is capped (the old guard's end() disarmed it)."""
    cluster = _Cluster()
    guard, step = cluster.guard(), _step()
    with pytest.raises(TaskDiedError, match="^ps:1 died"):
      with v1.train.MonitoredSession(
          hooks=[guard, _StopThroughTheCoordinator(cluster, kill=False)]) as sess:
        while not sess.should_stop():
          sess.run(step)
    cluster.kill("ps:1")  # found at exit (killed earlier, the close might outlast the grace)
    guard._thread.join(2.0)
    assert not guard._thread.is_alive() and not cluster.exits
    guard.at_exit()
    assert cluster.caps == [GRACE] and not cluster.exits

  def test_at_exit_after_a_normal_end_or_with_every_task_alive_does_nothing(self):
    cluster = _Cluster()
    ended, lost = cluster.guard(), cluster.guard()
    step = _step()
    with v1.train.MonitoredSession(hooks=[ended]) as sess:
      sess.run(step)
    with pytest.raises(ValueError):
      with v1.train.MonitoredSession(hooks=[lost]) as sess:
        raise ValueError("the user's own error")
    lost.at_exit()  # every task alive
    cluster.kill("ps:1")
    ended.at_exit()  # ended normally
    assert not cluster.exits and not cluster.caps

  def test_begin_outside_a_monitored_session_starts_no_thread(self):
    guard = _Cluster().guard()
    guard.begin()
    assert guard._thread is None


class TestStartup:
  """TensorFlow's first session creation waits without a deadline for a task never up."""

  def test_a_ps_that_never_comes_up_ends_the_process_at_the_startup_timeout(self, caplog):
    cluster = _Cluster()
    cluster.kill("ps:1")  # it never answers (or died before any probe reached it)
    guard = cluster.guard(startup_timeout_secs=0.5)
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="would have ended"):
      v1.train.MonitoredSession(_FailingCreator(cluster, first=False), hooks=[guard])
    assert [status for status, _ in cluster.exits] == [recovery_guard.EXIT_STATUS]
    assert 0.5 <= cluster.exits[0][1] - start < 3.5
    assert ("worker:0 gave up creating its session after 0.5 s: ps:1 never came up "
            "(TensorFlow's session creation waits for it without a deadline); start it, check "
            "the addresses in TF_CONFIG, or raise --epochsync_startup_timeout_secs"
            in caplog.text)
    assert "worker:0 ends this process with exit status 1 (StartupTimeoutError above)" in (
        caplog.text)

  def test_a_slow_creation_with_every_needed_task_up_is_never_ended(self):
    cluster = _Cluster()
    guard = cluster.guard(startup_timeout_secs=0.3)
    with pytest.raises(RuntimeError, match="never ended"):
      v1.train.MonitoredSession(_FailingCreator(cluster, first=False, give_up_secs=1.5),
                                hooks=[guard])
    assert not cluster.exits


def _compiled(filename, name, body):
  """A function `name(callback)` whose frame claims to come from `filename`."""
  scope = {}
  exec(compile(f"def {name}(callback):\n  {body}\n", filename, "exec"), scope)  # pylint: disable=exec-used
  return scope[name]


class TestWhere:
  """Which code holds the session's thread: TensorFlow's recovery, or tf-epochsync's code."""

  TF = os.path.join("site-packages", "tensorflow", "python", "training", "monitored_session.py")
  OURS = os.path.join(os.path.dirname(hooks.__file__), "session.py")

  def _stack(self, *calls):
    """Calls the functions outermost first; returns _where() of the innermost frame."""
    functions = [_compiled(path, name, "return callback()") for path, name in calls]
    call = lambda: recovery_stack.where(sys._getframe())
    for function in reversed(functions):
      call = (lambda f, inner: lambda: f(inner))(function, call)
    return call()

  def test_tensorflows_recovery_loop_holds_it(self):
    assert self._stack((self.TF, "_create_session"), (self.TF, "create_session")) == (True, True)

  def test_tf_epochsyncs_creator_or_hook_below_it_holds_it(self):
    assert self._stack((self.TF, "_create_session"), (self.OURS, "create_session")) == (
        False, True)

  def test_a_live_session_in_user_code(self):
    assert self._stack((self.TF, "run"), ("train.py", "step")) == (False, True)
    assert self._stack(("train.py", "main"),) == (False, False)
