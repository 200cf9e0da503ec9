"""Runs TensorFlow rejects as duplicate RunGraph requests run again, and the job stays exact.

TensorFlow seeds the request ids of each session.run with 32 random bits, and every task
rejects an id among its last 100,000 ("The same RunGraph (Worker) request was received
twice"; docs/reliability.md): a long job meets such a collision every ~50,000 runs.
bench/seed_bits.cc, preloaded into every task, cuts the seed to SEED_BITS bits, so the
collisions come every few dozen runs; the synchronous job must still end by itself, retry
the rejected steps, hook runs and aggregations with a WARNING each, count every shard once
and equal the lockstep oracle; a step TensorFlow lost (rejected, its cancellation lost) is
left behind and run again. A job that meets a rejected run no retry can save (a hook's run its
own task rejected, one lost outside a step, or one in the session's creation:
docs/reliability.md, "What is left") is relaunched from its checkpoints and must still end
exact. Before the step gate and the retries, such a job ended at its first rejection of a
step by the ps (EpochSyncError "lost its session") or hung.
"""

import os
import re
import shutil
import subprocess
import sys

import pytest

from cluster_checks import assert_equals_oracle
from hooks.epoch.audit import read_audit
from hooks.testing.local_cluster import LocalCluster

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TASK = [sys.executable, os.path.join(ROOT, "tests", "tasks", "epoch_task.py")]
SHARDS = (100, 80, 60)
EPOCHS = 2
SEED_BITS = 14  # 16,384 seeds: ~10-20 collisions per job of ~500 runs per task
RETRIED = "as a duplicate RunGraph request"


@pytest.fixture(scope="module")
def seed_shim(tmp_path_factory):
  compiler = shutil.which("g++")
  if compiler is None:
    pytest.skip("needs g++ to build bench/seed_bits.cc (the LD_PRELOAD shim)")
  library = str(tmp_path_factory.mktemp("shim") / "libseed_bits.so")
  subprocess.run([compiler, "-O2", "-shared", "-fPIC", "-o", library,
                  os.path.join(ROOT, "bench", "seed_bits.cc")], check=True, timeout=120)
  return library


def _ended_by_a_run_tensorflow_could_not_end(result) -> bool:
  """Whether a task failed on a rejected run that no retry can save (docs/reliability.md,
  "What is left"): one its own task alone rejected outside a step (its ps part may have run),
  one lost outside a step (no marker tells whether it started: the others' step timeout ends
  the job), or one in the session's creation. A step lost or rejected must never end it."""
  for task in result.tasks.values():
    job, index = task.name.split(":")
    own = f"From /job:{job}/replica:0/task:{index}:\nThe same R"
    if task.returncode not in (0, None) and (
        own in task.log or _held_by_a_run_outside_the_steps(task.log) or
        "while a session was being created" in task.log):
      return True
  return False


def _held_by_a_run_outside_the_steps(log: str) -> bool:
  """The task was killed (its stack dumped: tests/tasks/epoch_task.py) with its main thread in
  the session.run of a hook or of the session's creation: a run TensorFlow lost outside a
  step."""
  main = log.split("Current thread", 1)[-1] if "Current thread" in log else ""
  stack = main.split("\n\n", 1)[0]
  return "_call_tf_sessionrun" in stack and re.search(
      r"line \d+ in (after_run|before_run|end|after_create_session|create_session)\n",
      stack) is not None


@pytest.mark.timeout(600)
def test_a_sync_job_whose_request_ids_collide_retries_them_and_equals_the_oracle(
    tmp_path, seed_shim):
  """The job is relaunched on its model_dir (as `restartPolicy: OnFailure` does) only when a
  rejected run that no retry can save ended it, at most twice; it must end exact."""
  model_dir = str(tmp_path / "model")
  command = TASK + [f"--model_dir={model_dir}",
                    "--shard_batches=" + ",".join(map(str, SHARDS)),
                    f"--epochsync_num_epochs={EPOCHS}", "--epochsync_sync=true",
                    "--epochsync_save_checkpoint_secs=0",
                    "--epochsync_save_checkpoint_steps=20",
                    "--epochsync_step_timeout_secs=20"]
  env = {"LD_PRELOAD": seed_shim, "SEED_BITS": str(SEED_BITS)}
  retried, attempts = {}, 0
  for attempt in range(3):
    with LocalCluster(num_workers=len(SHARDS), timeout_secs=150, env=env,
                      log_dir=str(tmp_path / f"logs{attempt}")) as cluster:
      cluster.start(command)
      result = cluster.wait()
    attempts += 1
    for name, task in result.tasks.items():
      retried[name] = retried.get(name, 0) + task.log.count(RETRIED)
    if all(task.returncode == 0 for task in result.tasks.values()):
      break
    if not _ended_by_a_run_tensorflow_could_not_end(result):
      result.check()  # any other failure fails the test, with the tasks' logs
  result.check()
  assert sum(retried.values()) >= 3, f"too few collisions to prove anything: {retried}"
  audit = read_audit(model_dir)
  assert [line["epoch"] for line in audit] == list(range(EPOCHS)), (attempts, audit)
  for line in audit:
    assert {w: s["batches"] for w, s in line["workers"].items()} == {
        f"worker:{i}": n for i, n in enumerate(SHARDS)}
  assert_equals_oracle(audit[-1]["checkpoint"], "linear", SHARDS, EPOCHS)
