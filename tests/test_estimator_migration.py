"""Existing Estimator jobs keep their checkpoints: estimator_ext switched on over a stock
checkpoint and off again, WarmStartSettings, and export_saved_model of a tf-epochsync model.

The stock job is examples/estimator_before.py in one process (no TF_CONFIG); the switched-on
job is examples/estimator_train.py's model under estimator_ext.train_and_evaluate on a real
cluster (chief + worker + ps, sync on). Parameters are checked against the numpy oracle of
lockstep synchronous SGD started from the checkpoint's own parameters.
"""

import json
import os
import shutil
import subprocess
import sys
import types

import numpy as np
import pytest

from hooks.epoch.audit import read_audit
from hooks.testing import oracle
from hooks.testing.local_cluster import LocalCluster

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TASKS = os.path.join(ROOT, "tests", "tasks")
ESTIMATOR_TASK = [sys.executable, os.path.join(TASKS, "estimator_task.py")]
BATCH, LEARNING_RATE = 8, 0.05
# What a tf-epochsync Estimator checkpoint holds beside the model (docs/migration.md lists them):
# the barrier's, the done counter's, the mid-epoch position's and the synchronous optimizer's
# graph_keys.STATE_VARIABLES.
EPOCHSYNC_STATE = {"epochsync/completed_epochs", "epochsync/arrived_barrier",
                   "epochsync/done_epochs", "epochsync_sync_0/progress",
                   "epochsync_sync_0/completed_epochs", "epochsync_sync_0/sync_step",
                   "epochsync/mid_epoch/position", "epochsync/mid_epoch/shard_batches",
                   "epochsync/mid_epoch/applied"}
MODEL = {"w", "b", "global_step"}


def _load(checkpoint, name):
  import tensorflow as tf
  return tf.train.load_variable(checkpoint, name)


def _names(checkpoint):
  import tensorflow as tf
  return set(tf.train.load_checkpoint(checkpoint).get_variable_to_shape_map())


def _params(checkpoint):
  return {name: np.asarray(_load(checkpoint, name), np.float64) for name in ("w", "b")}


def _batches(shards):
  """Each training task's batches, by its id in the cluster (chief 0, worker:i i+1)."""
  from examples import estimator_data  # no flags: safe beside other test modules
  data = [estimator_data.shard_arrays(shard_id, n) for shard_id, n in enumerate(shards)]
  return [[(x[i:i + BATCH], y[i:i + BATCH]) for i in range(0, len(y), BATCH)] for x, y in data]


def _lockstep(start, shards, num_epochs):
  params, _ = oracle.lockstep_sgd(start, _batches(shards), oracle.linear_mse_gradients,
                                  learning_rate=LEARNING_RATE, num_epochs=num_epochs)
  return params


def _assert_params(checkpoint, expected, what):
  for name, value in expected.items():
    np.testing.assert_allclose(_load(checkpoint, name), value, rtol=0, atol=1e-5,
                               err_msg=f"{name} {what}")


def _run_local(args, timeout=120):
  """One process without TF_CONFIG (a stock Estimator job or a task in local mode)."""
  env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
  env.update(PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="1")
  proc = subprocess.run([sys.executable] + args, cwd=ROOT, env=env, capture_output=True,
                        text=True, timeout=timeout)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  return proc.stdout + proc.stderr


def _checked(result):
  result.check()
  logs = "".join(t.log for t in result.tasks.values())
  assert "Traceback" not in logs and "Exception in thread" not in logs
  return result


def _run_cluster(log_dir, args, num_workers):
  with LocalCluster(num_workers=num_workers, num_ps=1, has_chief=True, timeout_secs=150,
                    log_dir=log_dir) as cluster:
    cluster.start(ESTIMATOR_TASK + args)
    return _checked(cluster.wait())


def _stock(model_dir, shard_batches, num_epochs):
  """examples/estimator_before.py: the stock job (tf.estimator.train_and_evaluate)."""
  return _run_local(["-m", "examples.estimator_before", f"--model_dir={model_dir}",
                     f"--shard_batches={shard_batches}", f"--num_epochs={num_epochs}"])


