"""A canned wide & deep CTR job on tf.Example files under estimator_ext, against a one-process run.

examples/ctr_train.py (DNNLinearCombinedClassifier, Ftrl + Adagrad, both synchronous, the
embeddings split over 2 ps, SUM_OVER_BATCH_SIZE) trains on TFRecord files sharded by file over a
chief and 2 workers (18/8/0 examples: uneven, one empty, a short last batch), with an
evaluator. tests/tasks/ctr_reference.py trains the same estimator in one process from the same
initial checkpoint, step s on the concatenation of the workers' step-s batches: after every
epoch every variable, the optimizers' slots included, must be equal. The same for
LinearClassifier (Ftrl) and DNNClassifier (Adagrad), one epoch without an evaluator.
"""

import functools
import json
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest

import cluster_checks
from examples import ctr_data
from hooks.epoch.audit import read_audit
from hooks.testing.local_cluster import LocalCluster

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.estimator]  # canned estimators

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FILE_SIZES, BATCH, NUM_EPOCHS = [18, 8, 0], 4, 2
BATCHES, EXAMPLES = [5, 2, 0], [18, 8, 0]  # per training task: 4+4+4+4+2, 4+4, nothing


def _write_data(data_dir):
  ctr_data.write_files(os.path.join(data_dir, "train"), FILE_SIZES)
  ctr_data.write_files(os.path.join(data_dir, "eval"), [16], first_index=ctr_data.EVAL_FIRST_INDEX)


def _run_and_compare(tmp_path, canned, num_epochs, has_evaluator):
  """Runs the job and its reference; asserts every variable after every epoch. Returns the audit."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  data_dir, model_dir = str(tmp_path / "data"), str(tmp_path / "model")
  _write_data(data_dir)
  with _Reference(tmp_path, data_dir, canned, num_epochs) as reference_run:
    command = [sys.executable, "-m", "examples.ctr_train", f"--data_dir={data_dir}",
               f"--model_dir={model_dir}", f"--num_epochs={num_epochs}", f"--batch_size={BATCH}",
               f"--warm_start_from={reference_run.init()}", f"--canned={canned}"]
    with LocalCluster(num_workers=3, num_ps=2, has_chief=True, has_evaluator=has_evaluator,
                      timeout_secs=300, log_dir=str(tmp_path / "logs")) as cluster:
      cluster.start(command)
      result = cluster.wait()
    reference = reference_run.result()
  result.check()
  assert reference["steps_per_epoch"] == max(BATCHES)
  assert "Traceback" not in "".join(t.log for t in result.tasks.values())
  names = cluster.training_task_names[:3]
  assert names == ["chief:0", "worker:0", "worker:1"]
  audit = read_audit(model_dir)
  assert [line["epoch"] for line in audit] == list(range(num_epochs))
  optimizers = 2 if canned == "wide_deep" else 1
  for line, want in zip(audit, reference["epochs"]):
    e, ckpt = line["epoch"], line["checkpoint"]
    got = {w: (s["batches"], s["examples"]) for w, s in line["workers"].items()}
    assert got == dict(zip(names, zip(BATCHES, EXAMPLES))), f"epoch {e}"
    # Wide & deep's head adds 1 to global_step per worker step (minimize without it); the
    # others pass global_step to minimize: one per synchronous step.
    steps = sum(BATCHES) if canned == "wide_deep" else max(BATCHES)
    assert line["global_step"] == steps * (e + 1)
    assert [cluster_checks.checkpoint_value(ckpt, f"epochsync_sync_{k}/sync_step")
            for k in range(optimizers)] == [max(BATCHES) * (e + 1)] * optimizers
    variables = [n for n, _ in tf.train.list_variables(want) if n != "global_step"]
    slot = {"wide_deep": ("/Ftrl", "/Adagrad"), "linear": ("/Ftrl",), "dnn": ("/Adagrad",)}
    assert all(any(n.endswith(s) for n in variables) for s in slot[canned])  # slots compared
    shapes = dict(tf.train.list_variables(want))
    for name in variables:
      np.testing.assert_allclose(
          _value(ckpt, name, shapes[name]), _value(want, name, shapes[name]),
          rtol=0, atol=1e-5, err_msg=f"{name} after epoch {e} != the one-process reference")
    moved = sum(np.abs(_value(want, n, shapes[n]) - _value(reference["init"], n, shapes[n])).sum()
                for n in variables if not re.search(r"/(Ftrl|Adagrad)", n))
    assert moved > 1e-3  # the model really trained
  return audit


@functools.lru_cache(maxsize=None)
def _reader(prefix):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return tf.train.load_checkpoint(prefix)


def _value(prefix, name, shape):
  """The variable `name`; for a slot of a partitioned variable saved in pieces (DNNClassifier
  names its Adagrad slots `.../t_0/Adagrad`, `.../t_1/Adagrad`, each holding one partition of
  fixed_size_partitioner(2) under the full shape), the rows that piece holds, NaN elsewhere."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  try:
    return _reader(prefix).get_tensor(name)
  except (ValueError, tf.errors.OpError):
    if not re.search(r"/t_\d+/", name):
      raise
  value = np.full(shape, np.nan, np.float32)
  first = (shape[0] + 1) // 2
  with tf.Graph().as_default(), tf.compat.v1.Session() as session:
    for start, rows in ((0, first), (first, shape[0] - first)):
      spec = " ".join(map(str, shape)) + f" {start},{rows}:" + ":".join(["-"] * (len(shape) - 1))
      try:
        value[start:start + rows] = session.run(tf.raw_ops.RestoreV2(
            prefix=prefix, tensor_names=[name], shape_and_slices=[spec], dtypes=[tf.float32]))[0]
      except tf.errors.OpError:
        pass  # this piece holds the other rows
  assert not np.isnan(value).all(), name
  return value


