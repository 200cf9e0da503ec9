"""Fault tests with TensorFlow's OWN sessions carrying epoch_sync_hooks: a dead task is named by
every survivor within seconds, never spun on in TensorFlow's session recovery.

tests/test_faults.py runs the same faults through the project's session creators. Here each
task runs tests/tasks/stock_session_task.py: `tf.compat.v1.train.MonitoredTrainingSession`
or MonitoredSession with TensorFlow's ChiefSessionCreator / WorkerSessionCreator, default
timeouts, 3 workers (worker:0 the chief) and 2 ps. The victim is SIGKILLed at a chosen point,
found from the lines the tasks print: in a step, at a barrier, during the chief's epoch save,
or during session creation at start-up.

Each fault runs once, with one of the two forms (SESSIONS: every victim and every point runs
with both): MonitoredTrainingSession builds exactly that MonitoredSession with those creators
(test_stock_session_forms.py pins it), so a fault's path is the same code with either.
"""

import collections
import os
import sys
import threading
import time

import pytest

from hooks.epoch.audit import read_audit
from hooks.testing.local_cluster import LocalCluster
from cluster_checks import assert_audit_exact, names_the_dead

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

TASK = [sys.executable, os.path.join(os.path.dirname(__file__), "tasks", "stock_session_task.py")]
DETECT_SECS = 10  # every survivor must have exited this soon after the kill
CREATE_FAILED = "CreateSession failed"


