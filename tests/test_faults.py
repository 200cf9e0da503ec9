"""Fault tests on real clusters: a dead task is named by every survivor within seconds, a slow
one is waited for without a false alarm.

The jobs run with the default timeouts (step 600 s, barrier 1800 s, start-up 600 s): a task
that is gone must be known as gone through liveness probes, not through a timeout.
"""

import os
import re
import sys
import time

import pytest

from hooks.epoch.audit import read_audit
from hooks.testing.local_cluster import LocalCluster
from cluster_checks import assert_equals_oracle, names_the_dead, wait_for_epochs

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

TASK = [sys.executable, os.path.join(os.path.dirname(__file__), "tasks", "epoch_task.py")]
DETECT_SECS = 10  # every survivor must have exited this soon after the kill


def _kill_mid_epoch(tmp_path, victim, sync=True, num_ps=1, has_chief=False, shards=(8, 5, 3)):
  """Kills `victim` in the middle of epoch 1; returns (kill time, result, model_dir)."""
  model_dir = str(tmp_path / "model")
  command = TASK + [f"--model_dir={model_dir}", "--shard_batches=" + ",".join(map(str, shards)),
                    "--epochsync_num_epochs=3", f"--epochsync_sync={sync}",
                    "--step_sleep_secs=0.25"]
  num_workers = len(shards)
  with LocalCluster(num_workers=num_workers, num_ps=num_ps, has_chief=has_chief,
                    timeout_secs=120, fail_fast_secs=DETECT_SECS + 15,
                    log_dir=str(tmp_path / "logs")) as cluster:
    cluster.start(command)
    wait_for_epochs(model_dir, 1)
    time.sleep(0.6)  # inside epoch 1 (an epoch lasts about 2 s)
    killed_at = cluster.kill_task(victim)
    result = cluster.wait()
  return killed_at, result, model_dir


def _assert_every_survivor_names(result, victim, killed_at):
  survivors = [t for name, t in result.tasks.items() if name != victim and not
               name.startswith("ps:")]
  assert survivors
  for task in survivors:
    assert task.returncode not in (0, None) and not task.timed_out, (
        f"{task.name} did not fail by itself:\n{task.tail()}")
    assert task.ended_at - killed_at < DETECT_SECS, (
        f"{task.name} exited {task.ended_at - killed_at:.1f} s after the kill")
    print(f"fault: {victim} killed; {task.name} exited {task.ended_at - killed_at:.2f} s later")
    log = task.log
    assert names_the_dead(log, task.name, victim), task.tail(30)
    assert "StepTimeoutError" not in log and "BarrierTimeoutError" not in log
    assert "missing worker" not in log  # nobody blames a live worker
  return survivors


@pytest.mark.timeout(180)
@pytest.mark.parametrize("victim,sync", [("worker:2", True), ("worker:2", False),
                                         pytest.param("worker:0", True, marks=pytest.mark.variant)],
                         ids=["worker-sync", "worker-async", "chief-sync"])
def test_a_killed_training_task_is_named_by_every_survivor(tmp_path, victim, sync):
  killed_at, result, model_dir = _kill_mid_epoch(tmp_path, victim, sync=sync)
  _assert_every_survivor_names(result, victim, killed_at)
  assert [line["epoch"] for line in read_audit(model_dir)] == [0]


@pytest.mark.timeout(180)
def test_a_killed_ps_is_named_by_every_task_the_chief_included(tmp_path):
  killed_at, result, model_dir = _kill_mid_epoch(tmp_path, "ps:1", num_ps=2, has_chief=True,
                                                 shards=(8, 5, 3, 4))
  survivors = _assert_every_survivor_names(result, "ps:1", killed_at)
  assert "chief:0" in [t.name for t in survivors]


@pytest.mark.timeout(120)
def test_a_ps_that_never_comes_up_fails_startup_naming_it(tmp_path):
  model_dir = str(tmp_path / "model")
  command = TASK + [f"--model_dir={model_dir}", "--shard_batches=2,2",
                    "--epochsync_startup_timeout_secs=5"]
  start = time.monotonic()
  with LocalCluster(num_workers=2, num_ps=2, timeout_secs=60, fail_fast_secs=30,
                    log_dir=str(tmp_path / "logs")) as cluster:
    cluster.start(command, per_task_args={"ps:1": ["--never_serve"]})
    result = cluster.wait()
  for name in ("worker:0", "worker:1"):
    task = result.tasks[name]
    assert task.returncode not in (0, None) and not task.timed_out, task.tail()
    assert task.ended_at - start < 5 + 20  # its own 5 s deadline, plus the processes' start
    assert "StartupTimeoutError" in task.log and "ps:1 never came up" in task.log, task.tail()


SLOW_STEP_SECS, SLOWDOWN, SLOW_BATCHES = 0.25, 5, 4  # worker:2 sleeps 1.25 s per step, others 0.25


@pytest.mark.timeout(180)
@pytest.mark.parametrize("sync", [pytest.param(False, marks=pytest.mark.variant), True],
                         ids=["async", "sync"])
