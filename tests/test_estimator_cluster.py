"""estimator_ext.train_and_evaluate on real clusters (chief, workers, ps, evaluator processes).

Every job runs on uneven shards with an empty one and must end by itself; the audit, the epoch
checkpoints, the evaluator's eval log and TensorBoard events, and the parameters (against the
numpy lockstep oracle) are checked, not just exit codes.
"""

import glob
import os
import re
import sys

import numpy as np
import pytest

import cluster_checks

from hooks.epoch.audit import read_audit
from hooks.testing import oracle
from hooks.testing.local_cluster import LocalCluster

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = [sys.executable, "-m", "examples.estimator_train"]
TASK = [sys.executable, os.path.join(ROOT, "tests", "tasks", "estimator_task.py")]
BATCH = 8


def _run(tmp_path, command, timeout_secs=120, **cluster_args):
  model_dir = str(tmp_path / "model")
  with LocalCluster(timeout_secs=timeout_secs, log_dir=str(tmp_path / "logs"),
                    has_chief=True, **cluster_args) as cluster:
    cluster.start(command + [f"--model_dir={model_dir}"])
    result = cluster.wait()
  result.check()
  logs = "".join(t.log for t in result.tasks.values())
  assert "Traceback" not in logs and "Exception in thread" not in logs
  return model_dir, result, cluster.training_task_names


def _load(checkpoint, name):
  import tensorflow as tf
  return tf.train.load_variable(checkpoint, name)


def _eval_log(model_dir, task):
  from estimator_ext import read_eval_log
  return read_eval_log(model_dir, task)


_summaries = cluster_checks.summaries


def _oracle_per_epoch(shards, num_epochs):
  """[(params, global_step, eval loss)] after each epoch of examples/estimator_train.py's job."""
  from examples import estimator_data as example  # Not estimator_train: no flags here.
  data = []
  for shard_id, n in enumerate(shards):
    x, y = example.shard_arrays(shard_id, n)
    data.append([(x[i:i + BATCH], y[i:i + BATCH]) for i in range(0, len(y), BATCH)])
  eval_x, eval_y = example.shard_arrays(example.EVAL_SHARD, example.EVAL_BATCHES)
  out = []
  for e in range(num_epochs):
    params, step = oracle.lockstep_sgd({"w": np.zeros(example.FEATURES), "b": np.zeros(())},
                                       data, oracle.linear_mse_gradients, learning_rate=0.05,
                                       num_epochs=e + 1)
    loss = float(np.mean((eval_x @ params["w"] + params["b"] - eval_y) ** 2))
    out.append((params, step, loss))
  return out


def _assert_epochs_exact(model_dir, names, shards, num_epochs, steps_per_epoch):
  """The audit: every shard trained once per epoch; one checkpoint per epoch, nothing else."""
  audit = read_audit(model_dir)
  assert [line["epoch"] for line in audit] == list(range(num_epochs))
  for line in audit:
    e = line["epoch"]
    assert {w: s["batches"] for w, s in line["workers"].items()} == dict(zip(names, shards))
    assert {w: s["examples"] for w, s in line["workers"].items()} == {
        w: BATCH * n for w, n in zip(names, shards)}
    assert line["global_step"] == steps_per_epoch * (e + 1)
    ckpt = line["checkpoint"]
    assert os.path.basename(ckpt) == f"model.ckpt-epoch{e:04d}-{steps_per_epoch * (e + 1)}"
    assert list(_load(ckpt, "epochsync/done_epochs")) == [e + 1] * len(names)
    assert _load(ckpt, "epochsync/completed_epochs") == e + 1
  assert len(glob.glob(os.path.join(model_dir, "model.ckpt-*.index"))) == num_epochs
  return audit


def _assert_evaluator_saw_every_epoch(model_dir, audit):
  """evaluator:0 evaluated each epoch's own checkpoint once, in order, and wrote TensorBoard."""
  import tensorflow as tf
  lines = _eval_log(model_dir, "evaluator:0")
  assert [line["epoch"] for line in lines] == [line["epoch"] for line in audit]
  for line, epoch in zip(lines, audit):
    assert line["checkpoint"] == epoch["checkpoint"]
    assert line["global_step"] == line["metrics"]["global_step"] == epoch["global_step"]
  events = sorted(glob.glob(os.path.join(model_dir, "eval", "events.out.tfevents.*")))
  steps = [e.step for path in events for e in tf.compat.v1.train.summary_iterator(path)
           if any(v.tag == "loss" for v in e.summary.value)]
  assert steps == [line["global_step"] for line in audit]
  return lines


