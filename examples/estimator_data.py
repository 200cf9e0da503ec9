"""The data of the Estimator example job (no flags, so tests can import it beside any example).

Typical usage:
  x, y = shard_arrays(shard_id=1, num_batches=5)   # one task's shard: x [40, 16], y [40]
"""

import numpy as np

__all__ = ["BATCH_SIZE", "FEATURES", "EVAL_BATCHES", "EVAL_SHARD", "shard_arrays"]

BATCH_SIZE, FEATURES, EVAL_BATCHES = 8, 16, 4
EVAL_SHARD = 100  # The eval set is the shard no task trains on.


def shard_arrays(shard_id: int, num_batches: int):
  """(x [n, FEATURES], y [n]) of one shard, y = x . linspace(-1, 1) + 0.5; fixed per shard_id."""
  rng = np.random.default_rng(1000 + shard_id)
  x = rng.normal(size=(num_batches * BATCH_SIZE, FEATURES)).astype(np.float32)
  return x, x @ np.linspace(-1.0, 1.0, FEATURES, dtype=np.float32) + np.float32(0.5)