def test_a_5x_slower_worker_is_waited_for_and_named_without_a_false_alarm(tmp_path, sync):
  """Default timeouts, liveness probes on: the epoch completes, the wait is where it should be.

  Asynchronous: the fast workers finish their shard first and wait at the epoch_end barrier
  about the slow one's extra time, logging every second that worker:2 is missing. Synchronous:
  every step waits for worker:2's gradient, so the fast workers' epochs take as long as the
  slow one's, they wait at the barrier only its last step's extra sleep, and their steps warn
  that worker:2 is missing. Nobody raises TaskDiedError or a timeout.
  """
  model_dir = str(tmp_path / "model")
  shards = [SLOW_BATCHES] * 3
  command = TASK + [f"--model_dir={model_dir}", "--shard_batches=" + ",".join(map(str, shards)),
                    "--epochsync_num_epochs=2", f"--epochsync_sync={sync}",
                    f"--step_sleep_secs={SLOW_STEP_SECS}", "--epochsync_log_every_secs=1",
                    "--epochsync_warn_after_secs=0.5"]  # logging only; the timeouts are default
  with LocalCluster(num_workers=3, timeout_secs=120, log_dir=str(tmp_path / "logs")) as cluster:
    cluster.start(command, per_task_args={"worker:2": [f"--slowdown={SLOWDOWN}"]})
    result = cluster.wait()
  result.check()
  for task in result.tasks.values():
    for alarm in ("TaskDiedError", "StepTimeoutError", "BarrierTimeoutError", "Traceback"):
      assert alarm not in task.log, f"{task.name}: false alarm {alarm}:\n{task.tail(30)}"

  audit = read_audit(model_dir)
  assert [line["epoch"] for line in audit] == [0, 1]
  slow_extra = SLOW_STEP_SECS * (SLOWDOWN - 1)  # per step
  for line in audit:
    workers = line["workers"]
    assert {w: s["batches"] for w, s in workers.items()} == dict.fromkeys(workers, SLOW_BATCHES)
    waits = {w: s["barrier_wait_secs"] for w, s in workers.items()}
    assert waits["worker:2"] < 1.0, f"the slow worker waited at the barrier: {waits}"
    # Async: the slow worker's whole extra epoch time; sync: only its last step's extra sleep
    # (every earlier step already waited for it).
    expected = slow_extra * (1 if sync else SLOW_BATCHES)
    for fast in ("worker:0", "worker:1"):
      assert 0.5 * expected <= waits[fast] <= expected + 3.0, (
          f"epoch {line['epoch']}: {fast} waited {waits[fast]} s at the barrier, expected about "
          f"{expected} s: {waits}")
      if sync:  # paced by the slow worker's steps
        took = workers[fast]["arrived_at"] - workers[fast]["started_at"]
        assert took >= (SLOW_BATCHES - 1) * SLOW_STEP_SECS * SLOWDOWN, (fast, took)

  for fast in ("worker:0", "worker:1"):
    log = result.tasks[fast].log
    if sync:
      pattern = (rf"{fast} has waited \d+ s for step \d+: 2/3 workers sent their gradient; "
                 r"missing worker:2 \(check its log")
      assert re.search(pattern, log), result.tasks[fast].tail(30)
    else:
      for epoch in (0, 1):
        pattern = (rf"{fast} still waiting at epoch_end, epoch {epoch}, after \d+ s "
                   r"\(\d+ s without progress\): 2/3 arrived; missing worker:2; "
                   rf"worker:2 epoch {epoch} batch \d+")
        assert re.search(pattern, log, re.MULTILINE), result.tasks[fast].tail(30)
  if sync:
    assert_equals_oracle(audit[-1]["checkpoint"], "linear", shards, 2)


STUCK_STEP_TIMEOUT_SECS = 4


@pytest.mark.timeout(150)
def test_an_asynchronous_step_that_never_returns_ends_its_process_and_the_job(tmp_path):
  """A run TensorFlow lost (docs/reliability.md) never returns: worker:2's 5th step here also
  fetches a dequeue from an empty queue. Its watchdog ends it at the step timeout, and every
  other task names it dead within seconds, long before the barrier's 30 minutes."""
  model_dir = str(tmp_path / "model")
  command = TASK + [f"--model_dir={model_dir}", "--shard_batches=8,5,3",
                    "--epochsync_num_epochs=3", "--epochsync_sync=false",
                    "--step_sleep_secs=0.1",
                    f"--epochsync_step_timeout_secs={STUCK_STEP_TIMEOUT_SECS}"]
  with LocalCluster(num_workers=3, timeout_secs=90, fail_fast_secs=DETECT_SECS + 15,
                    log_dir=str(tmp_path / "logs")) as cluster:
    cluster.start(command, per_task_args={"worker:2": ["--hang_worker=2", "--hang_step=5"]})
    result = cluster.wait()
  stuck = result.tasks["worker:2"]
  assert stuck.returncode == 1 and not stuck.timed_out, stuck.tail(30)
  assert "step 5: hanging in session.run" in stuck.log
  assert re.search(r"worker:2: step 5 of this task has been in TensorFlow's session.run for "
                   r"\d+ s; an asynchronous step waits for no other task", stuck.log), stuck.tail()
  assert re.search(r"\nE\d{4} [^\n]*worker:2: step 5 of this task has been in TensorFlow's session.run "
                   r"for [4-9] s.*this process ends now \(exit status 1\)", stuck.log), stuck.tail()
  for name in ("worker:0", "worker:1"):
    task = result.tasks[name]
    assert task.returncode not in (0, None) and not task.timed_out, task.tail(30)
    assert task.ended_at - stuck.ended_at < DETECT_SECS, (name, task.ended_at - stuck.ended_at)
    assert names_the_dead(task.log, name, "worker:2"), task.tail(30)
    assert "BarrierTimeoutError" not in task.log


