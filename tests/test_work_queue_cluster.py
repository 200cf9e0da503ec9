"""The work queue on real clusters: every unit trained once per epoch, by whichever worker was free.

Units of skewed sizes go through the queue on ps:0 (examples.train --unit_batches); the chief's
audit lists every unit with its worker, and synchronous training equals the lockstep oracle of
the workers' recorded unit streams (each worker's batches in the order it took its units).
"""

import os
import random
import sys
import time

import numpy as np
import pytest

from examples import train
from hooks.epoch.audit import read_audit
from hooks.testing import oracle
from hooks.testing.local_cluster import LocalCluster
from cluster_checks import (assert_workers_count_every_attempt, checkpoint_value,
                            relaunch_after_a_mid_epoch_kill, steps_sgd, unit_steps,
                            wait_for_epochs)

pytestmark = [pytest.mark.cluster]

TASK = [sys.executable, os.path.join(os.path.dirname(__file__), "tasks", "epoch_task.py")]
UNITS = [9, 1, 4, 6, 2, 7, 3, 5, 1, 8]  # batches per unit (batch 8, the last one partial: no)
BATCH, FEATURES, LR = 8, 16, 0.05


def _run(tmp_path, sync, num_workers=3, epochs=2, per_task_args=None, step_sleep_secs=0.02,
         extra=()):
  model_dir = str(tmp_path / "model")
  command = TASK + [f"--model_dir={model_dir}", "--unit_batches=" + ",".join(map(str, UNITS)),
                    f"--epochsync_num_epochs={epochs}", f"--epochsync_sync={sync}",
                    f"--step_sleep_secs={step_sleep_secs}"] + list(extra)
  with LocalCluster(num_workers=num_workers, timeout_secs=150,
                    log_dir=str(tmp_path / "logs")) as cluster:
    cluster.start(command, per_task_args=per_task_args or {})
    result = cluster.wait()
  result.check()
  return model_dir, result


def _assert_every_unit_once(audit, num_workers):
  for line in audit:
    units = line["units"]
    assert sorted(u["index"] for u in units) == list(range(len(UNITS))), units
    for u in units:
      assert u["batches"] == UNITS[u["index"]] and u["examples"] == UNITS[u["index"]] * BATCH, u
    by_worker = {}
    for u in units:
      by_worker.setdefault(u["worker"], []).append(u)
    for name, stats in line["workers"].items():
      mine = by_worker.get(name, [])
      assert stats["batches"] == sum(u["batches"] for u in mine), (name, stats, mine)
    assert len(line["workers"]) == num_workers


def _streams(audit_line, num_workers):
  """Each worker's batches of the epoch, in the order it took its units."""
  inputs, labels = train.unit_arrays("linear", UNITS, BATCH, FEATURES)
  starts = np.cumsum([0] + UNITS[:-1]) * BATCH
  streams = []
  for w in range(num_workers):
    mine = sorted((u for u in audit_line["units"] if u["worker"] == f"worker:{w}"),
                  key=lambda u: u["first_batch"])
    batches = []
    for u in mine:
      rows = range(starts[u["index"]], starts[u["index"]] + UNITS[u["index"]] * BATCH, BATCH)
      batches += [(inputs[r:r + BATCH], labels[r:r + BATCH]) for r in rows]
    streams.append(batches)
  return streams


@pytest.mark.timeout(240)
def test_synchronous_units_are_trained_once_and_equal_the_oracle(tmp_path):
  model_dir, _ = _run(tmp_path, sync=True, per_task_args={"worker:2": ["--slowdown=4"]})
  audit = read_audit(model_dir)
  assert [line["epoch"] for line in audit] == [0, 1]
  _assert_every_unit_once(audit, 3)
  params = {"w": np.zeros(FEATURES), "b": np.zeros(())}
  steps = 0
  for line in audit:  # each epoch's own assignment, replayed in lockstep
    params, epoch_steps = oracle.lockstep_sgd(params, _streams(line, 3),
                                              oracle.linear_mse_gradients, learning_rate=LR)
    steps += epoch_steps
  checkpoint = audit[-1]["checkpoint"]
  assert checkpoint_value(checkpoint, "global_step") == steps
  for name, value in params.items():
    np.testing.assert_allclose(checkpoint_value(checkpoint, name), value, atol=1e-5)
  # Balanced: the slow worker took fewer batches, and the epoch took fewer steps than the
  # largest static split of the same units would (about a third of all batches each).
  for line in audit:
    batches = {w: s["batches"] for w, s in line["workers"].items()}
    assert sum(batches.values()) == sum(UNITS)


