"""More workers than the launch's (--epochsync_max_workers, docs/elastic.md): a worker that no
task of the launch knows (a replica count raised on a running TFJob) joins the running job.

A job launched with 3 training tasks (`--epochsync_num_workers=3`; worker:0 is the chief) that
may grow to 4 (`--epochsync_max_workers=4`): the ps task and worker:0-2 get a TF_CONFIG listing
3; worker:3's lists 4, and it comes up 12 s late (LocalCluster's `launch_workers`).
It boots as a joiner and brings its cluster to the ps tasks in its session (TensorFlow's
ClusterSpec propagation: tests/test_tf_cluster_propagation.py), writes its address on ps:0 and
joins the running epoch; the chief learns its address and probes it from then on. Every task
exits 0 with nothing at WARNING or above, every unit of every epoch is trained once, and the
model is exact (asynchronous: the global step; synchronous: the oracle of the recorded steps).
"""

import os
import sys
import time

import pytest
import tensorflow as tf

from hooks.epoch.audit import read_audit
from hooks.testing.local_cluster import LocalCluster
from elastic_checks import assert_equals_the_oracle, kill_inside_a_unit_of, logged_at, wait_for
from log_checks import alarms

pytestmark = [pytest.mark.cluster]

TASK = [sys.executable, os.path.join(os.path.dirname(__file__), "tasks", "epoch_task.py")]
UNITS = [9, 1, 4, 6, 2, 7, 3, 5, 1, 8, 4, 6]  # batches per unit, 8 examples each
BATCH, FEATURES, LR = 8, 16, 0.05
LATE_SECS = 12.0  # past the others' start and first epoch, also on a busy machine


def _command(tmp_path, sync: bool, epochs: int):
  return TASK + [f"--model_dir={tmp_path / 'model'}",
                 "--unit_batches=" + ",".join(map(str, UNITS)),
                 f"--epochsync_num_epochs={epochs}", f"--epochsync_sync={str(sync).lower()}",
                 "--epochsync_elastic", "--epochsync_num_workers=3", "--epochsync_max_workers=4",
                 "--step_sleep_secs=0.1", "--epochsync_save_checkpoint_secs=0"] + (
                     [f"--record_steps_dir={tmp_path}"] if sync else [])


def _check_every_unit_once(audit, epochs):
  assert [line["epoch"] for line in audit] == list(range(epochs))
  for line in audit:
    units = line["units"]
    assert sorted(u["index"] for u in units) == list(range(len(UNITS))), units
    for u in units:  # every unit once, whole
      assert u["batches"] == UNITS[u["index"]] and u["examples"] == UNITS[u["index"]] * BATCH, u


@pytest.mark.timeout(300)
@pytest.mark.parametrize("sync", [  # (asynchronous joins: test_elastic_optional's)
    pytest.param(False, marks=pytest.mark.variant), True], ids=["async", "sync"])
def test_a_worker_beyond_the_launch_joins_the_running_job_and_trains(tmp_path, sync):
  logs, epochs = str(tmp_path / "logs"), 6
  with LocalCluster(num_workers=4, launch_workers=3, timeout_secs=240, log_dir=logs) as cluster:
    started_at = time.time()
    cluster.start(_command(tmp_path, sync, epochs),
                  per_task_args={"worker:3": [f"--start_delay_secs={LATE_SECS}"]})
    result = cluster.wait()
  result.check()
  late, chief = (open(os.path.join(logs, f"worker-{i}.log")).read() for i in (3, 0))
  assert "launched with 3 of at most 4 chief and worker tasks (this one beyond the launch)" in late
  assert "worker:3 is optional: the job starts without it" in chief, chief[-3000:]
  joined_at = logged_at(late, r"worker:3 joined epoch \d+ \(an optional worker, up after the "
                        r"job's start\)", started_at)
  assert joined_at - started_at > LATE_SECS, (started_at, joined_at)
  address = cluster.cluster["worker"][3]
  assert f"worker:3, beyond the launch's cluster, listens at {address}" in chief, chief[-3000:]
  audit = read_audit(str(tmp_path / "model"))
  _check_every_unit_once(audit, epochs)
  joined = next(i for i, line in enumerate(audit) if "optional_workers" not in line)
  assert 0 < joined < epochs - 1, [line.get("optional_workers") for line in audit]
  for line in audit[joined + 1:]:  # from the epoch after its join it trains like the others
    assert {u["worker"] for u in line["units"]} == {f"worker:{i}" for i in range(4)}, line
  if sync:
    assert_equals_the_oracle(str(tmp_path), audit, UNITS, BATCH, FEATURES, LR, "linear")
  else:
    step = int(tf.train.load_variable(tf.train.latest_checkpoint(str(tmp_path / "model")),
                                      "global_step"))
    assert step == epochs * sum(UNITS), step
  for name in ("ps-0", "worker-0", "worker-1", "worker-2", "worker-3"):
    loud = alarms(open(os.path.join(logs, f"{name}.log")).read())
    assert not loud, (name, loud)


