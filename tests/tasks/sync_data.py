"""Fixed per-worker data of the sync oracle tests (numpy only: the test process and the tasks share it).

Typical usage:
  shards = linear_shards([7, 4, 1])   # shards[worker_id] = [(x [B, D], y [B]), ...], no shuffling
"""

from typing import List, Sequence, Tuple

import numpy as np

__all__ = ["linear_shards", "embedding_shards", "LEARNING_RATE", "DIM", "VOCAB", "EMB_DIM"]

LEARNING_RATE = 0.1
DIM = 3          # linear model: y = x . w + b
VOCAB, EMB_DIM = 10, 2  # embedding model: y = sum(emb[id]) + b


def linear_shards(shard_batches: Sequence[int], batch_size: int = 4, seed: int = 0
                  ) -> List[List[Tuple[np.ndarray, np.ndarray]]]:
  """Worker i gets shard_batches[i] batches of (x float32 [B, DIM], y float32 [B])."""
  shards = []
  for worker, n in enumerate(shard_batches):
    rng = np.random.RandomState(seed + 1000 * worker)
    batches = []
    for _ in range(n):
      x = rng.uniform(-1, 1, (batch_size, DIM)).astype(np.float32)
      y = (x @ np.array([1.0, -2.0, 0.5]) + 0.3 + rng.normal(0, 0.1, batch_size))
      batches.append((x, y.astype(np.float32)))
    shards.append(batches)
  return shards


def embedding_shards(shard_batches: Sequence[int], batch_size: int = 4, seed: int = 0
                     ) -> List[List[Tuple[np.ndarray, np.ndarray]]]:
  """Worker i gets shard_batches[i] batches of (ids int64 [B] with repeats, y float32 [B])."""
  shards = []
  for worker, n in enumerate(shard_batches):
    rng = np.random.RandomState(seed + 7 + 1000 * worker)
    batches = []
    for _ in range(n):
      ids = rng.randint(0, VOCAB, batch_size).astype(np.int64)
      batches.append((ids, (0.2 * ids - 1.0 + rng.normal(0, 0.1, batch_size)).astype(np.float32)))
    shards.append(batches)
  return shards
