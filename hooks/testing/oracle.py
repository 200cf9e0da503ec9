"""Numpy oracle of lockstep synchronous SGD over uneven shards: what epoch-exact training computes.

Step s of an epoch averages the gradients of the workers that still have a batch s (or divides
their sum by the initial number of workers); the global step counts the steps, i.e. the longest
shard, summed over the epochs. Computed in float64.

Typical usage:
  params, global_step = lockstep_sgd({"w": np.zeros(3), "b": np.zeros(())}, shards,
                                     linear_mse_gradients, learning_rate=0.1, num_epochs=2)
"""

from typing import Callable, Dict, Mapping, Sequence, Tuple

import numpy as np

__all__ = ["lockstep_sgd", "linear_mse_gradients", "embedding_mse_gradients"]

Params = Dict[str, np.ndarray]
GradientFn = Callable[[Mapping[str, np.ndarray], Tuple[np.ndarray, ...]], Params]


def lockstep_sgd(params: Mapping[str, np.ndarray], shards: Sequence[Sequence[Tuple]],
                 gradients: GradientFn, learning_rate: float, num_epochs: int = 1,
                 divide_by_initial_workers: bool = False) -> Tuple[Params, int]:
  """Final parameters and global step of synchronous SGD with workers leaving when done.

  Args:
    params: `Mapping[str, array]` initial parameters (copied, as float64).
    shards: `Sequence` one list of batches per worker; a batch is what `gradients` takes.
    gradients: `Callable(params, batch) -> {name: gradient}` of the loss of one batch.
    learning_rate: `float` plain SGD step size.
    num_epochs: `int` passes over every shard.
    divide_by_initial_workers: `bool` divide the summed gradients by len(shards).
  """
  params = {k: np.array(v, dtype=np.float64) for k, v in params.items()}
  global_step = 0
  for _ in range(num_epochs):
    for s in range(max((len(shard) for shard in shards), default=0)):
      grads = [gradients(params, shard[s]) for shard in shards if s < len(shard)]
      divisor = len(shards) if divide_by_initial_workers else len(grads)
      for k in params:
        params[k] -= learning_rate * sum(g[k] for g in grads) / divisor
      global_step += 1
  return params, global_step


def linear_mse_gradients(params: Mapping[str, np.ndarray], batch: Tuple[np.ndarray, np.ndarray]
                         ) -> Params:
  """Gradients of mean((x @ w + b - y)^2) for batch (x [B, D], y [B]), params w [D], b []."""
  x, y = (np.asarray(a, np.float64) for a in batch)
  residual = x @ params["w"] + params["b"] - y
  return {"w": 2.0 / len(y) * x.T @ residual, "b": np.asarray(2.0 / len(y) * residual.sum())}


def embedding_mse_gradients(params: Mapping[str, np.ndarray],
                            batch: Tuple[np.ndarray, np.ndarray]) -> Params:
  """Gradients of mean((sum(emb[ids], 1) + b - y)^2) for ids [B], y [B], emb [V, D], b []."""
  ids, y = np.asarray(batch[0]), np.asarray(batch[1], np.float64)
  residual = params["emb"][ids].sum(axis=1) + params["b"] - y
  d_emb = np.zeros_like(params["emb"])
  np.add.at(d_emb, ids, (2.0 / len(y) * residual)[:, None])
  return {"emb": d_emb, "b": np.asarray(2.0 / len(y) * residual.sum())}
