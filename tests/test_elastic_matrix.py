"""The elastic kill matrix (opt-in: ./es test tests/test_elastic_matrix.py --elastic-seeds=10).

Per seed, front end (MonitoredTrainingSession's tests/tasks/epoch_task.py, the Estimator's
tests/tasks/estimator_task.py) and mode (asynchronous, synchronous), training through a work
queue with --epochsync_elastic, 3 workers beside the chief, 1 ps: the seed draws the units, the
fault and its victims, and the moment inside a unit. The faults, in turn: a worker killed;
frozen (SIGSTOP, woken after the chief took its unit back); killed and relaunched (it rejoins);
killed, relaunched, killed and relaunched again; two killed at once; killed and relaunched with
a spare standing by (a 5th task, --epochsync_spare_workers=1: the spare takes its place, and
the relaunched process stands by, or the other way round if it asks first); killed while an
optional worker (a 5th task, --epochsync_optional_workers=1) starts 6 s late and joins the
running job (it trains units of the last epoch); synchronous, that 5th task is beyond the
launch's cluster instead (--epochsync_num_workers=4 --epochsync_max_workers=5: only its own
TF_CONFIG lists it). Every surviving
task exits 0 and every epoch's audit lists every unit once with all its batches and examples.
Asynchronous: the global step is the epochs' batches, less at most one per kill (a killed
worker's batch that passed its gate may not have reached the model; a frozen one loses none).
Synchronous through MonitoredTrainingSession: the model equals the oracle of the steps the
workers recorded (1e-5), every batch in exactly one step.
"""

import os
import random
import re
import signal
import sys
import time
from typing import List

import pytest
import tensorflow as tf

from hooks.epoch.audit import read_audit
from hooks.testing.local_cluster import LocalCluster
from elastic_checks import assert_equals_the_oracle, wait_for

pytestmark = [pytest.mark.cluster]

TASKS = os.path.join(os.path.dirname(__file__), "tasks")
FAULTS = ("killed", "frozen", "relaunched", "twice", "two_at_once", "spare", "optional")
_EPOCHS = {"killed": 2, "frozen": 2, "two_at_once": 2, "relaunched": 6, "twice": 10, "spare": 4,
           "optional": 6}
LATE_SECS = 6.0  # the optional worker's late start


def _log(logs: str, task: str) -> str:
  path = os.path.join(logs, task.replace(":", "-") + ".log")
  return open(path).read() if os.path.exists(path) else ""


def _wait_for(logs: str, task: str, pattern: str, deadline: float, after: int = 0) -> int:
  return wait_for(os.path.join(logs, task.replace(":", "-") + ".log"), pattern, deadline, after)


def _relaunch(cluster, task: str, deadline: float) -> None:
  while cluster.results()[task].returncode is None and time.monotonic() < deadline:
    time.sleep(0.05)
  cluster.restart_task(task)


