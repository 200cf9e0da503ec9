"""Stress tests of the epoch barrier's waits: many short epochs under hostile log periods.

A wait that logs between deadline-bounded dequeues can lose the element a cancelled dequeue
took (issue 8): a release or an arrival vanishes and the job hangs until its timeout. These
jobs cross thousands of log-period boundaries; every run must finish with an exact audit.

  ./es test tests/test_barrier_stress.py                   # each job once (the default suite)
  ./es test tests/test_barrier_stress.py --stress-runs=10  # each job 10 times
"""

import os
import sys

import pytest

from hooks.epoch.audit import read_audit
from hooks.testing.local_cluster import LocalCluster

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

TASK = [sys.executable, os.path.join(os.path.dirname(__file__), "tasks", "epoch_task.py")]


def _run_job(tmp_path, shards, num_epochs, log_every_secs, sync=True, timeout_secs=20,
             job_timeout_secs=240, num_ps=1):
  model_dir = str(tmp_path / "model")
  command = TASK + [
      f"--model_dir={model_dir}", "--shard_batches=" + ",".join(map(str, shards)),
      f"--epochsync_num_epochs={num_epochs}", f"--epochsync_sync={sync}",
      f"--epochsync_log_every_secs={log_every_secs}",
      f"--epochsync_barrier_timeout_secs={timeout_secs}",
      f"--epochsync_startup_timeout_secs={max(timeout_secs, 60)}",
      f"--epochsync_warn_after_secs={timeout_secs / 2}", "--epochsync_step_timeout_secs=60"]
  with LocalCluster(num_workers=len(shards), num_ps=num_ps, timeout_secs=job_timeout_secs,
                    log_dir=str(tmp_path / "logs")) as cluster:
    cluster.start(command)
    result = cluster.wait()
  result.check()  # names the task and shows its last log lines if anything failed
  audit = read_audit(model_dir)
  names = cluster.training_task_names
  assert [line["epoch"] for line in audit] == list(range(num_epochs))
  steps_per_epoch = max(shards) if sync else sum(shards)
  for line in audit:
    assert {w: s["batches"] for w, s in line["workers"].items()} == dict(zip(names, shards)), line
    # The step saved after the barrier (in the checkpoint's name) and the one the audit read
    # before the release (once 2 above it, when grappler had made that read an alias).
    saved_step = int(line["checkpoint"].rsplit("-", 1)[1])
    assert saved_step == line["global_step"] == steps_per_epoch * (line["epoch"] + 1), line
  return result


@pytest.mark.variant  # (the tiny log period is the harder case of the same race)
@pytest.mark.timeout(300)
def test_many_epochs_with_a_short_log_period(tmp_path, stress_run):
  """Issue 8's reproduction: 4 workers, shards 1/0/2/1, 60 epochs, a 0.05 s log period."""
  _run_job(tmp_path, (1, 0, 2, 1), num_epochs=60, log_every_secs=0.05)


@pytest.mark.timeout(300)
def test_many_epochs_with_a_tiny_log_period(tmp_path, stress_run):
  """A 0.003 s log period: every wait crosses hundreds of log periods."""
  _run_job(tmp_path, (1, 0, 2, 1), num_epochs=40, log_every_secs=0.003)


@pytest.mark.timeout(300)
def test_many_workers_arriving_while_the_chief_logs(tmp_path, stress_run):
  """8 workers arrive one after the other at the chief, which logs every 0.002 s.

  Asynchronous training with uneven shards spreads the arrivals over the epoch, so a chief
  whose wait is interrupted at every log period would lose one.
  """
  _run_job(tmp_path, (3, 0, 1, 2, 0, 4, 1, 2), num_epochs=25, log_every_secs=0.002, sync=False,
           num_ps=2)
