"""Sparse features on a real cluster: parsed tf.Example files through the MonitoredSession drop-in.

tests/tasks/sparse_task.py trains a safe_embedding_lookup_sparse model (its table split over 2
ps) on TFRecord files sharded by file over 3 workers (uneven, one worker's shard empty,
short last batches); the parameters must equal lockstep synchronous SGD computed in numpy.
"""

import glob
import os
import re
import sys

import numpy as np
import pytest

import cluster_checks
from examples import ctr_data
from hooks.epoch.audit import read_audit
from hooks.testing import oracle
from hooks.testing.local_cluster import LocalCluster

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TASK = [sys.executable, os.path.join(ROOT, "tests", "tasks", "sparse_task.py")]
FILE_SIZES = [18, 8, 0, 5]  # 3 workers: worker id 0 reads files 0 and 3, 1 file 1, 2 file 2
BATCH = 4
LEARNING_RATE, EMBEDDING_DIM, PRICE_WEIGHT = 0.1, 3, 0.5  # as in tests/tasks/sparse_task.py


def _weighted_embedding_gradients(params, batch):
  """Gradients of mean((sum_j w_j * sum(emb[id_j]) + a * price + b - label)^2) of one batch."""
  emb = params["ad_embedding"]
  prediction = np.array([sum(w * emb[i].sum() for i, w in zip(e["ad"], e["ad_weight"])) +
                         params["price_weight"] * e["price"][0] + params["bias"] for e in batch])
  residual = 2.0 / len(batch) * (prediction - np.array([e["label"][0] for e in batch]))
  d_emb = np.zeros_like(emb)
  for r, e in zip(residual, batch):
    for i, w in zip(e["ad"], e["ad_weight"]):
      d_emb[i] += r * w
  return {"ad_embedding": d_emb,
          "price_weight": np.asarray(sum(r * e["price"][0] for r, e in zip(residual, batch))),
          "bias": np.asarray(residual.sum())}


def _shard_batches(num_workers):
  """Per worker id, its batches of examples (dicts), as its files read in order give them."""
  shards = []
  for w in range(num_workers):
    examples = [e for i in ctr_data.shard_files(range(len(FILE_SIZES)), w, num_workers)
                for e in ctr_data.example_values(i, FILE_SIZES[i])]
    shards.append([examples[i:i + BATCH] for i in range(0, len(examples), BATCH)])
  return shards


@pytest.mark.timeout(180)
def test_safe_embedding_lookup_sparse_over_two_ps_equals_the_numpy_oracle(tmp_path):
  data_dir, model_dir, num_epochs = str(tmp_path / "data"), str(tmp_path / "model"), 2
  ctr_data.write_files(data_dir, FILE_SIZES)
  command = TASK + [f"--data_dir={data_dir}", f"--model_dir={model_dir}",
                    f"--batch_size={BATCH}", f"--epochsync_num_epochs={num_epochs}",
                    "--epochsync_barrier_timeout_secs=60", "--epochsync_startup_timeout_secs=60",
                    "--epochsync_warn_after_secs=20"]
  with LocalCluster(num_workers=3, num_ps=2, timeout_secs=150,
                    log_dir=str(tmp_path / "logs")) as cluster:
    cluster.start(command)
    result = cluster.wait()
  result.check()
  assert "Traceback" not in "".join(t.log for t in result.tasks.values())
  names = cluster.training_task_names
  shards = _shard_batches(len(names))
  batches = [len(s) for s in shards]
  examples = [sum(len(b) for b in s) for s in shards]
  assert batches == [6, 2, 0] and examples == [23, 8, 0]  # uneven, one empty, short batches
  audit = read_audit(model_dir)
  assert [line["epoch"] for line in audit] == list(range(num_epochs))
  for line in audit:
    got = {w: (s["batches"], s["examples"]) for w, s in line["workers"].items()}
    assert got == dict(zip(names, zip(batches, examples))), line["epoch"]
    assert line["global_step"] == max(batches) * (line["epoch"] + 1)
  start = {"ad_embedding": np.zeros((ctr_data.AD_IDS, EMBEDDING_DIM)),
           "price_weight": np.asarray(PRICE_WEIGHT), "bias": np.zeros(())}
  want, steps = oracle.lockstep_sgd(start, shards, _weighted_embedding_gradients,
                                    learning_rate=LEARNING_RATE, num_epochs=num_epochs)
  ckpt = audit[-1]["checkpoint"]
  assert cluster_checks.checkpoint_value(ckpt, "global_step") == steps
  assert np.abs(want["ad_embedding"]).sum() > 1.0  # the embedding really trained
  for name, value in want.items():
    np.testing.assert_allclose(cluster_checks.checkpoint_value(ckpt, name), value, rtol=0,
                               atol=1e-5, err_msg=f"{name} != lockstep synchronous SGD")
  from tensorflow.python.training import py_checkpoint_reader as reader  # pylint: disable=all
  index = reader.NewCheckpointReader(ckpt).debug_string()
  slices = re.findall(rb"ad_embedding\x00[^\n]* \(DT_FLOAT\) \[(\d+),3\]", index)
  assert slices == [b"10", b"10"], "the table is not split in 2 partitions"
  assert len(glob.glob(ckpt + ".data-*-of-00002")) == 2  # held by 2 ps
  summaries = cluster_checks.summaries(model_dir)
  assert {t: s["files"] for t, s in summaries.items()} == {
      names[0]: ["part-00000.tfrecord", "part-00003.tfrecord"],
      names[1]: ["part-00001.tfrecord"], names[2]: ["part-00002.tfrecord"]}  # empty file