@pytest.mark.timeout(420)
def test_the_elastic_kill_matrix(tmp_path, elastic_case):
  seed, front, mode = elastic_case
  sync = mode == "sync"
  rng = random.Random(seed)
  fault = FAULTS[seed % len(FAULTS)]
  units = [rng.randint(2, 9) for _ in range(rng.randint(6, 12))]
  epochs = _EPOCHS[fault]
  model_dir, logs = str(tmp_path / "model"), str(tmp_path / "logs")
  if front == "mts":
    names, chief = ["worker:1", "worker:2", "worker:3"], "worker:0"
    command = [sys.executable, os.path.join(TASKS, "epoch_task.py"), "--step_sleep_secs=0.1"]
    slow = ["--slowdown=3"]
    batch = 8
  else:
    names, chief = ["worker:0", "worker:1", "worker:2"], "chief:0"
    command = [sys.executable, os.path.join(TASKS, "estimator_task.py"), "--step_sleep_secs=0.1"]
    slow = ["--step_sleep_secs=0.3"]
    from examples import estimator_data  # pylint: disable=g-import-not-at-top
    batch = estimator_data.BATCH_SIZE
  victims: List[str] = rng.sample(names, 2 if fault == "two_at_once" else 1)
  command += [f"--model_dir={model_dir}", "--unit_batches=" + ",".join(map(str, units)),
              f"--epochsync_num_epochs={epochs}", f"--epochsync_sync={str(sync).lower()}",
              "--epochsync_elastic", "--epochsync_save_checkpoint_secs=0",
              # synchronous: a frozen worker is found after half of it, the others' steps wait
              f"--epochsync_step_timeout_secs={12 if sync else 6}"]
  if sync and front == "mts":
    command.append(f"--record_steps_dir={tmp_path}")
  spare, launch = None, None
  if fault in ("spare", "optional"):  # the last task stands by, or starts late
    spare = "worker:4" if front == "mts" else "worker:3"
    command.append(f"--epochsync_{fault}_workers=1")
  if fault == "optional" and sync:  # (synchronous) it is beyond the launch's cluster instead
    launch, command[-1] = 4, "--epochsync_num_workers=4"
    command.append("--epochsync_max_workers=5")
  print(f"elastic seed {seed} ({front}, {mode}): {fault} {victims}, units {units}, "
        f"{epochs} epochs")
  deadline = time.monotonic() + 360
  kills = 0
  with LocalCluster(num_workers=5 if spare else 4, has_chief=front == "estimator",
                    timeout_secs=360, fail_fast_secs=None, log_dir=logs,
                    launch_workers=launch) as cluster:
    late = {spare: [f"--start_delay_secs={LATE_SECS}"]} if fault == "optional" else {}
    cluster.start(command, per_task_args={**{v: slow for v in victims}, **late})
    _wait_for(logs, victims[0], re.escape(victims[0]) + r" took unit \d+ .* in epoch 0", deadline)
    time.sleep(rng.uniform(0.05, 0.8))  # somewhere inside the unit
    if fault == "frozen":
      cluster.kill_task(victims[0], signal.SIGSTOP)
      _wait_for(logs, chief, re.escape(victims[0]) + r" is lost in epoch", deadline)
      cluster.kill_task(victims[0], signal.SIGCONT)
    else:
      for victim in victims:
        cluster.kill_task(victim)
        kills += 1
    if fault in ("relaunched", "twice", "spare"):
      _relaunch(cluster, victims[0], deadline)
    if fault == "twice":
      seen = _wait_for(logs, victims[0], "rejoined the running job", deadline)
      _wait_for(logs, victims[0], re.escape(victims[0]) + r" took unit \d+", deadline, seen)
      time.sleep(rng.uniform(0.05, 0.8))
      cluster.kill_task(victims[0])
      kills += 1
      _relaunch(cluster, victims[0], deadline)
    result = cluster.wait()
  codes = {name: r.returncode for name, r in result.tasks.items()}
  ended = {chief: 0, **{n: 0 for n in names + ([spare] if spare else [])}}
  if fault in ("killed", "two_at_once", "optional"):
    ended.update({v: -9 for v in victims})
  if fault == "frozen":
    ended[victims[0]] = codes[victims[0]]
    assert codes[victims[0]] != 0 and "WorkerFencedError" in _log(logs, victims[0])
  assert codes == ended, [(t.name, t.returncode, t.tail()) for t in result.tasks.values()]
  audit = read_audit(model_dir)
  assert [line["epoch"] for line in audit] == list(range(epochs)), audit
  for line in audit:
    assert sorted(u["index"] for u in line["units"]) == list(range(len(units))), line
    for u in line["units"]:
      assert u["batches"] == units[u["index"]] and u["examples"] == units[u["index"]] * batch, u
  # Lost in epoch 0: the chief arrived for it, or a relaunched process joined epoch 0 itself.
  found = audit[0].get("lost_workers", []) + audit[0].get("rejoined_workers", [])
  assert sorted(set(found) - {spare}) == sorted(victims), audit[0]
  if fault in ("relaunched", "twice"):
    assert "lost_workers" not in audit[-1], audit[-1]  # a member again at the end
  if fault == "optional":  # it joined the running job, and trained in the last epoch
    assert re.search(re.escape(spare) + r" joined epoch \d+ \(an optional worker",
                     _log(logs, spare)), _log(logs, spare)[-3000:]
    # Up late: not joined at epoch 0's end, or it joined epoch 0 (a slow first epoch).
    assert spare in audit[0].get("optional_workers", []) + audit[0].get("rejoined_workers", []), (
        audit[0])
    assert any(u["worker"] == spare for u in audit[-1]["units"]), audit[-1]["units"]
    if launch:  # the chief learnt where it listens
      assert f"{spare}, beyond the launch's cluster, listens at" in _log(logs, chief)
    spare = None  # a member like the others from then on
  if spare:  # one of the two joined; the other stood by to the end and exited 0
    joined = [t for t in (spare, victims[0]) if re.search(
        re.escape(t) + r" joined epoch \d+ ", _log(logs, t))]
    assert len(joined) == 1, joined
    other = victims[0] if joined == [spare] else spare
    assert f"{other} stands by as a spare" in _log(logs, other), _log(logs, other)[-3000:]
    assert audit[-1].get("lost_workers", []) + audit[-1].get("spare_workers", []) == [other], (
        audit[-1])
  if sync:
    if front == "mts":
      assert_equals_the_oracle(str(tmp_path), audit, units, batch)
    return
  step = int(tf.train.load_variable(tf.train.latest_checkpoint(model_dir), "global_step"))
  assert epochs * sum(units) - kills <= step <= epochs * sum(units), (step, kills)