class _Lines:
  """Every task's output lines as they come (LocalCluster's on_line), to kill at a point."""

  def __init__(self):
    self._lines = collections.defaultdict(list)
    self._times = collections.defaultdict(list)  # time.monotonic() when each line came
    self._changed = threading.Condition()

  def __call__(self, task: str, line: str) -> None:
    with self._changed:
      self._lines[task].append(line)
      self._times[task].append(time.monotonic())
      self._changed.notify_all()

  def first(self, task: str, text: str) -> float:
    """When `task` printed its first line containing `text`."""
    with self._changed:
      return next(t for line, t in zip(self._lines[task], self._times[task]) if text in line)

  def wait_for(self, task: str, text: str, timeout_secs: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_secs
    with self._changed:
      while not any(text in line for line in self._lines[task]):
        left = deadline - time.monotonic()
        assert left > 0, f"{task} never printed {text!r} in {timeout_secs} s"
        self._changed.wait(left)


# point -> (command arguments, per-task arguments, [(task, line) to wait for], then sleep secs)
POINTS = {
    "step": (["--shard_batches=6,4,3", "--step_sleep_secs=0.2"], {},
             [("worker:0", "passed epoch_end, epoch 0")], 0.5),
    # worker:0 and worker:1 wait at epoch 0's end while the slow worker:2 steps alone.
    "barrier": (["--shard_batches=3,3,8", "--step_sleep_secs=0.2"],
                {"worker:2": ["--slowdown=3"]},
                [("worker:0", "waiting at epoch_end, epoch 0"),
                 ("worker:1", "waiting at epoch_end, epoch 0")], 0.3),
    # The chief's save of epoch 0 sleeps 2 s first; the workers wait for their release.
    "save": (["--shard_batches=3,3,3", "--step_sleep_secs=0.1", "--save_sleep_secs=2"], {},
             [("worker:0", "point: saving")], 0.3),
    # The chief's server is up but it creates its session 5 s late; the workers wait in
    # WorkerSessionCreator's readiness poll (30 s).
    # 2 s after the last begin(): each task's RecoveryGuardHook has probed the others.
    "startup": (["--shard_batches=3,3,3", "--nowait_for_chief"],
                {"worker:0": ["--chief_init_delay_secs=5"]},
                [(t, "point: begin") for t in ("worker:0", "worker:1", "worker:2")], 2.0),
}
# The victim at each point: a ps, the chief, a worker (one waiting there, at a barrier).
VICTIMS = {"ps": "ps:1", "chief": "worker:0", "worker": "worker:2"}
# The session form of each fault, alternating along each row and each column.
SESSIONS = {
    "ps": {"step": "mts", "barrier": "creators", "save": "mts", "startup": "creators"},
    "chief": {"step": "mts", "barrier": "creators", "save": "mts", "startup": "creators"},
    "worker": {"step": "creators", "barrier": "mts", "save": "creators", "startup": "mts"},
}
EXTRA = {("ps", "step"): ["--model=embedding"]}  # the issue's job: an embedding over both ps
# The default suite's cases: every kill point once, every victim, both session forms; the
# other 8 run with --all-variants.
DEFAULT_CASES = {("ps", "step"), ("chief", "barrier"), ("worker", "save"), ("ps", "startup")}


def _run(tmp_path, victim: str, point: str, session: str = "mts", restart: bool = False,
         extra=()):
  """Runs the job, kills `victim` at `point`; returns (kill time, results, model_dir)."""
  model_dir = str(tmp_path / "model")
  args, per_task, marks, pause = POINTS[point]
  command = TASK + [f"--model_dir={model_dir}", "--epochsync_num_epochs=3",
                    f"--session={session}", *args, *extra]
  lines = _Lines()
  with LocalCluster(num_workers=3, num_ps=2, timeout_secs=150,
                    fail_fast_secs=DETECT_SECS + 15, log_dir=str(tmp_path / "logs"),
                    on_line=lines) as cluster:
    cluster.start(command, per_task_args=per_task)
    for task, text in marks:
      lines.wait_for(task, text)
    time.sleep(pause)
    killed_at = cluster.kill_task(victim)
    if restart:
      time.sleep(0.2)
      cluster.restart_task(victim)
    result = cluster.wait()
  return killed_at, result, model_dir


def _assert_every_survivor_names(result, victim, killed_at):
  survivors = [t for name, t in result.tasks.items()
               if name != victim and not name.startswith("ps:")]
  assert len(survivors) >= 2
  for task in survivors:
    log = task.log
    assert task.returncode not in (0, None) and not task.timed_out, (
        f"{task.name} did not fail by itself ({log.count(CREATE_FAILED)} failed CreateSession "
        f"calls):\n{task.tail(30)}")
    took = task.ended_at - killed_at
    assert took < DETECT_SECS, f"{task.name} exited {took:.1f} s after the kill"
    print(f"fault: {victim} killed; {task.name} exited {took:.2f} s later "
          f"({log.count(CREATE_FAILED)} failed CreateSession calls)")
    # The victim is the dead task, or named beside it ("also gone: ...") by a task that found
    # the chief gone too (the chief exits at once when it finds the victim dead).
    assert names_the_dead(log, task.name, victim), task.tail(30)
    assert "missing worker" not in log  # nobody blames a live worker
  return survivors


@pytest.mark.timeout(200)
@pytest.mark.parametrize("kind, point, session", [
    pytest.param(kind, point, session, marks=() if (kind, point) in DEFAULT_CASES else
                 pytest.mark.variant)
    for kind, row in SESSIONS.items() for point, session in row.items()
], ids=lambda value: value)
def test_a_killed_task_is_named_by_every_survivor_with_tensorflows_own_session(
    tmp_path, kind, point, session):
  victim = VICTIMS[kind]
  if kind == "worker" and point in ("barrier", "save"):
    victim = "worker:1"  # it waits there (worker:2 steps on at the barrier)
  killed_at, result, _ = _run(tmp_path, victim, point, session=session,
                              extra=EXTRA.get((kind, point), ()))
  _assert_every_survivor_names(result, victim, killed_at)


@pytest.mark.timeout(200)
def test_a_ps_that_never_comes_up_is_named_at_the_startup_timeout(tmp_path):
  """ps:1 never serves (or died before anyone saw it up): TensorFlow's session creation would
  wait for it for ever; every training task gives up at --epochsync_startup_timeout_secs."""
  timeout = 5
  command = TASK + [f"--model_dir={tmp_path / 'model'}", "--shard_batches=3,3,3",
                    "--nowait_for_chief", f"--epochsync_startup_timeout_secs={timeout}"]
  lines = _Lines()
  with LocalCluster(num_workers=3, num_ps=2, timeout_secs=150, log_dir=str(tmp_path / "logs"),
                    fail_fast_secs=timeout + 30, on_line=lines) as cluster:
    cluster.start(command, per_task_args={"ps:1": ["--never_serve"]})
    result = cluster.wait()
  for name in cluster.training_task_names:
    task = result.tasks[name]
    assert task.returncode not in (0, None) and not task.timed_out, task.tail(30)
    took = task.ended_at - lines.first(name, "point: begin")
    assert timeout <= took < timeout + 5, f"{name} exited {took:.1f} s after its begin()"
    print(f"fault: ps:1 never up; {name} exited {took:.2f} s after its begin()")
    assert (f"{name} gave up creating its session after {timeout} s: ps:1 never came up"
            in task.log and "StartupTimeoutError" in task.log), task.tail(30)


@pytest.mark.timeout(200)
def test_a_restarted_ps_is_named_and_never_reinitialised_into_the_running_job(tmp_path):
  """ps:1 is killed in epoch 1 and restarted at once at its address (as Kubernetes would), its
  variables gone: TensorFlow's recovery would re-create the sessions on it (the chief restoring
  the last checkpoint) and train on; instead every training task names ps:1 and fails."""
  killed_at, result, model_dir = _run(tmp_path, "ps:1", "step", restart=True)
  _assert_every_survivor_names(result, "ps:1", killed_at)
  assert [line["epoch"] for line in read_audit(model_dir)] == [0]
  for task in result.tasks.values():
    if not task.name.startswith("ps:"):
      assert "passed epoch_end, epoch 1" not in task.log, task.tail(30)


@pytest.mark.timeout(200)
def test_a_healthy_job_trains_every_epoch_exactly_and_every_task_exits_0(tmp_path):
  """No fault: the guard never ends a task, also while the tasks finish at different times."""
  model_dir, shards = str(tmp_path / "model"), (3, 2, 0)
  command = TASK + [f"--model_dir={model_dir}", "--epochsync_num_epochs=2",
                    "--shard_batches=" + ",".join(map(str, shards))]
  with LocalCluster(num_workers=3, num_ps=2, timeout_secs=150,
                    log_dir=str(tmp_path / "logs")) as cluster:
    cluster.start(command)
    result = cluster.wait()
  result.check()
  for task in result.tasks.values():
    assert "ends this process" not in task.log and "TaskDiedError" not in task.log, task.tail()
    assert "point: done" in task.log
  assert_audit_exact(model_dir, ["worker:0", "worker:1", "worker:2"], shards, 2, sync=True)
