"""Randomized matrix on real clusters: 8 training tasks, random shards, 3 epochs, never a hang.

Seed s draws, with random.Random(s): each training task's shard (0..40 batches of 8
examples), the number of ps tasks (1 or 2); the cluster has a separate chief job when s is
even (chief:0 + worker:0..6), else worker:0 is the chief (worker:0..7). Each seed runs once
synchronously and once asynchronously. Every job must end by itself within its deadline,
its audit must be exact (every task's batches and examples per epoch, the global step, the
checkpoints) and a synchronous job's last checkpoint must equal the numpy lockstep oracle.

The default run is 2 jobs, to keep the whole suite short: seed 0 synchronous (a chief job)
and seed 1 asynchronous (worker:0 the chief); one job takes 20-60 s here.
All seeds 0..N-1, each in both modes:
  ./es test tests/test_matrix.py --matrix-seeds=10
One seed again (the seed is in the test id and in every failure message):
  ./es test tests/test_matrix.py --matrix-seeds=8 -k "seed7-async"
"""

import dataclasses
import os
import random
import sys
import time
from typing import Tuple

import pytest

from cluster_checks import assert_audit_exact, assert_equals_oracle
from hooks.errors import ClusterLaunchError
from hooks.testing.local_cluster import LocalCluster

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

TASK = [sys.executable, os.path.join(os.path.dirname(__file__), "tasks", "epoch_task.py")]
NUM_TASKS, MAX_BATCHES, NUM_EPOCHS = 8, 40, 3
JOB_DEADLINE_SECS = 300  # the LocalCluster kills a job still running then: a hang fails the test
# Generous against a loaded machine; the waits that a hang would hit still end the job early.
TIMEOUTS = ["--epochsync_barrier_timeout_secs=120", "--epochsync_startup_timeout_secs=120",
            "--epochsync_step_timeout_secs=60", "--epochsync_warn_after_secs=20",
            "--epochsync_log_every_secs=5"]


@dataclasses.dataclass(frozen=True)
class Draw:
  """What one seed chose."""
  seed: int
  shards: Tuple[int, ...]
  num_ps: int
  has_chief: bool

  @classmethod
  def of(cls, seed: int) -> "Draw":
    rng = random.Random(seed)
    shards = tuple(rng.randint(0, MAX_BATCHES) for _ in range(NUM_TASKS))
    return cls(seed, shards, num_ps=rng.randint(1, 2), has_chief=seed % 2 == 0)

  def describe(self, sync: bool) -> str:
    layout = "chief + 7 workers" if self.has_chief else "8 workers"
    return (f"matrix seed {self.seed}: {layout}, {self.num_ps} ps, shards "
            f"{','.join(map(str, self.shards))}, {NUM_EPOCHS} epochs, "
            f"{'sync' if sync else 'async'}")


def test_draws_are_reproducible_and_cover_the_range():
  assert Draw.of(3) == Draw.of(3) and Draw.of(3) != Draw.of(4)
  drawn = [n for seed in range(10) for n in Draw.of(seed).shards]
  assert min(drawn) == 0 and max(drawn) == MAX_BATCHES
  assert {Draw.of(s).has_chief for s in range(2)} == {True, False}


@pytest.mark.timeout(JOB_DEADLINE_SECS + 120)
def test_random_shards_never_hang_and_stay_exact(tmp_path, matrix_case):
  matrix_seed, sync = matrix_case  # from conftest.py: --matrix-seeds
  draw = Draw.of(matrix_seed)
  what = draw.describe(sync)
  print(what, flush=True)
  model_dir = str(tmp_path / "model")
  command = TASK + [f"--model_dir={model_dir}",
                    "--shard_batches=" + ",".join(map(str, draw.shards)),
                    f"--epochsync_num_epochs={NUM_EPOCHS}", f"--epochsync_sync={sync}"] + TIMEOUTS
  start = time.monotonic()
  with LocalCluster(num_workers=NUM_TASKS, num_ps=draw.num_ps, has_chief=draw.has_chief,
                    timeout_secs=JOB_DEADLINE_SECS, log_dir=str(tmp_path / "logs")) as cluster:
    cluster.start(command)
    result = cluster.wait()
  print(f"{what}: job took {time.monotonic() - start:.1f} s", flush=True)
  context = (f"{what} (reproduce: ./es test tests/test_matrix.py "
             f"--matrix-seeds={matrix_seed + 1} -k seed{matrix_seed}-"
             f"{'sync' if sync else 'async'}): ")
  try:
    result.check()
  except ClusterLaunchError as e:
    raise AssertionError(f"{context}{e}") from e
  audit = assert_audit_exact(model_dir, cluster.training_task_names, draw.shards, NUM_EPOCHS,
                             sync, context)
  if sync:
    assert_equals_oracle(audit[-1]["checkpoint"], "linear", draw.shards, NUM_EPOCHS,
                         context=context)
  for task in result.tasks.values():
    assert "Traceback" not in task.log, f"{context}{task.name} logged a traceback:\n{task.tail()}"