@pytest.mark.timeout(180)
def test_custom_model_fn_sync_with_evaluator_equals_oracle(tmp_path):
  """The documented job itself (examples/estimator_train.py): chief + 2 workers, 1 ps, evaluator."""
  shards, num_epochs = (6, 3, 0), 3
  model_dir, result, names = _run(
      tmp_path, EXAMPLE + ["--shard_batches=6,3,0", f"--num_epochs={num_epochs}"],
      num_workers=3, num_ps=1, has_evaluator=True)
  assert names[:3] == ["chief:0", "worker:0", "worker:1"]
  audit = _assert_epochs_exact(model_dir, names[:3], shards, num_epochs, max(shards))
  want = _oracle_per_epoch(shards, num_epochs)
  for line, (params, step, _) in zip(audit, want):
    assert line["global_step"] == step
    for name, value in params.items():
      np.testing.assert_allclose(_load(line["checkpoint"], name), value, rtol=0, atol=1e-5,
                                 err_msg=f"{name} after epoch {line['epoch']} != lockstep SGD")
  evaluations = _assert_evaluator_saw_every_epoch(model_dir, audit)
  np.testing.assert_allclose([l["metrics"]["loss"] for l in evaluations],
                             [loss for _, _, loss in want], rtol=1e-4)
  assert evaluations[-1]["metrics"]["loss"] < 0.2 * evaluations[0]["metrics"]["loss"]
  # No staggered start, no 30 s re-check: the chief passed the start barrier within seconds.
  waited = re.search(r"chief:0 passed start, epoch 0, after ([\d.]+) s",
                     result.tasks["chief:0"].log)
  assert waited and float(waited.group(1)) < 20, waited


@pytest.mark.timeout(180)
def test_the_evaluator_outlives_an_epoch_longer_than_its_timeout(tmp_path):
  """evaluator_timeout_secs=15, an epoch of 40 s (20 batches of 2 s): the evaluator's wait for
  the epoch's checkpoint counts only time without training progress, so it evaluates it."""
  model_dir, result, _ = _run(
      tmp_path, TASK + ["--shard_batches=20,0", "--epochsync_num_epochs=1",
                        "--step_sleep_secs=2", "--evaluator_timeout_secs=15"],
      timeout_secs=150, num_workers=2, num_ps=1, has_evaluator=True)
  audit = read_audit(model_dir)
  epoch = audit[0]["workers"]["chief:0"]
  assert epoch["arrived_at"] - epoch["started_at"] > 38, epoch  # The epoch outlasted 15 s ...
  assert [line["epoch"] for line in _eval_log(model_dir, "evaluator:0")] == [0]  # ... and the wait.


@pytest.mark.variant  # (asynchronous Estimators: test_estimator_work_queue, test_elastic_cluster)
@pytest.mark.timeout(180)
def test_custom_model_fn_async_with_evaluator_is_still_epoch_exact(tmp_path):
  """--noepochsync_sync from the flags: each worker applies its own gradients, epochs exact."""
  shards, num_epochs = (6, 3, 0), 3
  model_dir, result, names = _run(
      tmp_path, TASK + ["--shard_batches=6,3,0", f"--epochsync_num_epochs={num_epochs}",
                        "--noepochsync_sync"],
      num_workers=3, num_ps=1, has_evaluator=True)
  audit = _assert_epochs_exact(model_dir, names[:3], shards, num_epochs, sum(shards))
  import tensorflow as tf
  assert not [n for n, _ in tf.train.list_variables(audit[-1]["checkpoint"]) if "sync_step" in n]
  assert "tf-epochsync: chief:0 trains 3 epoch(s) asynchronously" in result.tasks["chief:0"].log
  _assert_evaluator_saw_every_epoch(model_dir, audit)
  summaries = _summaries(model_dir)
  assert {t: s["epochs_trained"] for t, s in summaries.items() if t != "evaluator:0"} == {
      n: [0, 1, 2] for n in names[:3]}
  assert sorted(summaries["evaluator:0"]["per_epoch"]) == ["0", "1", "2"]


@pytest.mark.timeout(240)
def test_canned_wide_deep_two_sync_optimizers_embedding_over_two_ps(tmp_path):
  """DNNLinearCombinedRegressor: Adagrad (dnn) and Ftrl (linear) aggregate the same steps."""
  shards, num_epochs = (5, 3, 0), 2
  model_dir, _, names = _run(
      tmp_path, TASK + ["--model=wide_deep", "--shard_batches=5,3,0",
                        f"--epochsync_num_epochs={num_epochs}"],
      num_workers=3, num_ps=2, has_evaluator=True)
  # The canned head adds 1 to global_step per worker step: one per batch of every shard.
  audit = _assert_epochs_exact(model_dir, names[:3], shards, num_epochs, sum(shards))
  for line in audit:  # Both optimizers took one synchronous step per step of the longest shard.
    e, ckpt = line["epoch"], line["checkpoint"]
    assert [_load(ckpt, f"epochsync_sync_{k}/sync_step") for k in (0, 1)] == [
        max(shards) * (e + 1)] * 2
  from tensorflow.python.training import py_checkpoint_reader as reader  # pylint: disable=all
  index = reader.NewCheckpointReader(audit[-1]["checkpoint"]).debug_string()
  slices = re.findall(rb"id_embedding/embedding_weights\x00[^\n]* \(DT_FLOAT\) \[(\d+),4\]", index)
  assert slices == [b"10", b"10"], "the embedding is not split in 2 partitions"
  assert len(glob.glob(audit[-1]["checkpoint"] + ".data-*-of-00002")) == 2  # held by 2 ps
  _assert_evaluator_saw_every_epoch(model_dir, audit)


