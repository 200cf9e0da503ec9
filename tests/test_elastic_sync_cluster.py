"""Elastic synchronous training on a real cluster: a worker lost inside a unit, and the
synchronous steps go on with the others, every unit trained once, the model equal to the
oracle of the recorded steps (docs/elastic.md).

Chief + 3 workers + 1 ps, synchronous, units through the work queue (tests/tasks/epoch_task.py
--unit_batches), --epochsync_elastic. worker:1 is slow (so that it is inside a unit of 4+
batches when it is lost). Each worker records the step each of its batches went into
(--record_steps_dir); the oracle replays those steps (each the mean gradient of its batches)
and must equal the checkpoint's parameters to 1e-5.
"""

import json
import os
import signal
import sys
import time

import pytest
import tensorflow as tf

from hooks.epoch.audit import read_audit
from hooks.testing.local_cluster import LocalCluster, run_cluster
from cluster_checks import checkpoint_value
from elastic_checks import (assert_equals_the_oracle, assert_rejoined, kill_inside_a_unit,
                            wait_for)

pytestmark = [pytest.mark.cluster]

TASK = [sys.executable, os.path.join(os.path.dirname(__file__), "tasks", "epoch_task.py")]
UNITS = [9, 1, 4, 6, 2, 7, 3, 5, 1, 8, 4, 6]  # batches per unit, 8 examples each
BATCH, FEATURES, LR = 8, 16, 0.05
WORKERS = 4


def _command(tmp_path, epochs: int = 2, step_sleep_secs: float = 0.05):
  return TASK + [f"--model_dir={tmp_path / 'model'}",
                 "--unit_batches=" + ",".join(map(str, UNITS)),
                 f"--epochsync_num_epochs={epochs}", "--epochsync_sync=true",
                 "--epochsync_elastic", f"--step_sleep_secs={step_sleep_secs}",
                 "--epochsync_save_checkpoint_secs=0", f"--record_steps_dir={tmp_path}"]


def _assert_equals_the_oracle(tmp_path, audit, model="linear"):
  """Every unit once and whole in every epoch, and the model is the oracle's of the steps the
  workers recorded."""
  for line in audit:
    units = line["units"]
    assert sorted(u["index"] for u in units) == list(range(len(UNITS))), units
    for u in units:  # every unit once, whole: its batches and examples, whoever trained them
      assert u["batches"] == UNITS[u["index"]] and u["examples"] == UNITS[u["index"]] * BATCH, u
  assert_equals_the_oracle(str(tmp_path), audit, UNITS, BATCH, FEATURES, LR, model)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("model", ["linear", pytest.param("embedding",
                                                            marks=pytest.mark.variant)])
def test_a_synchronous_job_goes_on_without_a_killed_worker_and_equals_the_oracle(tmp_path,
                                                                                 model):
  """The embedding model's table is partitioned over 2 ps; its gradients are sparse."""
  with LocalCluster(num_workers=WORKERS, num_ps=2 if model == "embedding" else 1,
                    timeout_secs=150, fail_fast_secs=None,
                    log_dir=str(tmp_path / "logs")) as cluster:
    cluster.start(_command(tmp_path) + [f"--model={model}"],
                  per_task_args={"worker:1": ["--slowdown=4"]})
    unit, _ = kill_inside_a_unit(cluster, os.path.join(cluster.log_dir, "worker-1.log"),
                                 UNITS, time.monotonic() + 90, min_batches=6)
    result = cluster.wait()
  codes = {name: r.returncode for name, r in result.tasks.items()}
  assert codes == {"worker:0": 0, "worker:1": -9, "worker:2": 0, "worker:3": 0}, [
      (t.name, t.returncode, t.tail()) for t in result.tasks.values()]
  audit = read_audit(str(tmp_path / "model"))
  assert [line["epoch"] for line in audit] == [0, 1]
  assert all(line["lost_workers"] == ["worker:1"] for line in audit)
  lost = {u["index"]: u for u in audit[0]["units"]}[unit]
  [taken] = lost["taken_back"]
  assert taken["worker"] == "worker:1" and 0 < taken["batches"] < UNITS[unit], lost
  _assert_equals_the_oracle(tmp_path, audit, model)


@pytest.mark.variant  # (the killed-worker test checks the same and more)
@pytest.mark.timeout(240)
def test_a_synchronous_job_without_a_fault_equals_the_oracle(tmp_path):
  with LocalCluster(num_workers=WORKERS, timeout_secs=150,
                    log_dir=str(tmp_path / "logs")) as cluster:
    cluster.start(_command(tmp_path), per_task_args={"worker:2": ["--slowdown=4"]})
    result = cluster.wait()
  result.check()
  audit = read_audit(str(tmp_path / "model"))
  assert [line["epoch"] for line in audit] == [0, 1]
  _assert_equals_the_oracle(tmp_path, audit)