STOCK_SHARD, STOCK_EPOCHS = 3, 2   # the stock job: 6 asynchronous steps in one process
ON_SHARDS, ON_EPOCHS = (3, 2), 2   # switched on: chief:0 3 batches, worker:0 2; 2 epochs


@pytest.fixture(scope="module")
def switched_on(tmp_path_factory):
  """A stock Estimator job's model_dir, then estimator_ext (sync, 2 workers) on the same dir."""
  import tensorflow as tf
  root = tmp_path_factory.mktemp("estimator_migration")
  model_dir, stock_dir = str(root / "model"), str(root / "stock")
  _stock(model_dir, STOCK_SHARD, STOCK_EPOCHS)
  stock_ckpt = tf.train.latest_checkpoint(model_dir)
  shutil.copytree(model_dir, stock_dir)  # for the warm starts below
  shards = "--shard_batches=" + ",".join(map(str, ON_SHARDS))
  second_dir = str(root / "second")
  with LocalCluster(num_workers=len(ON_SHARDS), num_ps=1, has_chief=True, timeout_secs=150,
                    log_dir=str(root / "logs-on")) as cluster:
    cluster.start(ESTIMATOR_TASK + [f"--model_dir={model_dir}", shards,
                                    f"--epochsync_num_epochs={ON_EPOCHS}"])
    first_chief_log = _checked(cluster.wait()).tasks["chief:0"].log  # before restart renames it
    # A second job (a fresh model_dir) on the same ps task, which kept running.
    for name in cluster.training_task_names:
      cluster.restart_task(name, ESTIMATOR_TASK + [f"--model_dir={second_dir}", shards,
                                                   "--epochsync_num_epochs=1"])
    second = _checked(cluster.wait())
  return types.SimpleNamespace(
      root=root, model_dir=model_dir, stock_dir=stock_dir, second_dir=second_dir,
      stock_checkpoint=os.path.join(stock_dir, os.path.basename(stock_ckpt)),
      stock_params=_params(stock_ckpt), stock_step=int(_load(stock_ckpt, "global_step")),
      audit=read_audit(model_dir), chief_log=first_chief_log,
      second_chief_log=second.tasks["chief:0"].log)


@pytest.mark.cluster
@pytest.mark.slow
@pytest.mark.timeout(360)
def test_switch_on_over_a_stock_estimator_checkpoint(switched_on):
  """Every model variable restored, global_step kept, tf-epochsync's state fresh, oracle exact."""
  run = switched_on
  assert run.stock_step == STOCK_SHARD * STOCK_EPOCHS
  assert not _names(run.stock_checkpoint) & EPOCHSYNC_STATE  # a stock checkpoint
  assert [line["epoch"] for line in run.audit] == [0, 1]  # epoch counting starts at 0
  steps = max(ON_SHARDS)
  assert [line["global_step"] for line in run.audit] == [run.stock_step + steps,
                                                         run.stock_step + 2 * steps]
  for line in run.audit:
    e, ckpt = line["epoch"], line["checkpoint"]
    assert {w: s["batches"] for w, s in line["workers"].items()} == {"chief:0": 3, "worker:0": 2}
    _assert_params(ckpt, _lockstep(run.stock_params, ON_SHARDS, e + 1),
                   f"after epoch {e} != lockstep SGD from the stock checkpoint's parameters")
    assert _load(ckpt, "epochsync/completed_epochs") == e + 1
    assert list(_load(ckpt, "epochsync/done_epochs")) == [e + 1, e + 1]
    assert _load(ckpt, "epochsync_sync_0/sync_step") == steps * (e + 1)  # counted from 0
  assert "tf-epochsync's own state starts fresh" in run.chief_log
  assert "epochsync/completed_epochs is not in the checkpoint" in run.chief_log
  assert "epoch counting starts at 0 for this run" in run.chief_log


