"""Checks shared by the cluster tests: checkpoint values, task summaries, the exact audit, the
numpy oracle, and the wait for a running job's epochs.

They read what a finished job of tests/tasks/epoch_task.py (examples.train) left in its
model_dir; `context` (where given) prefixes every failure message (the matrix puts its seed
there).
"""

import glob
import json
import os
import time
from typing import Sequence

import numpy as np

from hooks.epoch.audit import read_audit


def checkpoint_value(prefix: str, name: str):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top; only where a test reads one
  return tf.train.load_variable(prefix, name)


def summaries(model_dir: str) -> dict:
  """The `summary-<task>.json` files examples.train writes, by task name."""
  out = {}
  for path in glob.glob(os.path.join(model_dir, "summary-*.json")):
    with open(path) as f:
      row = json.load(f)
    out[row["task"]] = row
  return out


def assert_audit_exact(model_dir: str, names: Sequence[str], shards: Sequence[int],
                       num_epochs: int, sync: bool, context: str = "", batch: int = 8) -> list:
  """Every epoch's audit line and checkpoint: each worker's batches and examples, the step.

  Returns the audit lines.
  """
  audit = read_audit(model_dir)
  assert [line["epoch"] for line in audit] == list(range(num_epochs)), (
      f"{context}epochs in the audit: {[line['epoch'] for line in audit]}")
  # Synchronous: one global step per step of the longest shard; asynchronous: one per batch.
  steps = max(shards) if sync else sum(shards)
  for line in audit:
    e = line["epoch"]
    got = {w: (s["batches"], s["examples"]) for w, s in line["workers"].items()}
    want = {w: (n, batch * n) for w, n in zip(names, shards)}
    assert got == want, f"{context}epoch {e}: (batches, examples) {got} != {want}"
    assert line["global_step"] == steps * (e + 1), (
        f"{context}epoch {e}: global_step {line['global_step']} != {steps * (e + 1)}")
    ckpt = line["checkpoint"]
    assert os.path.basename(ckpt) == f"model.ckpt-epoch{e:04d}-{steps * (e + 1)}", (
        f"{context}{ckpt}")
    done = list(checkpoint_value(ckpt, "epochsync/done_epochs"))
    assert done == [e + 1] * len(names), f"{context}epoch {e}: done_epochs {done}"
    assert checkpoint_value(ckpt, "global_step") == steps * (e + 1), (
        f"{context}epoch {e}: the checkpoint's global_step")
    assert checkpoint_value(ckpt, "epochsync/completed_epochs") == e + 1, (
        f"{context}epoch {e}: the checkpoint's completed_epochs")
  checkpoints = glob.glob(os.path.join(model_dir, "model.ckpt-epoch*.index"))
  assert len(checkpoints) == num_epochs, f"{context}{len(checkpoints)} epoch checkpoints"
  return audit


def assert_equals_oracle(checkpoint: str, model: str, shards, num_epochs: int,
                         batch: int = 8, features: int = 16, learning_rate: float = 0.05,
                         context: str = ""):
  """The checkpoint's parameters are those of lockstep synchronous SGD (numpy, float64)."""
  from examples import train  # pylint: disable=g-import-not-at-top
  from hooks.testing import oracle  # pylint: disable=g-import-not-at-top
  data = [train.shard_arrays(model, w, n, batch, features) for w, n in enumerate(shards)]
  batches = [[(x[i:i + batch], y[i:i + batch]) for i in range(0, len(y), batch)] for x, y in data]
  if model == "embedding":
    start = {"emb": np.zeros((features, train.EMBEDDING_DIM)), "b": np.zeros(())}
    gradients = oracle.embedding_mse_gradients
  else:
    start, gradients = {"w": np.zeros(features), "b": np.zeros(())}, oracle.linear_mse_gradients
  expected, steps = oracle.lockstep_sgd(start, batches, gradients, learning_rate=learning_rate,
                                        num_epochs=num_epochs)
  got_steps = checkpoint_value(checkpoint, "global_step")
  assert got_steps == steps, f"{context}global_step {got_steps} != the oracle's {steps}"
  for name, value in expected.items():
    np.testing.assert_allclose(checkpoint_value(checkpoint, name), value, atol=1e-5,
                               err_msg=f"{context}{name} differs from lockstep synchronous SGD")


def eval_lines(model_dir: str, task: str) -> list:
  """The JSON lines an estimator_ext evaluator (or in-loop chief) wrote, in order."""
  from estimator_ext import read_eval_log  # pylint: disable=g-import-not-at-top
  return read_eval_log(model_dir, task)


def mid_epoch_saved_in(model_dir: str, epoch: int) -> bool:
  """Whether the chief has a mid-epoch checkpoint of `epoch` (its checkpoint file names it)."""
  state = os.path.join(model_dir, "mid_epoch", "checkpoint")
  return os.path.exists(state) and f"epoch{epoch:04d}-" in open(state).read()


