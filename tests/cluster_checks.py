"""Checks shared by the cluster tests: checkpoint values, task summaries, the numpy oracle."""

import glob
import json
import os

import numpy as np


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


def assert_equals_oracle(checkpoint: str, model: str, shards, num_epochs: int,
                         batch: int = 8, features: int = 16, learning_rate: float = 0.05):
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
  assert checkpoint_value(checkpoint, "global_step") == steps
  for name, value in expected.items():
    np.testing.assert_allclose(checkpoint_value(checkpoint, name), value, atol=1e-5,
                               err_msg=f"{name} differs from lockstep synchronous SGD")
