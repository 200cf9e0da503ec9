"""Spare workers on a real cluster (--epochsync_spare_workers, docs/elastic.md): the job's last
worker tasks stand by, their graph built and their session up, and one joins in place of a lost
worker within the chief's detection, instead of the job waiting for a relaunched process.

Chief + 2 workers + 1 spare (worker:3) + 1 ps, units through the work queue
(tests/tasks/epoch_task.py --unit_batches), --epochsync_elastic --epochsync_spare_workers=1.
worker:1 is SIGKILLed inside a unit of epoch 0 and relaunched at once: the spare joins the
running epoch, and the relaunched worker:1 finds the job full and stands by in its turn until
the job ends. Every task exits 0; every unit is trained once, whoever trained it; synchronous
steps equal the oracle of the steps the workers recorded.
"""

import os
import re
import sys
import time

import pytest
import tensorflow as tf

from hooks.epoch.audit import read_audit
from hooks.testing.local_cluster import LocalCluster, run_cluster
from elastic_checks import (assert_equals_the_oracle, kill_inside_a_unit, kill_inside_a_unit_of,
                            logged_at, records_across_a_relaunch, wait_for)
from log_checks import alarms

pytestmark = [pytest.mark.cluster]

TASK = [sys.executable, os.path.join(os.path.dirname(__file__), "tasks", "epoch_task.py")]
UNITS = [9, 1, 4, 6, 2, 7, 3, 5, 1, 8, 4, 6]  # batches per unit, 8 examples each
BATCH, FEATURES, LR = 8, 16, 0.05


def _command(tmp_path, sync: bool, epochs: int):
  return TASK + [f"--model_dir={tmp_path / 'model'}",
                 "--unit_batches=" + ",".join(map(str, UNITS)),
                 f"--epochsync_num_epochs={epochs}", f"--epochsync_sync={str(sync).lower()}",
                 "--epochsync_elastic", "--epochsync_spare_workers=1", "--step_sleep_secs=0.1",
                 "--epochsync_save_checkpoint_secs=0"] + (
                     [f"--record_steps_dir={tmp_path}"] if sync else [])


def _assert_every_unit_once(audit):
  for line in audit:
    units = line["units"]
    assert sorted(u["index"] for u in units) == list(range(len(UNITS))), units
    for u in units:  # every unit once, whole: its batches and examples, whoever trained them
      assert u["batches"] == UNITS[u["index"]] and u["examples"] == UNITS[u["index"]] * BATCH, u


@pytest.mark.timeout(300)
@pytest.mark.parametrize("sync", [False, True], ids=["async", "sync"])
def test_a_spare_joins_in_place_of_a_killed_worker_and_its_relaunch_stands_by(tmp_path, sync):
  logs, epochs = str(tmp_path / "logs"), 3
  with LocalCluster(num_workers=4, timeout_secs=180, fail_fast_secs=None,
                    log_dir=logs) as cluster:
    cluster.start(_command(tmp_path, sync, epochs),
                  per_task_args={"worker:1": ["--slowdown=2"]})
    _, killed_at = kill_inside_a_unit(cluster, os.path.join(logs, "worker-1.log"), UNITS,
                                      time.monotonic() + 90, min_batches=6)
    while cluster.results()["worker:1"].returncode is None:  # the killed process is reaped
      time.sleep(0.05)
    cluster.restart_task("worker:1")
    result = cluster.wait()
  codes = {name: r.returncode for name, r in result.tasks.items()}
  assert set(codes.values()) == {0}, [(t.name, t.returncode, t.tail())
                                      for t in result.tasks.values()]
  spare = open(os.path.join(logs, "worker-3.log")).read()
  relaunched = open(os.path.join(logs, "worker-1.log")).read()
  assert "worker:3 stands by as a spare" in spare, spare[-3000:]
  joined_at = logged_at(spare, r"worker:3 joined epoch 0 \(a spare, in place of a lost "
                         r"worker\)", killed_at)
  print(f"the spare joined {joined_at - killed_at:.2f} s after the kill")
  assert 0 < joined_at - killed_at < 5, (killed_at, joined_at)
  assert "worker:1 stands by as a spare" in relaunched, relaunched[-3000:]
  assert f"the running job trained all its {epochs} epochs; this process ends" in relaunched
  assert "joined epoch" not in relaunched, relaunched[-3000:]
  chief = open(os.path.join(logs, "worker-0.log")).read()
  assert re.search(r"worker:1 is lost in epoch 0 .*a spare standing by \(worker:3\) joins in "
                   "its place", chief), chief[-3000:]
  audit = read_audit(str(tmp_path / "model"))
  assert [line["epoch"] for line in audit] == list(range(epochs))
  _assert_every_unit_once(audit)
  for line in audit:  # worker:1 stays lost (its new process stands by); worker:3 is in
    assert line["lost_workers"] == ["worker:1"] and "spare_workers" not in line, line
  assert all(any(u["worker"] == "worker:3" for u in line["units"]) for line in audit[1:])
  assert not any(u["worker"] == "worker:1" for line in audit[1:] for u in line["units"])
  if sync:
    assert_equals_the_oracle(str(tmp_path), audit, UNITS, BATCH, FEATURES, LR, "linear")
  else:  # asynchronous: the killed worker's batch in flight may be lost (docs/elastic.md)
    step = int(tf.train.load_variable(tf.train.latest_checkpoint(str(tmp_path / "model")),
                                      "global_step"))
    assert epochs * sum(UNITS) - 1 <= step <= epochs * sum(UNITS), step
  # The whole job relaunched for one more epoch: the new run lifts the fences, worker:1 trains
  # again and worker:3, the last task, is the spare again, though it trained the epochs before.
  again = run_cluster([c.replace(f"num_epochs={epochs}", f"num_epochs={epochs + 1}")
                       for c in _command(tmp_path, sync, epochs)], num_workers=4,
                      timeout_secs=120, log_dir=str(tmp_path / "logs-again"))
  assert {n: r.returncode for n, r in again.tasks.items()} == {
      f"worker:{i}": 0 for i in range(4)}, [(t.name, t.returncode, t.tail())
                                            for t in again.tasks.values()]
  last = read_audit(str(tmp_path / "model"))[-1]
  assert last["epoch"] == epochs and last["spare_workers"] == ["worker:3"], last
  assert "lost_workers" not in last, last
  assert {u["worker"] for u in last["units"]} == {"worker:0", "worker:1", "worker:2"}, last
  _assert_every_unit_once([last])