@pytest.mark.timeout(300)
def test_a_joiner_up_before_a_late_worker_of_the_launch_waits_for_the_run_to_start(tmp_path):
  """worker:3 (beyond the launch) is up at once, worker:2 (of the launch) 12 s late: the chief
  arrived for worker:3 at the run's start barrier, which waits for worker:2. worker:3 joins
  epoch 0 only once the start is released; joined earlier, it trained epoch 0 and arrived at
  its end while the chief still waited at its start, which the chief refused (ConfigError)."""
  logs, epochs = str(tmp_path / "logs"), 4
  with LocalCluster(num_workers=4, launch_workers=3, timeout_secs=240, log_dir=logs) as cluster:
    cluster.start(_command(tmp_path, False, epochs),
                  per_task_args={"worker:2": [f"--start_delay_secs={LATE_SECS}"]})
    result = cluster.wait()
  result.check()
  early = open(os.path.join(logs, "worker-3.log")).read()
  assert "epoch 0 has not started: its start barrier waits for workers of the job's launch" in (
      early), early[-3000:]
  assert "worker:3 joined epoch 0 (an optional worker, up after the job's start)" in early
  audit = read_audit(str(tmp_path / "model"))
  _check_every_unit_once(audit, epochs)
  assert any(u["worker"] == "worker:3" for u in audit[0]["units"]), audit[0]["units"]
  step = int(tf.train.load_variable(tf.train.latest_checkpoint(str(tmp_path / "model")),
                                    "global_step"))
  assert step == epochs * sum(UNITS), step


@pytest.mark.variant  # (the join is the first test's; this adds a loss after it)
@pytest.mark.timeout(300)
def test_a_worker_beyond_the_launch_that_is_lost_rejoins_at_the_address_it_writes(tmp_path):
  """worker:3 joins 12 s late, is SIGKILLed inside a unit of a later epoch and relaunched: the
  chief names it lost, takes its unit back, and probes the new process, which wrote its
  address again before it rejoined; every unit of every epoch once."""
  logs, epochs = str(tmp_path / "logs"), 12
  late_log = os.path.join(logs, "worker-3.log")
  with LocalCluster(num_workers=4, launch_workers=3, timeout_secs=240, fail_fast_secs=None,
                    log_dir=logs) as cluster:
    cluster.start(_command(tmp_path, False, epochs),
                  per_task_args={"worker:3": [f"--start_delay_secs={LATE_SECS}"]})
    deadline = time.monotonic() + 120
    wait_for(late_log, r"worker:3 joined epoch", deadline)
    kill_inside_a_unit_of(cluster, late_log, UNITS, deadline, range(1, epochs - 4),
                          victim="worker:3", min_batches=4)
    while cluster.results()["worker:3"].returncode is None:  # the killed process is reaped
      assert time.monotonic() < deadline, "the killed worker:3 was not reaped"
      time.sleep(0.05)
    cluster.restart_task("worker:3")  # (its relaunch starts 12 s late too)
    result = cluster.wait()
  codes = {name: r.returncode for name, r in result.tasks.items()}
  assert set(codes.values()) == {0}, [(t.name, t.returncode, t.tail())
                                      for t in result.tasks.values()]
  chief = open(os.path.join(logs, "worker-0.log")).read()
  assert "worker:3 is lost in epoch" in chief, chief[-3000:]
  assert chief.count("worker:3, beyond the launch's cluster, listens at") == 2, chief[-3000:]
  assert "worker:3 rejoined the running job" in open(late_log).read()
  audit = read_audit(str(tmp_path / "model"))
  _check_every_unit_once(audit, epochs)
  assert any(u["worker"] == "worker:3" for u in audit[-1]["units"]), audit[-1]["units"]