@pytest.mark.timeout(300)
def test_a_replay_imposes_the_recorded_assignment_and_repeats_the_run(tmp_path):
  """A run with worker:2 slow, then its audit replayed (--unit_replay) with worker:0 slow
  instead: every worker takes the units it took before, in the same order, and the model is
  the same (the step composition follows from each worker's units alone)."""
  recorded, _ = _run(tmp_path / "recorded", sync=True,
                     per_task_args={"worker:2": ["--slowdown=4"]})
  audit_path = os.path.join(recorded, "epochsync_epochs.jsonl")
  replayed, _ = _run(tmp_path / "replayed", sync=True, extra=[f"--unit_replay={audit_path}"],
                     per_task_args={"worker:0": ["--slowdown=4"]})
  assignment = lambda audit: [[(u["index"], u["worker"], u["first_batch"]) for u in line["units"]]
                              for line in audit]
  want, got = read_audit(recorded), read_audit(replayed)
  assert sorted(map(sorted, assignment(got))) == sorted(map(sorted, assignment(want)))
  assert [line["global_step"] for line in got] == [line["global_step"] for line in want]
  for name in ("w", "b"):
    np.testing.assert_allclose(checkpoint_value(got[-1]["checkpoint"], name),
                               checkpoint_value(want[-1]["checkpoint"], name), atol=1e-6)


@pytest.mark.timeout(240)
def test_asynchronous_units_go_to_the_free_workers(tmp_path):
  model_dir, _ = _run(tmp_path, sync=False, per_task_args={"worker:2": ["--slowdown=6"]},
                      step_sleep_secs=0.05)  # 0.3 s per step on worker:2: the sleep dominates
  audit = read_audit(model_dir)
  assert [line["epoch"] for line in audit] == [0, 1]
  _assert_every_unit_once(audit, 3)
  assert audit[-1]["global_step"] == 2 * sum(UNITS)
  batches = {w: sum(line["workers"][w]["batches"] for line in audit) for w in audit[0]["workers"]}
  assert batches["worker:2"] < min(batches["worker:0"], batches["worker:1"]), batches


@pytest.mark.slow
@pytest.mark.variant  # (fewer workers after a resume: test_a_synchronous_queue_resumes_...)
@pytest.mark.timeout(300)
def test_a_killed_worker_then_a_relaunch_with_fewer_workers_trains_every_unit_once(tmp_path):
  """Epoch 1 dies with worker:1 (SIGKILL mid-epoch; no mid-epoch checkpoint in this job),
  the job is relaunched from the epoch checkpoint with 2 workers instead of 3 (the queue's
  state, saved with the model, starts the epoch again): each epoch's audit lists every unit
  once, and the parameters equal the oracle of epoch 0 (3 workers) then epochs 1-2 (2)."""
  model_dir = str(tmp_path / "model")
  command = TASK + [f"--model_dir={model_dir}", "--unit_batches=" + ",".join(map(str, UNITS)),
                    "--epochsync_num_epochs=3", "--step_sleep_secs=0.1"]
  with LocalCluster(num_workers=3, timeout_secs=120, fail_fast_secs=20,
                    log_dir=str(tmp_path / "logs1")) as cluster:
    cluster.start(command)
    wait_for_epochs(model_dir, 1, deadline_secs=90)
    time.sleep(0.8)  # inside epoch 1
    cluster.kill_task("worker:1")
    first = cluster.wait()
  assert first.tasks["worker:1"].returncode not in (0, None)
  assert [line["epoch"] for line in read_audit(model_dir)] == [0]
  with LocalCluster(num_workers=2, timeout_secs=150, log_dir=str(tmp_path / "logs2")) as cluster:
    cluster.start(command)
    second = cluster.wait()
  second.check()
  audit = read_audit(model_dir)
  assert [line["epoch"] for line in audit] == [0, 1, 2]
  assert [len(line["workers"]) for line in audit] == [3, 2, 2]
  params, steps = {"w": np.zeros(FEATURES), "b": np.zeros(())}, 0
  for line in audit:
    assert sorted(u["index"] for u in line["units"]) == list(range(len(UNITS)))
    assert all(u["batches"] == UNITS[u["index"]] for u in line["units"]), line["units"]
    params, epoch_steps = oracle.lockstep_sgd(params, _streams(line, len(line["workers"])),
                                              oracle.linear_mse_gradients, learning_rate=LR)
    steps += epoch_steps
    assert line["global_step"] == steps
  for name, value in params.items():
    np.testing.assert_allclose(checkpoint_value(audit[-1]["checkpoint"], name), value, atol=1e-5)


def _steps_of(audit_line, units=UNITS):
  inputs, labels = train.unit_arrays("linear", units, BATCH, FEATURES)
  starts = np.cumsum([0] + list(units[:-1])) * BATCH
  rows = lambda index, k: starts[index] + k * BATCH
  return unit_steps(audit_line, sum(units),
                    lambda index, k: (inputs[rows(index, k):rows(index, k) + BATCH],
                                      labels[rows(index, k):rows(index, k) + BATCH]))