@pytest.mark.timeout(240)
def test_a_spare_that_dies_standing_by_is_named_and_stands_by_again_once_relaunched(tmp_path):
  """The spare (worker:3) is killed while it stands by: the chief names it gone (WARNING) and
  counts it as standing by again once its relaunched process answers. worker:1 is killed in a
  later epoch: the relaunched spare joins in its place, as the chief's WARNING says. Before
  the chief probed its spares, a dead spare went unnoticed and a later loss's WARNING named it
  as joining."""
  logs, epochs = str(tmp_path / "logs"), 8
  chief_log, spare_log = (os.path.join(logs, f"worker-{i}.log") for i in (0, 3))
  with LocalCluster(num_workers=4, timeout_secs=180, fail_fast_secs=None,
                    log_dir=logs) as cluster:
    cluster.start(_command(tmp_path, False, epochs),
                  per_task_args={"worker:1": ["--slowdown=2"]})
    deadline = time.monotonic() + 90
    wait_for(spare_log, r"worker:3 stands by as a spare", deadline)
    time.sleep(0.5)  # the chief's probes (every 0.1 s) find it up: only then can it be gone
    cluster.kill_task("worker:3")
    killed_at = time.time()
    gone = wait_for(chief_log, r"worker:3, a spare standing by, is gone \(its server", deadline)
    while cluster.results()["worker:3"].returncode is None:  # the killed process is reaped
      time.sleep(0.05)
    cluster.restart_task("worker:3")
    wait_for(chief_log, r"a new process of worker:3, a spare, answers; it stands by again",
             deadline, after=gone)
    took = re.findall(r"worker:1 took unit \d+ .* in epoch (\d+)",
                      open(os.path.join(logs, "worker-1.log")).read())
    later = range(int(took[-1]) + 1 if took else 1, epochs - 1)
    assert later, f"the job ran out of epochs before the spare was back ({took[-1:]})"
    kill_inside_a_unit_of(cluster, os.path.join(logs, "worker-1.log"), UNITS, deadline, later)
    result = cluster.wait()
  codes = {name: r.returncode for name, r in result.tasks.items()}
  assert codes == {"worker:0": 0, "worker:1": -9, "worker:2": 0, "worker:3": 0}, [
      (t.name, t.returncode, t.tail()) for t in result.tasks.values()]
  chief = open(chief_log).read()
  named_at = logged_at(chief, r"worker:3, a spare standing by, is gone", killed_at, levels="W")
  print(f"the chief named the dead spare {named_at - killed_at:.2f} s after the kill")
  assert 0 < named_at - killed_at < 5, (killed_at, named_at)
  assert re.search(r"worker:1 is lost in epoch \d+ .*a spare standing by \(worker:3\) joins in "
                   "its place", chief), chief[-3000:]
  assert re.search(r"worker:3 joined epoch \d+ \(a spare, in place of a lost worker\)",
                   open(spare_log).read()), open(spare_log).read()[-3000:]
  audit = read_audit(str(tmp_path / "model"))
  assert [line["epoch"] for line in audit] == list(range(epochs))
  _assert_every_unit_once(audit)
  assert any(u["worker"] == "worker:3" for u in audit[-1]["units"]), audit[-1]["units"]