@pytest.mark.cluster
@pytest.mark.slow
@pytest.mark.timeout(360)
def test_a_second_estimator_job_on_the_still_running_ps(switched_on):
  """The same ps task serves a second job (fresh model_dir): its chief drains what the first
  left (RunStartHook, before the sync optimizer's chief init) and it trains exactly."""
  run = switched_on
  audit = read_audit(run.second_dir)
  assert [(line["epoch"], line["global_step"]) for line in audit] == [(0, max(ON_SHARDS))]
  zeros = {"w": np.zeros_like(run.stock_params["w"]), "b": np.zeros(())}
  _assert_params(audit[0]["checkpoint"], _lockstep(zeros, ON_SHARDS, 1),
                 "of the second job != lockstep SGD from zeros")
  assert "the ps-side queues and accumulators are clean" in run.second_chief_log


@pytest.mark.cluster
@pytest.mark.slow
@pytest.mark.timeout(360)
def test_switch_off_again_the_stock_estimator_job_goes_on(switched_on):
  """The stock job restores the tf-epochsync checkpoint (extra state ignored) and trains on."""
  import tensorflow as tf
  run = switched_on
  last = run.audit[-1]["checkpoint"]
  # load_checkpoint users: the model under its own names, beside the listed extra state.
  assert _names(last) == MODEL | EPOCHSYNC_STATE
  model_dir = str(run.root / "off")
  shutil.copytree(run.model_dir, model_dir)
  assert os.path.dirname(tf.train.latest_checkpoint(model_dir)) == model_dir
  _stock(model_dir, 2, 1)  # 2 more asynchronous steps on shard 0
  final = tf.train.latest_checkpoint(model_dir)
  assert _load(final, "global_step") == run.audit[-1]["global_step"] + 2
  _assert_params(final, _lockstep(_params(last), (2,), 1),
                 "!= 2 SGD steps from the tf-epochsync checkpoint's parameters")
  assert _names(final) == MODEL  # the stock job saves only its own variables


@pytest.mark.cluster
@pytest.mark.slow
@pytest.mark.timeout(360)
def test_a_relaunch_with_more_workers_goes_on_from_the_epoch_checkpoint(switched_on):
  """The job of 2 training tasks relaunched with 3 (shards re-cut by the new count) trains
  epoch 2: epoch counting goes on, the per-worker state is resized, oracle exact."""
  run = switched_on
  model_dir = str(run.root / "more")
  shutil.copytree(run.model_dir, model_dir)
  shards = (2, 1, 3)
  result = _run_cluster(str(run.root / "logs-more"),
                        [f"--model_dir={model_dir}", "--shard_batches=2,1,3",
                         "--epochsync_num_epochs=3"], num_workers=len(shards))
  audit = read_audit(model_dir)
  assert [(line["epoch"], len(line["workers"])) for line in audit] == [(0, 2), (1, 2), (2, 3)]
  assert audit[-1]["global_step"] == run.audit[-1]["global_step"] + max(shards)
  _assert_params(audit[-1]["checkpoint"], _lockstep(_params(run.audit[-1]["checkpoint"]),
                                                    shards, 1),
                 "after epoch 2 on 3 workers != lockstep SGD from epoch 1's parameters")
  assert list(_load(audit[-1]["checkpoint"], "epochsync/done_epochs")) == [3, 3, 3]
  assert "has shape [2] there and [3] here" in result.tasks["chief:0"].log