@pytest.mark.timeout(240)
@pytest.mark.parametrize("sync", [True, pytest.param(False, marks=pytest.mark.variant)],
                         ids=["sync", "async"])
def test_a_step_tensorflow_lost_runs_again_and_the_job_stays_exact(tmp_path, sync):
  """worker:2's 5th step is a run TensorFlow lost: its session.run never returns and runs
  nothing (as a RunGraph its own task rejected as a duplicate, whose cancellation the ps never
  got). Its watchdog leaves the run behind after LOST_AFTER_SECS and the step runs again: every
  task ends by itself, the audit counts every shard once and, synchronous, the parameters are
  the lockstep oracle's (the step applied exactly once). Before, worker:2 ended its process
  and with it the job."""
  from hooks.faults.stuck_step import LOST_AFTER_SECS  # pylint: disable=g-import-not-at-top
  result, audit = _job_with_a_lost_run(
      tmp_path, [f"--epochsync_sync={sync}"], {"worker:2": ["--hang_worker=2", "--lose_step=5"]})
  lost = result.tasks["worker:2"]
  assert "step 5: lost in session.run" in lost.log
  assert re.search(r"\nW\d{4} [^\n]*worker:2: step 5 of this task has been in TensorFlow's "
                   r"session.run for \d+ s and its part on this task never started.*runs again "
                   r"\(retry 1 of 3\)", lost.log), lost.tail()
  assert "leaves its session open: 1 lost run(s) left behind" in lost.log
  assert lost.elapsed_secs > LOST_AFTER_SECS  # it did wait for the lost run
  if sync:
    assert_equals_oracle(audit[-1]["checkpoint"], "linear", LOST_RUN_SHARDS, 2)


@pytest.mark.timeout(240)
def test_an_aggregation_run_tensorflow_lost_runs_again_and_the_job_stays_exact(tmp_path):
  """The chief's 4th aggregation run is a run TensorFlow lost (2 ps: rejected on one, its
  cancellation lost on the other): it never returns and runs nothing. The chief's watchdog
  finds it (its count of runs begun on every ps is behind), leaves it behind with its thread,
  and a new aggregation thread runs it again: every task ends by itself and the parameters are
  the lockstep oracle's. Before, every worker's step waited for its token until the step
  timeout ended the job."""
  result, audit = _job_with_a_lost_run(tmp_path, ["--epochsync_step_timeout_secs=40"],
                                       {"worker:0": ["--lose_aggregation=4"]}, num_ps=2)
  chief = result.tasks["worker:0"]
  assert "aggregation 4: lost in session.run" in chief.log
  assert re.search(r"\nW\d{4} [^\n]*worker:0: the aggregation run has been in TensorFlow's "
                   r"session.run for \d+ s and never started on every ps.*runs it again "
                   r"\(retry 1 of 3\)", chief.log), chief.tail()
  assert "leaves its session open: 1 lost run(s) left behind" in chief.log
  assert_equals_oracle(audit[-1]["checkpoint"], "linear", LOST_RUN_SHARDS, 2)


LOST_RUN_SHARDS = (8, 5, 3)


def _job_with_a_lost_run(tmp_path, args, per_task_args, num_ps=1):
  """A job of 3 workers (LOST_RUN_SHARDS, 2 epochs) in which `per_task_args` lose a run: every
  task must end by itself and the audit count every shard once. Returns (result, audit)."""
  model_dir = str(tmp_path / "model")
  command = TASK + [f"--model_dir={model_dir}", "--shard_batches=8,5,3",
                    "--epochsync_num_epochs=2", "--step_sleep_secs=0.05"] + args
  with LocalCluster(num_workers=3, num_ps=num_ps, timeout_secs=200,
                    log_dir=str(tmp_path / "logs")) as cluster:
    cluster.start(command, per_task_args=per_task_args)
    result = cluster.wait()
  for task in result.tasks.values():
    assert task.returncode == 0 and not task.timed_out, task.tail(30)
  audit = read_audit(model_dir)
  assert [line["epoch"] for line in audit] == [0, 1]
  for line in audit:
    assert {w: s["batches"] for w, s in line["workers"].items()} == {
        f"worker:{i}": n for i, n in enumerate(LOST_RUN_SHARDS)}
  return result, audit