@pytest.mark.timeout(180)
def test_a_spare_of_a_healthy_job_trains_nothing_and_ends_with_it(tmp_path):
  """Nobody is lost: the spare stands by to the end, the chief arrives for it at every barrier
  (the audit lists it in spare_workers), it exits 0 with the others, and the job's counts are
  exact; nothing at WARNING or above."""
  logs, epochs = str(tmp_path / "logs"), 2
  with LocalCluster(num_workers=3, timeout_secs=120, log_dir=logs) as cluster:
    cluster.start(_command(tmp_path, False, epochs))
    result = cluster.wait()
  result.check()
  audit = read_audit(str(tmp_path / "model"))
  assert [line["epoch"] for line in audit] == list(range(epochs))
  _assert_every_unit_once(audit)
  for line in audit:
    assert line["spare_workers"] == ["worker:2"] and "lost_workers" not in line, line
    assert line["workers"]["worker:2"]["spare"] and line["workers"]["worker:2"]["batches"] == 0
    assert {u["worker"] for u in line["units"]} == {"worker:0", "worker:1"}, line["units"]
  step = int(tf.train.load_variable(tf.train.latest_checkpoint(str(tmp_path / "model")),
                                    "global_step"))
  assert step == epochs * sum(UNITS), step
  for name in ("ps-0", "worker-0", "worker-1", "worker-2"):
    loud = alarms(open(os.path.join(logs, f"{name}.log")).read())
    assert not loud, (name, loud)
  spare = open(os.path.join(logs, "worker-2.log")).read()
  assert "worker:2 stands by as a spare" in spare and "this process ends" in spare, spare[-3000:]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("sync", [False, True], ids=["async", "sync"])
def test_a_whole_job_relaunched_mid_epoch_resumes_the_units_a_joined_spare_held(tmp_path, sync):
  """worker:1 is killed in epoch 0 and never relaunched: the spare (worker:3) trains in its
  place. In epoch 1, after the spare took a unit and a mid-epoch checkpoint followed, every
  task is killed. The whole job relaunched resumes that checkpoint: the spare's units keep
  their record or resume after its batches in the model (its own position, asynchronous), the
  spare stands by again, and every unit of each epoch is trained once, whole. Seen failing
  before the resume reset the queue's gated counts: the chief's stand-in for the spare carried
  its batches of the first attempt, and the epoch's audit refused them (WorkQueueError)."""
  logs, model_dir = str(tmp_path / "logs"), str(tmp_path / "model")
  command = [c for c in _command(tmp_path, sync, 2) if "save_checkpoint_secs" not in c] + [
      "--epochsync_save_checkpoint_secs=0", "--epochsync_save_checkpoint_steps=2"]
  with LocalCluster(num_workers=4, timeout_secs=180, fail_fast_secs=None,
                    log_dir=logs) as cluster:
    cluster.start(command, per_task_args={"worker:1": ["--slowdown=2"]})
    kill_inside_a_unit(cluster, os.path.join(logs, "worker-1.log"), UNITS,
                       time.monotonic() + 90, min_batches=6)
    deadline = time.monotonic() + 120
    while not re.search(r"worker:3 took unit \d+ .* in epoch 1",
                        open(os.path.join(logs, "worker-3.log")).read()):
      assert time.monotonic() < deadline, "the spare never took a unit of epoch 1"
      time.sleep(0.05)
    time.sleep(1.0)  # its batches go on, and mid-epoch checkpoints every 2 steps hold them
    for name in ("worker:0", "worker:2", "worker:3", "ps:0"):
      cluster.kill_task(name)
  if sync:  # the relaunch records its steps apart: the oracle takes the first run's up to it
    os.makedirs(tmp_path / "again")
    command = [c.replace(f"={tmp_path}", f"={tmp_path / 'again'}") if c.startswith(
        "--record_steps_dir") else c for c in command]
  again = run_cluster(command, num_workers=4, timeout_secs=120,
                      log_dir=str(tmp_path / "logs-again"))
  assert {n: r.returncode for n, r in again.tasks.items()} == {
      f"worker:{i}": 0 for i in range(4)}, [(t.name, t.returncode, t.tail())
                                            for t in again.tasks.values()]
  audit = read_audit(model_dir)
  assert [line["epoch"] for line in audit] == [0, 1]
  _assert_every_unit_once(audit)
  resumed = audit[1]
  assert resumed["attempts"] == [1, 2] and resumed["spare_workers"] == ["worker:3"], resumed
  held = [u for u in resumed["units"] if u["worker"] == "worker:3"]
  assert held, resumed["units"]  # the spare's units of the first attempt, kept from it
  spare = open(os.path.join(str(tmp_path / "logs-again"), "worker-3.log")).read()
  assert "worker:3 stands by as a spare" in spare, spare[-3000:]
  if sync:  # every batch in one step of the model, which equals the oracle's replay
    records = records_across_a_relaunch(str(tmp_path), str(tmp_path / "again"),
                                        str(tmp_path / "both"))
    assert_equals_the_oracle(records, audit, UNITS, BATCH, FEATURES, LR, "linear")
  else:  # asynchronous: an update in flight at the save may be in the model or not
    step = int(tf.train.load_variable(tf.train.latest_checkpoint(model_dir), "global_step"))
    assert abs(step - 2 * sum(UNITS)) <= 3, step