@pytest.mark.slow
@pytest.mark.timeout(360)
def test_export_saved_model_holds_no_epochsync_state_and_serves_the_checkpoint(switched_on):
  """export_saved_model of the tf-epochsync model: model variables only, same predictions."""
  import tensorflow as tf
  from tensorflow.core.protobuf import saved_model_pb2  # pylint: disable=g-direct-tensorflow-import
  from examples import estimator_data
  run = switched_on
  export_base = str(run.root / "export")
  _run_local([os.path.join(TASKS, "estimator_export.py"), f"--model_dir={run.model_dir}",
              f"--export_base={export_base}"])
  with open(os.path.join(export_base, "export.json")) as f:
    export = json.load(f)
  checkpoint, path = export["checkpoint"], export["saved_model"]
  assert os.path.basename(checkpoint) == os.path.basename(run.audit[-1]["checkpoint"])
  assert EPOCHSYNC_STATE <= _names(checkpoint)  # exported from a checkpoint that holds it
  assert _names(os.path.join(path, "variables", "variables")) == MODEL
  model = saved_model_pb2.SavedModel()
  with open(os.path.join(path, "saved_model.pb"), "rb") as f:
    model.ParseFromString(f.read())
  nodes = [n for g in model.meta_graphs for n in g.graph_def.node]
  nodes += [n for g in model.meta_graphs for fn in g.graph_def.library.function
            for n in fn.node_def]
  assert nodes
  assert not [n.name for n in nodes if "epochsync" in n.name.lower()]
  assert not [n.op for n in nodes if "Queue" in n.op or "Accumulator" in n.op]
  x, _ = estimator_data.shard_arrays(estimator_data.EVAL_SHARD, estimator_data.EVAL_BATCHES)
  with tf.Graph().as_default() as graph, tf.compat.v1.Session(graph=graph) as sess:
    meta = tf.compat.v1.saved_model.loader.load(sess, ["serve"], path)
    signature = meta.signature_def["serving_default"]
    served = sess.run(signature.outputs["output"].name, {signature.inputs["x"].name: x})
  params = _params(checkpoint)
  np.testing.assert_allclose(served, x @ params["w"] + params["b"], rtol=0, atol=1e-5)
  np.testing.assert_allclose(params["w"], _lockstep(run.stock_params, ON_SHARDS, ON_EPOCHS)["w"],
                             atol=1e-5)  # the trained model, not a fresh one


@pytest.mark.cluster
@pytest.mark.slow
@pytest.mark.timeout(360)
def test_warm_start_settings_from_a_checkpoint_of_another_worker_count(switched_on):
  """WarmStartSettings(vars_to_warm_start=[".*"]): every global variable is warm-started as in
  stock, except tf-epochsync's own state, which starts fresh (the source holds it for 2 workers,
  this job has 3)."""
  run = switched_on
  source = run.audit[-1]["checkpoint"]
  model_dir, shards = str(run.root / "warm"), (2, 1, 0)
  result = _run_cluster(str(run.root / "logs-warm"), [
      f"--model_dir={model_dir}", "--shard_batches=2,1,0", "--epochsync_num_epochs=2",
      f"--warm_start_from={source}", "--warm_start_vars=.*"], num_workers=3)
  assert ("Warm start leaves out tf-epochsync's own state (it starts fresh): "
          "epochsync_sync_0/completed_epochs, epochsync_sync_0/progress, "
          "epochsync_sync_0/sync_step") in result.tasks["chief:0"].log
  audit = read_audit(model_dir)
  source_step = run.audit[-1]["global_step"]
  assert [(line["epoch"], line["global_step"]) for line in audit] == [
      (0, source_step + 2), (1, source_step + 4)]  # global_step is a global variable too
  for line in audit:
    e, ckpt = line["epoch"], line["checkpoint"]
    _assert_params(ckpt, _lockstep(_params(source), shards, e + 1),
                   f"after epoch {e} != lockstep SGD from the warm-start source's parameters")
    assert _load(ckpt, "epochsync_sync_0/sync_step") == 2 * (e + 1)  # not the source's 6
    assert len(_load(ckpt, "epochsync_sync_0/progress")) == 3  # resized for 3 workers
    assert _load(ckpt, "epochsync/completed_epochs") == e + 1


@pytest.mark.slow
@pytest.mark.timeout(360)
def test_warm_start_settings_default_regex_in_local_mode(switched_on):
  """The default WarmStartSettings (trainable variables) from the stock checkpoint, one process:
  epoch 0 starts from the stock parameters, global_step from 0."""
  run = switched_on
  model_dir = str(run.root / "warm-local")
  _run_local([os.path.join(TASKS, "estimator_task.py"), f"--model_dir={model_dir}",
              "--shard_batches=2", "--epochsync_num_epochs=2",
              f"--warm_start_from={run.stock_checkpoint}"])
  audit = read_audit(model_dir)
  assert [(line["epoch"], line["global_step"]) for line in audit] == [(0, 2), (1, 4)]
  for line in audit:
    _assert_params(line["checkpoint"], _lockstep(run.stock_params, (2,), line["epoch"] + 1),
                   f"after epoch {line['epoch']} != SGD from the stock checkpoint's parameters")
