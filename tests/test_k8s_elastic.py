"""examples/k8s/elastic-tfjob.yaml on a local cluster, with Kubernetes' OnFailure played by the
test: worker:1 is killed inside a unit; only a task that exits non-zero is restarted (at its
address, as the kubelet restarts its container). Elastic, the killed worker is the only one
that fails; its new process rejoins and every task ends with exit status 0, every unit once.

The manifest's command runs with tests/tasks/epoch_task.py (examples.train plus the test's
slow steps) in place of examples.train, its model_dir in the test's directory, and its
EPOCHSYNC_* environment as given (docs/deploy.md, "Elastic jobs").
"""

import os
import sys
import time

import pytest

from hooks.epoch.audit import read_audit
from hooks.testing.local_cluster import LocalCluster
from elastic_checks import assert_rejoined, kill_inside_a_unit
from test_k8s_manifest import ELASTIC_MANIFEST, _container, _env, _load

pytestmark = [pytest.mark.cluster]

TASK = os.path.join(os.path.dirname(__file__), "tasks", "epoch_task.py")


def _manifest_job(model_dir: str):
  """(the command with the test task and model_dir, the environment, the unit sizes)."""
  chief = _load(ELASTIC_MANIFEST)["spec"]["tfReplicaSpecs"]["Chief"]
  command = _container(chief)["command"]
  assert command[:3] == ["python", "-m", "examples.train"]
  args = [a for a in command[3:] if not a.startswith("--model_dir=")]
  units = next(a.split("=", 1)[1] for a in args if a.startswith("--unit_batches="))
  env = dict(_env(chief), EPOCHSYNC_STARTUP_TIMEOUT_SECS="120")  # the pods' 900: pulls
  return ([sys.executable, TASK, f"--model_dir={model_dir}", "--step_sleep_secs=0.1"] + args,
          env, [int(u) for u in units.split(",")])


@pytest.mark.timeout(300)
def test_on_failure_restarts_the_killed_worker_alone_and_it_rejoins(tmp_path):
  model_dir, logs = str(tmp_path / "model"), str(tmp_path / "logs")
  command, env, units = _manifest_job(model_dir)
  restarts = []
  with LocalCluster(num_workers=4, num_ps=2, has_chief=True, timeout_secs=240,
                    fail_fast_secs=None, log_dir=logs, env=env) as cluster:
    cluster.start(command, per_task_args={"worker:1": ["--slowdown=3"]})
    kill_inside_a_unit(cluster, os.path.join(logs, "worker-1.log"), units,
                       time.monotonic() + 120, min_batches=6)
    deadline = time.monotonic() + 200
    while time.monotonic() < deadline:  # OnFailure: a task that failed comes back
      ended = {n: r.returncode for n, r in cluster.results().items()
               if r.returncode is not None and not n.startswith("ps")}
      failed = [n for n, code in ended.items() if code != 0 and (n, code) not in restarts]
      for name in failed:
        restarts.append((name, ended[name]))
        cluster.restart_task(name)
      if len(ended) == 4 and all(code == 0 for code in ended.values()):
        break
      time.sleep(0.05)
    result = cluster.wait()
  assert restarts == [("worker:1", -9)], restarts  # the killed worker only: nothing cascaded
  codes = {n: r.returncode for n, r in result.tasks.items() if not n.startswith("ps")}
  assert set(codes.values()) == {0}, [(t.name, t.returncode, t.tail())
                                      for t in result.tasks.values()]
  relaunched = open(os.path.join(logs, "worker-1.log")).read()
  assert "worker:1 rejoined the running job" in relaunched
  audit = read_audit(model_dir)
  assert [line["epoch"] for line in audit] == [0, 1, 2]
  # Lost in epoch 0: the chief arrived for it until the epoch it joined, epoch 0 itself when
  # the new process joined before the chief's gather of it (a fast relaunch).
  assert_rejoined(audit, relaunched)
  assert "lost_workers" not in audit[-1], audit[-1]
  for line in audit:  # every unit once, whole
    assert sorted(u["index"] for u in line["units"]) == list(range(len(units))), line
    for u in line["units"]:
      assert u["batches"] == units[u["index"]], u


@pytest.mark.timeout(300)
def test_a_replica_count_raised_on_the_running_job_adds_a_worker_that_joins_it(tmp_path):
  """Worker's replicas raised from 3 to 4 while the job runs: the operator creates worker:3
  with a TF_CONFIG of 5 training tasks (the launch's pods keep theirs, of 4), 8 s into the
  run. Under the manifest's EPOCHSYNC_MAX_WORKERS it joins the running job and trains; no
  task fails, every unit once. (Steps of 0.3 s: the job's 3 epochs last about 20 s.)"""
  model_dir, logs = str(tmp_path / "model"), str(tmp_path / "logs")
  command, env, units = _manifest_job(model_dir)
  with LocalCluster(num_workers=5, num_ps=2, has_chief=True, timeout_secs=240, log_dir=logs,
                    env=env, launch_workers=4) as cluster:
    cluster.start(command + ["--step_sleep_secs=0.3"],
                  per_task_args={"worker:3": ["--start_delay_secs=8"]})
    result = cluster.wait()
  result.check()
  new = open(os.path.join(logs, "worker-3.log")).read()
  assert "(this one beyond the launch)" in new and "worker:3 joined epoch" in new, new[-3000:]
  audit = read_audit(model_dir)
  assert [line["epoch"] for line in audit] == [0, 1, 2]
  assert any(u["worker"] == "worker:3" for u in audit[-1]["units"]), audit[-1]["units"]
  for line in audit:  # every unit once, whole
    assert sorted(u["index"] for u in line["units"]) == list(range(len(units))), line
    for u in line["units"]:
      assert u["batches"] == units[u["index"]], u
