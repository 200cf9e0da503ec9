"""Optional workers on a real cluster (--epochsync_optional_workers, docs/elastic.md): the job's
last worker tasks may come up after its start (a pod scheduled late); the job starts without
them and each joins the running job when its process comes up, then trains like the others.

Chief + 2 workers + 1 optional worker (worker:3) + 1 ps, units through the work queue
(tests/tasks/epoch_task.py --unit_batches), --epochsync_elastic
--epochsync_optional_workers=1. worker:3's process starts 12 s after the others
(--start_delay_secs): the job trains its first epochs with three workers, worker:3 joins the
running epoch and trains units of it and of every later one. Every task exits 0, nothing is
logged at WARNING or above, every unit of every epoch is trained once; synchronous steps equal
the oracle of the steps the workers recorded.
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
                 "--epochsync_elastic", "--epochsync_optional_workers=1",
                 "--step_sleep_secs=0.1", "--epochsync_save_checkpoint_secs=0"] + (
                     [f"--record_steps_dir={tmp_path}"] if sync else [])


@pytest.mark.timeout(300)
@pytest.mark.parametrize("sync", [  # (synchronous joins: test_elastic_growth's)
    False, pytest.param(True, marks=pytest.mark.variant)], ids=["async", "sync"])
def test_an_optional_worker_up_late_joins_the_running_job_and_trains(tmp_path, sync):
  logs, epochs = str(tmp_path / "logs"), 6
  with LocalCluster(num_workers=4, timeout_secs=240, log_dir=logs) as cluster:
    started_at = time.time()
    cluster.start(_command(tmp_path, sync, epochs),
                  per_task_args={"worker:3": [f"--start_delay_secs={LATE_SECS}"]})
    result = cluster.wait()
  result.check()
  late, chief = (open(os.path.join(logs, f"worker-{i}.log")).read() for i in (3, 0))
  assert "worker:3 is optional: the job starts without it" in chief, chief[-3000:]
  joined_at = logged_at(late, r"worker:3 joined epoch \d+ \(an optional worker, up after the "
                        r"job's start\)", started_at)
  assert joined_at - started_at > LATE_SECS, (started_at, joined_at)
  audit = read_audit(str(tmp_path / "model"))
  assert [line["epoch"] for line in audit] == list(range(epochs))
  assert audit[0]["optional_workers"] == ["worker:3"], audit[0]
  assert audit[0]["workers"]["worker:3"]["optional"], audit[0]["workers"]
  joined = next(i for i, line in enumerate(audit) if "optional_workers" not in line)
  assert 0 < joined < epochs - 1, [line.get("optional_workers") for line in audit]
  for line in audit:
    assert "lost_workers" not in line and "spare_workers" not in line, line
    units = line["units"]
    assert sorted(u["index"] for u in units) == list(range(len(UNITS))), units
    for u in units:  # every unit once, whole
      assert u["batches"] == UNITS[u["index"]] and u["examples"] == UNITS[u["index"]] * BATCH, u
  for line in audit[joined + 1:]:  # from the epoch after its join it trains like the others
    assert {u["worker"] for u in line["units"]} == {f"worker:{i}" for i in range(4)}, line
    assert line["workers"]["worker:3"]["batches"] > 0, line["workers"]
  if sync:
    assert_equals_the_oracle(str(tmp_path), audit, UNITS, BATCH, FEATURES, LR, "linear")
  else:
    step = int(tf.train.load_variable(tf.train.latest_checkpoint(str(tmp_path / "model")),
                                      "global_step"))
    assert step == epochs * sum(UNITS), step
  for name in ("ps-0", "worker-0", "worker-1", "worker-2", "worker-3"):
    loud = alarms(open(os.path.join(logs, f"{name}.log")).read())
    assert not loud, (name, loud)


@pytest.mark.variant  # (the join is the test above's; this adds a loss after it)
@pytest.mark.timeout(300)
def test_an_optional_worker_that_joined_is_lost_and_rejoins_like_any_other(tmp_path):
  """worker:3 comes up 12 s late and joins; it is SIGKILLed inside a unit of a later epoch and
  relaunched: the chief names it lost (WARNING), takes its unit back, and the new process
  rejoins the running job; every unit of every epoch once."""
  logs, epochs = str(tmp_path / "logs"), 12
  late_log = os.path.join(logs, "worker-3.log")
  with LocalCluster(num_workers=4, timeout_secs=240, fail_fast_secs=None,
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
  assert "worker:3 rejoined the running job" in open(late_log).read()
  audit = read_audit(str(tmp_path / "model"))
  assert [line["epoch"] for line in audit] == list(range(epochs))
  for line in audit:
    units = line["units"]
    assert sorted(u["index"] for u in units) == list(range(len(UNITS))), units
    for u in units:
      assert u["batches"] == UNITS[u["index"]] and u["examples"] == UNITS[u["index"]] * BATCH, u
  assert any(u["worker"] == "worker:3" for u in audit[-1]["units"]), audit[-1]["units"]