@pytest.mark.timeout(240)
def test_a_frozen_worker_is_fenced_and_when_it_wakes_nothing_of_it_is_trained_twice(tmp_path):
  """worker:1 is SIGSTOPped inside a unit; the chief finds it lost after half the step timeout
  (the others' steps wait for its marker until then) and SIGCONT wakes it after the reclaim:
  its next marker is refused (WorkerFencedError) and its late gradient dropped."""
  logs = str(tmp_path / "logs")
  with LocalCluster(num_workers=WORKERS, timeout_secs=150, fail_fast_secs=None,
                    log_dir=logs) as cluster:
    cluster.start(_command(tmp_path) + ["--epochsync_step_timeout_secs=12"],
                  per_task_args={"worker:1": ["--slowdown=4"]})
    kill_inside_a_unit(cluster, os.path.join(logs, "worker-1.log"), UNITS,
                       time.monotonic() + 90, sig=signal.SIGSTOP, min_batches=6)
    wait_for(os.path.join(logs, "worker-0.log"), r"worker:1 is lost in epoch 0 \(it has "
             "answered no probe for", time.monotonic() + 60)
    cluster.kill_task("worker:1", signal.SIGCONT)  # it wakes inside its unit, now reclaimed
    result = cluster.wait()
  codes = {name: r.returncode for name, r in result.tasks.items()}
  assert [codes[f"worker:{w}"] for w in (0, 2, 3)] == [0, 0, 0], [
      (t.name, t.returncode, t.tail()) for t in result.tasks.values()]
  woken = open(os.path.join(logs, "worker-1.log")).read()
  assert codes["worker:1"] != 0 and "WorkerFencedError: worker:1 was found lost" in woken, (
      codes, woken[-3000:])
  audit = read_audit(str(tmp_path / "model"))
  assert all(line["lost_workers"] == ["worker:1"] for line in audit)
  _assert_equals_the_oracle(tmp_path, audit)


@pytest.mark.timeout(300)
def test_a_killed_worker_relaunched_after_5_s_rejoins_and_the_job_equals_the_oracle(tmp_path):
  """worker:1 is SIGKILLed inside a unit of epoch 0 and relaunched 5 s later: the new process
  joins the running epoch as a guest; the next step takes it in (then it arrives itself at that
  epoch's end) unless the epoch's steps end first (then the chief arrives for it and it starts
  with the next epoch). It trains units to the end and exits 0; the model is the oracle's of
  the recorded steps."""
  logs, epochs = str(tmp_path / "logs"), 10  # about 2 s each: the new process starts in 6-10
  with LocalCluster(num_workers=WORKERS, timeout_secs=200, fail_fast_secs=None,
                    log_dir=logs) as cluster:
    cluster.start(_command(tmp_path, epochs, step_sleep_secs=0.1),
                  per_task_args={"worker:1": ["--slowdown=2"]})
    kill_inside_a_unit(cluster, os.path.join(logs, "worker-1.log"), UNITS,
                       time.monotonic() + 90, min_batches=6)
    time.sleep(5.0)
    while cluster.results()["worker:1"].returncode is None:  # the killed process is reaped
      time.sleep(0.05)
    cluster.restart_task("worker:1")
    result = cluster.wait()
  codes = {name: r.returncode for name, r in result.tasks.items()}
  assert set(codes.values()) == {0}, [(t.name, t.returncode, t.tail()) for t in
                                      result.tasks.values()]
  relaunched = open(os.path.join(logs, "worker-1.log")).read()
  assert "worker:1 rejoined the running job" in relaunched, relaunched[-3000:]
  audit = read_audit(str(tmp_path / "model"))
  assert [line["epoch"] for line in audit] == list(range(epochs))
  guest, taken_in = assert_rejoined(audit, relaunched)
  if taken_in:  # it arrived itself at the end of the epoch it joined
    assert audit[guest]["workers"]["worker:1"]["examples"] == -1, audit[guest]
  assert all(any(u["worker"] == "worker:1" for u in line["units"])
             for line in audit[guest + 1:]), [line["units"] for line in audit]
  _assert_equals_the_oracle(tmp_path, audit)
  print(f"worker:1 lost in epoch 0, joined epoch {guest} as a guest "
        f"({'taken into its steps' if taken_in else 'its steps ended first'}), a member to "
        f"epoch {epochs - 1}")


def _newest_mid_epoch(model_dir: str):
  state = tf.train.get_checkpoint_state(os.path.join(model_dir, "mid_epoch"))
  return state.model_checkpoint_path if state else None