def _resumed_run(tmp_path, sync, workers_after, units=UNITS, save_steps=2, epoch=1,
                 victim="worker:1", delay=0.0, step_sleep_secs=0.15):
  """3 workers, a mid-epoch checkpoint every `save_steps` steps; `victim` killed `delay` s
  after one of `epoch`; relaunched with `workers_after` workers. Checks every unit once with
  all its batches and examples in each epoch; returns the model_dir and the audit."""
  model_dir = str(tmp_path / "model")
  command = TASK + [f"--model_dir={model_dir}", "--unit_batches=" + ",".join(map(str, units)),
                    "--epochsync_num_epochs=2", f"--epochsync_sync={sync}",
                    "--epochsync_save_checkpoint_secs=0",
                    f"--epochsync_save_checkpoint_steps={save_steps}"]
  relaunch_after_a_mid_epoch_kill(tmp_path, command, model_dir, 3, workers_after, epoch, victim,
                                  delay, step_sleep_secs)
  audit = read_audit(model_dir)
  assert [line["epoch"] for line in audit] == [0, 1]
  for line in audit:
    assert sorted(u["index"] for u in line["units"]) == list(range(len(units))), line["units"]
    for u in line["units"]:
      assert u["batches"] == units[u["index"]] and u["examples"] == units[u["index"]] * BATCH, u
  for line in audit:
    assert_workers_count_every_attempt(line, units, BATCH)
  assert {f"worker:{i}" for i in range(workers_after)} <= set(audit[1]["workers"])
  return model_dir, audit


def _assert_equals_the_recorded_steps(audit, units=UNITS, context=""):
  """Synchronous: the global step and the parameters are those of the steps each epoch's audit
  line records (both attempts of a resumed one)."""
  params, steps = {"w": np.zeros(FEATURES), "b": np.zeros(())}, 0
  for line in audit:
    epoch_steps = _steps_of(line, units)
    params = steps_sgd(params, epoch_steps, oracle.linear_mse_gradients, LR)
    steps += len(epoch_steps)
    assert line["global_step"] == steps, (context, line["global_step"], steps)
  for name, value in params.items():
    np.testing.assert_allclose(checkpoint_value(audit[-1]["checkpoint"], name), value, atol=1e-5,
                               err_msg=context)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("workers_after", [pytest.param(3, marks=pytest.mark.variant), 2],
                         ids=["same-workers", "fewer-workers"])
def test_a_synchronous_queue_resumes_its_mid_epoch_checkpoint_exactly(tmp_path, workers_after):
  """The relaunch finishes the units in flight from the step the checkpoint holds and hands
  out the rest, with as many workers as before or fewer: every batch once, and the model equals
  the oracle of the steps the audit records (both attempts)."""
  _, audit = _resumed_run(tmp_path, True, workers_after)
  resumed = audit[1]
  assert resumed["attempts"] == [1, 2], resumed
  assert any(u.get("before_resume") for u in resumed["units"]), resumed["units"]
  _assert_equals_the_recorded_steps(audit)


@pytest.mark.timeout(300)
def test_an_asynchronous_queue_resumes_its_mid_epoch_checkpoint_with_every_unit_once(tmp_path):
  """Asynchronous: each unit in flight resumes after its owner's applied batches; an update
  in flight at the save may be in the model or not (as with static shards)."""
  _, audit = _resumed_run(tmp_path, False, 3)
  assert audit[1]["attempts"] == [1, 2], audit[1]
  parts = audit[1].get("unit_parts", [])
  resumed = [u for u in audit[1]["units"] if u.get("resumed_after")]
  assert len(parts) == len(resumed), (parts, resumed)
  steps = checkpoint_value(audit[-1]["checkpoint"], "global_step")
  assert abs(steps - 2 * sum(UNITS)) <= 3, steps


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_random_kill_points_with_a_work_queue_resume_exactly(tmp_path, unit_kill_case):
  """Per seed: the units, the save period, the victim (the chief, a worker, ps:0), the kill
  point (up to 0.3 s after a mid-epoch save of epoch 0 or 1) and the relaunch's worker count
  (2 to 4); synchronous runs equal the oracle of their recorded steps, asynchronous ones train
  every unit once with the global step within one update per worker.
  Opt-in: ./es test tests/test_work_queue_cluster.py --unit-kill-seeds=10"""
  seed, sync = unit_kill_case
  rng = random.Random(seed)
  units = [rng.randint(2, 9) for _ in range(rng.randint(6, 12))]
  save_steps, epoch = rng.randint(1, 3), rng.randint(0, 1)
  victim, delay = rng.choice(["worker:0", "worker:1", "worker:2", "ps:0"]), rng.random() * 0.3
  workers_after = rng.choice([2, 3, 4])
  what = (f"unit kill seed {seed}: units {units}, save every {save_steps} steps, {victim} "
          f"killed {delay:.2f} s after a mid-epoch save of epoch {epoch}, relaunched with "
          f"{workers_after} workers, {'sync' if sync else 'async'}")
  print(what, flush=True)
  # 0.3 s per step: an epoch of the first attempt lasts seconds, so the kill lands inside it
  # even when this process is descheduled for a while (at a load of 20, 2 of 20 seeds with
  # 0.15 s per step saw their epoch end before the kill).
  _, audit = _resumed_run(tmp_path, sync, workers_after, units, save_steps, epoch, victim, delay,
                          step_sleep_secs=0.3)
  if sync:
    _assert_equals_the_recorded_steps(audit, units, what)
  else:
    steps = checkpoint_value(audit[-1]["checkpoint"], "global_step")
    assert abs(steps - 2 * sum(units)) <= 3, what