@pytest.mark.timeout(360)
def test_canned_optimizers_by_name_and_callable_train_as_the_instances(tmp_path):
  """Wide & deep with sync_optimizer("Ftrl") and a callable (a global_step decay) = instances."""
  import tensorflow as tf
  final = []
  for form in ("canned_defaults", "names_and_callables"):
    model_dir, _, names = _run(
        tmp_path / form, TASK + ["--model=wide_deep", "--shard_batches=3,2",
                                 "--epochsync_num_epochs=1", "--tf_random_seed=1",
                                 f"--optimizers={form}"], timeout_secs=150, num_workers=2,
        num_ps=1)
    audit = _assert_epochs_exact(model_dir, names[:2], (3, 2), 1, 5)
    ckpt = audit[-1]["checkpoint"]
    final.append({name: _load(ckpt, name) for name, _ in tf.train.list_variables(ckpt)})
  want, got = final
  assert sorted(got) == sorted(want)
  assert want["epochsync_sync_0/sync_step"] == want["epochsync_sync_1/sync_step"] == 3
  assert [k for k in want if "Ftrl" in k] and [k for k in want if "Adagrad" in k]
  for name, value in want.items():
    np.testing.assert_allclose(got[name], value, rtol=1e-6, atol=1e-7, err_msg=name)


@pytest.mark.timeout(150)
def test_in_loop_early_stopping_stops_every_task_after_the_same_epoch(tmp_path):
  """The chief evaluates each epoch before releasing it; the loss stops improving by 0.3."""
  from estimator_ext.early_stopping import EarlyStopping, EarlyStoppingState
  shards, num_epochs, rule = (4, 2), 6, EarlyStopping("loss", patience=1, min_delta=0.3)
  want = _oracle_per_epoch(shards, num_epochs)
  state = EarlyStoppingState(rule)
  expected = next(e for e, (_, _, loss) in enumerate(want) if state.update(e, {"loss": loss}))
  assert expected == 3  # Inside the run: epochs 4 and 5 must not be trained.
  model_dir, _, names = _run(
      tmp_path, TASK + ["--shard_batches=4,2", f"--epochsync_num_epochs={num_epochs}",
                        "--early_stopping_patience=1", "--early_stopping_min_delta=0.3"],
      num_workers=2, num_ps=1)
  audit = _assert_epochs_exact(model_dir, names, shards, expected + 1, max(shards))
  assert [bool(line.get("early_stop")) for line in audit] == [False] * expected + [True]
  assert re.match(r"early stopping: loss=0.3825\d* in epoch 3; no epoch since epoch 2 "
                  r"\(loss=0.6052\d*\) was lower by more than min_delta=0.3 for 1 epoch\(s\)",
                  audit[-1]["early_stop"])
  np.testing.assert_allclose([line["eval"]["loss"] for line in audit],
                             [loss for _, _, loss in want[:expected + 1]], rtol=1e-4)
  summaries = _summaries(model_dir)
  assert {t: (s["epochs_trained"], s["stopped_after"]) for t, s in summaries.items()} == {
      name: ([0, 1, 2, 3], 3) for name in names}
  assert [line["epoch"] for line in _eval_log(model_dir, "chief:0")] == [0, 1, 2, 3]


@pytest.mark.timeout(150)
def test_the_evaluator_names_training_tasks_that_failed_before_the_run_record(tmp_path):
  """Every training task's input_fn raises (a bad --shard_batches) before any server is up: the
  evaluator (start-up timeout 600 s) exits non-zero within seconds of the last one, naming them."""
  model_dir = str(tmp_path / "model")
  with LocalCluster(num_workers=3, num_ps=1, has_chief=True, has_evaluator=True,
                    timeout_secs=120, fail_fast_secs=None,
                    log_dir=str(tmp_path / "logs")) as cluster:
    cluster.start(EXAMPLE + [f"--model_dir={model_dir}", "--shard_batches=x,y,z"])
    result = cluster.wait()
  training = [result.tasks[n] for n in ("chief:0", "worker:0", "worker:1")]
  evaluator = result.tasks["evaluator:0"]
  assert all(t.returncode not in (0, None) and not t.timed_out for t in training + [evaluator])
  assert evaluator.ended_at - max(t.ended_at for t in training) < 30  # seconds, not 600
  # It gives up at the first failed task it finds (the job cannot go on without it), so which
  # of the three it names depends on who failed first; each is named with its error.
  found = re.search(r"evaluator:0 stopped waiting for chief:0's run record in .*: training "
                    r"task\(s\) ((?:chief|worker):\d(?:, (?:chief|worker):\d)*) failed \("
                    r"(?:chief|worker):\d: ValueError: invalid literal for int\(\)", evaluator.log)
  assert found, evaluator.tail()
  assert set(found.group(1).split(", ")) <= {"chief:0", "worker:0", "worker:1"}