def wait_for_epochs(model_dir: str, n: int, deadline_secs: float = 60.0) -> None:
  """Waits until the chief's audit holds `n` epochs (a test kills a task after that)."""
  deadline = time.monotonic() + deadline_secs
  while time.monotonic() < deadline and len(read_audit(model_dir)) < n:
    time.sleep(0.05)
  assert len(read_audit(model_dir)) >= n, f"the job did not finish {n} epoch(s) in time"


def relaunch_after_a_mid_epoch_kill(log_root, command, model_dir: str, before: int, after: int,
                                    epoch: int = 1, victim: str = "worker:1", delay: float = 0.0,
                                    step_sleep_secs: float = 0.15) -> None:
  """`command` on `before` workers (steps slowed by `step_sleep_secs`); `victim` killed `delay`
  s after a mid-epoch checkpoint of `epoch`, the others then end; the job relaunched on `after`
  workers, which must all end well. Logs in <log_root>/logs1 and logs2."""
  from hooks.testing.local_cluster import LocalCluster  # pylint: disable=g-import-not-at-top
  with LocalCluster(num_workers=before, timeout_secs=120, fail_fast_secs=30,
                    log_dir=str(log_root / "logs1")) as cluster:
    cluster.start(list(command) + [f"--step_sleep_secs={step_sleep_secs}"])
    kill_after_a_mid_epoch_save(cluster, model_dir, epoch, victim, delay)
    cluster.wait()
  with LocalCluster(num_workers=after, timeout_secs=120,
                    log_dir=str(log_root / "logs2")) as cluster:
    cluster.start(list(command) + ["--step_sleep_secs=0"])
    cluster.wait().check()


def kill_after_a_mid_epoch_save(cluster, model_dir: str, epoch: int, victim: str,
                                delay: float = 0.0) -> None:
  """Kills `victim` `delay` s after the chief saved a mid-epoch checkpoint of `epoch` (checked
  to be before the epoch's end)."""
  deadline = time.monotonic() + 90
  while time.monotonic() < deadline and not mid_epoch_saved_in(model_dir, epoch):
    time.sleep(0.05)
  assert len(read_audit(model_dir)) == epoch, f"the kill did not land in epoch {epoch}"
  time.sleep(delay)
  cluster.kill_task(victim)


def assert_workers_count_every_attempt(line: dict, units: Sequence[int], batch: int) -> None:
  """A work queue's audit `line` (units of `units` batches, `batch` examples each): `workers`
  counts across attempts: each worker's batches are its units' (after their resumed_after)
  plus its parts of the units in flight at the resume, and they sum to the epoch; the
  examples sum to the dataset."""
  expected = {}
  for u in line["units"]:
    mine = u["batches"] - u.get("resumed_after", 0)
    expected[u["worker"]] = expected.get(u["worker"], 0) + mine
  for part in line.get("unit_parts", []):
    expected[part["worker"]] = expected.get(part["worker"], 0) + part["to"] - part["from"]
  workers = line["workers"]
  assert {w: s["batches"] for w, s in workers.items() if s["batches"]} == {
      w: b for w, b in expected.items() if b}, (line["epoch"], workers, expected)
  assert sum(s["batches"] for s in workers.values()) == sum(units), workers
  assert sum(s["examples"] for s in workers.values()) == sum(units) * batch, workers


def unit_steps(audit_line: dict, total_batches: int, batch_of) -> list:
  """A synchronous work-queue epoch's steps, rebuilt from its audit line: batch k of a unit went
  into step first_batch + k of the worker that trained it. Before a resume: the units done and
  the parts (`unit_parts`) of those in flight; after it: every unit from its `resumed_after`.
  `batch_of(unit_index, k)` gives the batch; each step is the list of its batches."""
  placed = []  # (step, unit, k)
  for part in audit_line.get("unit_parts", []):
    placed += [(part["first_batch"] + k, part["index"], k) for k in range(part["from"], part["to"])]
  for u in audit_line["units"]:
    placed += [(u["first_batch"] + k, u["index"], k)
               for k in range(u.get("resumed_after", 0), u["batches"])]
  assert len(placed) == total_batches == len({(i, k) for _, i, k in placed}), "a batch twice"
  steps = [[] for _ in range(max(s for s, _, _ in placed) + 1)]
  for step, index, k in placed:
    steps[step].append(batch_of(index, k))
  assert all(steps), "a step without a batch"
  return steps


def steps_sgd(params: dict, steps: list, gradients, learning_rate: float) -> dict:
  """The oracle over explicit steps: each applies the mean gradient of its batches."""
  from hooks.testing import oracle  # pylint: disable=g-import-not-at-top
  for batches in steps:
    params, _ = oracle.lockstep_sgd(params, [[b] for b in batches], gradients, learning_rate)
  return params


def names_the_dead(log: str, task: str, victim: str) -> bool:
  """Whether `task`'s log says `victim` died while it waited for it: named as the dead task,
  or beside it (`(also gone: ...)`) when one probe found a survivor gone too, one that had
  already exited because of the victim (docs/reliability.md, "How a dead task is noticed")."""
  named = [line for line in log.splitlines() if f"died while {task} waited for it" in line]
  return "TaskDiedError" in log and any(
      f"{victim} died while" in line or victim in line.partition("(also gone: ")[2]
      for line in named)