class _Reference:
  """tests/tasks/ctr_reference.py in a subprocess: its initial checkpoint comes first (the
  cluster job starts from it while the reference trains), its per-epoch checkpoints at the end."""

  def __init__(self, tmp_path, data_dir, canned, num_epochs):
    self._out = str(tmp_path / "reference")
    os.makedirs(self._out)
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    self._log = open(os.path.join(self._out, "log.txt"), "w")
    self._proc = subprocess.Popen(
        [sys.executable, os.path.join(ROOT, "tests", "tasks", "ctr_reference.py"),
         f"--data_dir={data_dir}", f"--out_dir={self._out}", f"--batch_size={BATCH}",
         "--num_workers=3", f"--reference_epochs={num_epochs}", f"--canned={canned}"],
        env=env, cwd=ROOT, stdout=self._log, stderr=subprocess.STDOUT)

  def __enter__(self):
    return self

  def _read(self, name, timeout_secs):
    path, deadline = os.path.join(self._out, name), time.monotonic() + timeout_secs
    while not os.path.exists(path):
      assert self._proc.poll() in (None, 0), f"the reference run failed: {self._out}/log.txt"
      assert time.monotonic() < deadline, f"no {name} after {timeout_secs} s: {self._out}/log.txt"
      time.sleep(0.2)
    with open(path) as f:  # written whole: renamed into place
      return json.load(f)

  def init(self):
    return self._read("init.json", 180)["init"]

  def result(self):
    assert self._proc.wait(timeout=240) == 0, f"the reference run failed: {self._out}/log.txt"
    return self._read("reference.json", 5)

  def __exit__(self, *exc):
    if self._proc.poll() is None:
      self._proc.kill()  # only our own child, on a failure path
      self._proc.wait()
    self._log.close()


@pytest.mark.timeout(480)
def test_canned_wide_deep_on_sparse_features_equals_the_one_process_reference(tmp_path):
  audit = _run_and_compare(tmp_path, "wide_deep", NUM_EPOCHS, has_evaluator=True)
  from tensorflow.python.training import py_checkpoint_reader as reader  # pylint: disable=all
  index = reader.NewCheckpointReader(audit[-1]["checkpoint"]).debug_string()
  slices = re.findall(rb"ad_weighted_by_ad_weight_embedding/embedding_weights\x00[^\n]* "
                      rb"\(DT_FLOAT\) \[(\d+),4\]", index)
  assert slices == [b"10", b"10"], "the ad embedding is not split in 2 partitions"
  evaluations = cluster_checks.eval_lines(str(tmp_path / "model"), "evaluator:0")
  assert [(l["epoch"], l["checkpoint"]) for l in evaluations] == [
      (line["epoch"], line["checkpoint"]) for line in audit]  # each epoch once, in order
  assert all(0 < l["metrics"]["loss"] < 5 for l in evaluations)


@pytest.mark.timeout(360)
@pytest.mark.parametrize("canned", [pytest.param("linear", marks=pytest.mark.variant), "dnn"])
def test_canned_linear_and_dnn_classifiers_equal_the_one_process_reference(tmp_path, canned):
  """LinearClassifier (Ftrl) and DNNClassifier (Adagrad): one synchronous optimizer each."""
  _run_and_compare(tmp_path, canned, num_epochs=1, has_evaluator=False)