@pytest.mark.timeout(300)
def test_a_mid_epoch_checkpoint_saves_each_workers_own_position_and_the_job_resumes_it(
    tmp_path):
  """worker:1 is SIGKILLed inside a unit of epoch 0 (its count stops, the others' go on);
  after the next mid-epoch save the chief is killed (the job stops: a lost chief is not
  elastic). The checkpoint holds each worker's own batches in the model (not the step count:
  the workers are not in lockstep), equal to what the workers recorded before the save's
  step; the job relaunched whole resumes it and every epoch has every unit once and whole."""
  model_dir, logs = str(tmp_path / "model"), str(tmp_path / "logs")
  command = [c for c in _command(tmp_path) if "save_checkpoint" not in c]
  command += ["--epochsync_save_checkpoint_secs=0", "--epochsync_save_checkpoint_steps=3"]
  with LocalCluster(num_workers=WORKERS, timeout_secs=150, fail_fast_secs=None,
                    log_dir=logs) as cluster:
    cluster.start(command, per_task_args={"worker:1": ["--slowdown=4"],
                                          "worker:0": ["--step_sleep_secs=0.1"]})
    kill_inside_a_unit(cluster, os.path.join(logs, "worker-1.log"), UNITS,
                       time.monotonic() + 90, min_batches=6)
    wait_for(os.path.join(logs, "worker-0.log"), "worker:1 is lost in epoch 0",
             time.monotonic() + 60)
    before = _newest_mid_epoch(model_dir)
    deadline = time.monotonic() + 60
    while _newest_mid_epoch(model_dir) == before and time.monotonic() < deadline:
      time.sleep(0.02)
    cluster.kill_task("worker:0")
    cluster.wait()
  path = _newest_mid_epoch(model_dir)
  assert path != before and read_audit(model_dir) == [], "the save came after epoch 0"
  step = int(checkpoint_value(path, "global_step"))
  applied = checkpoint_value(path, "epochsync/mid_epoch/applied")
  for w in range(WORKERS):
    rows = [json.loads(r) for r in open(tmp_path / f"steps-worker-{w}.jsonl")]
    held = sum(1 for r in rows if r["epoch"] == 0 and r["step"] < step)
    assert applied[w] == held, (w, list(applied), step)  # epoch 0: no EPOCH_SHIFT
  assert len(set(applied)) > 1, applied  # worker:1's stopped at its death: not the step
  again = run_cluster(command, num_workers=WORKERS, timeout_secs=150,
                      log_dir=str(tmp_path / "logs-again"))
  assert {n: r.returncode for n, r in again.tasks.items()} == {
      f"worker:{w}": 0 for w in range(WORKERS)}, [
          (t.name, t.returncode, t.tail()) for t in again.tasks.values()]
  audit = read_audit(model_dir)
  assert [line["epoch"] for line in audit] == [0, 1]
  for line in audit:  # every unit once, whole, whoever trained which part
    assert sorted(u["index"] for u in line["units"]) == list(range(len(UNITS))), line
    for u in line["units"]:
      assert u["batches"] == UNITS[u["index"]] and u["examples"] == UNITS[u["index"]] * BATCH, u


@pytest.mark.timeout(300)
@pytest.mark.parametrize("frozen_secs", [pytest.param(0, marks=pytest.mark.variant), 18])
def test_a_worker_frozen_in_a_step_without_a_batch_ends_fenced_once_woken(tmp_path, frozen_secs):
  """worker:2 finishes its units while slow worker:1 still trains one: its claims answer WAIT
  and it runs steps without a batch. It is SIGSTOPped there, found lost, and woken (at once, or
  `frozen_secs` after the freeze: past its step's 12 s deadline): it ends fenced within seconds,
  long before the job ends."""
  logs = str(tmp_path / "logs")
  with LocalCluster(num_workers=WORKERS, timeout_secs=240, fail_fast_secs=None,
                    log_dir=logs) as cluster:
    cluster.start(_command(tmp_path, epochs=4) + ["--epochsync_step_timeout_secs=12"],
                  per_task_args={"worker:1": ["--slowdown=8"]})
    wait_for(os.path.join(logs, "worker-2.log"), "no unit left to hand out in epoch 0",
             time.monotonic() + 90)
    frozen = cluster.kill_task("worker:2", signal.SIGSTOP)
    wait_for(os.path.join(logs, "worker-0.log"), r"worker:2 is lost in epoch 0 \(it has "
             "answered no probe for", time.monotonic() + 60)
    time.sleep(max(0.0, frozen + frozen_secs - time.monotonic()))
    woken = cluster.kill_task("worker:2", signal.SIGCONT)
    while cluster.results()["worker:2"].returncode is None and time.monotonic() < woken + 60:
      time.sleep(0.1)
    ended = time.monotonic() - woken
    chief_running = cluster.results()["worker:0"].returncode is None
    result = cluster.wait()
  codes = {name: r.returncode for name, r in result.tasks.items()}
  tail = open(os.path.join(logs, "worker-2.log")).read()[-3000:]
  assert codes["worker:2"] not in (0, None) and ended < 30 and chief_running, (ended, codes, tail)
  assert "WorkerFencedError: worker:2 was found lost by the chief" in tail, tail
  assert [codes[f"worker:{w}"] for w in (0, 1, 3)] == [0, 0, 0], [
      (t.name, t.returncode, t.tail()) for t in result.tasks.values()]
  _assert_equals_the_oracle(tmp_path, read_audit(str(tmp_path / "model")))
