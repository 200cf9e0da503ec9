"""Where WorkerDoneSyncReplicasOptimizer's num_workers and worker_id come from: its arguments,
stock SyncReplicasOptimizer's arguments, or the cluster (TF_CONFIG or the cluster flags).

Typical usage (inside the optimizer's constructor):
  num_workers, worker_id, names = resolve_optimizer_arguments(
      opt, num_workers, worker_id, worker_names, replicas, total, averages)
"""

import math
from typing import Any, List, Optional, Sequence, Tuple

import tensorflow as tf

from hooks.config.cluster import worker_problems
from hooks.errors import ConfigError

__all__ = ["resolve_optimizer_arguments", "from_stock_arguments", "from_cluster",
           "raise_if_bad_hook_arguments"]


def resolve_optimizer_arguments(opt: Any, num_workers: Any, worker_id: Any,
                                worker_names: Optional[Sequence[str]],
                                replicas_to_aggregate: Any, total_num_replicas: Any,
                                variable_averages: Any) -> Tuple[int, int, Tuple[str, ...]]:
  """WorkerDoneSyncReplicasOptimizer's (num_workers, worker_id, worker names), or ConfigError
  listing every problem of its arguments."""
  problems = []
  if not isinstance(opt, tf.compat.v1.train.Optimizer):
    problems.append(f"opt={opt!r} is not a tf.compat.v1.train.Optimizer")
  num_workers, stock_problems = from_stock_arguments(
      num_workers, replicas_to_aggregate, total_num_replicas, variable_averages)
  problems += stock_problems
  if not stock_problems and (num_workers is None or worker_id is None):
    num_workers, worker_id, worker_names, cluster_problems = from_cluster(
        num_workers, worker_id, worker_names)
    problems += cluster_problems
  if not stock_problems and num_workers is not None and worker_id is not None:
    problems += worker_problems(num_workers, worker_id, worker_names)
    if (isinstance(worker_id, int) and isinstance(num_workers, int) and
        worker_id >= num_workers >= 1 and replicas_to_aggregate is None):
      problems.append(f"(if ({num_workers}, {worker_id}) are stock SyncReplicasOptimizer's "
                      "replicas_to_aggregate and total_num_replicas, pass them by keyword: "
                      "the positional arguments here are num_workers, worker_id)")
  count = num_workers if isinstance(num_workers, int) and num_workers > 0 else 0
  names = tuple(worker_names or [f"worker:{i}" for i in range(count)])
  if problems:
    raise ConfigError("invalid WorkerDoneSyncReplicasOptimizer arguments:\n  - "
                      + "\n  - ".join(problems))
  return num_workers, worker_id, names


def from_stock_arguments(num_workers: Any, replicas_to_aggregate: Any, total_num_replicas: Any,
                          variable_averages: Any) -> Tuple[Any, List[str]]:
  """num_workers from stock SyncReplicasOptimizer's arguments, and what is wrong with them."""
  problems = []
  if variable_averages is not None:
    problems.append("variable_averages is not supported: apply the ExponentialMovingAverage "
                    "in your own train_op on the chief, or pass variable_averages=None")
  if replicas_to_aggregate is None and total_num_replicas is None:
    return num_workers, problems
  total = total_num_replicas if total_num_replicas is not None else replicas_to_aggregate
  replicas = replicas_to_aggregate if replicas_to_aggregate is not None else total
  for arg, value in (("replicas_to_aggregate", replicas), ("total_num_replicas", total)):
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
      problems.append(f"{arg}={value!r} must be an integer >= 1 (the number of chief + worker "
                      "tasks)")
  if problems:
    return num_workers, problems
  if replicas < total:
    problems.append(
        f"replicas_to_aggregate={replicas} < total_num_replicas={total} asks for backup workers: "
        f"each step would drop the gradients of the slowest {total - replicas} worker(s), so "
        "their examples would not be trained in that epoch and exactly-once epochs break; set "
        f"replicas_to_aggregate={total} (a worker whose shard ran out is never waited for)")
  elif replicas > total:
    problems.append(
        f"replicas_to_aggregate={replicas} > total_num_replicas={total}: here every active "
        "worker sends exactly one gradient per step, never several; set "
        f"replicas_to_aggregate={total}")
  if num_workers is not None and num_workers != total:
    problems.append(f"num_workers={num_workers!r} but total_num_replicas={total}: pass only one "
                    "of them, or the same number")
  return total, problems


def from_cluster(num_workers: Any, worker_id: Any, worker_names: Optional[Sequence[str]]
                  ) -> Tuple[Any, Any, Optional[Sequence[str]], List[str]]:
  """Fills num_workers, worker_id and worker_names from TF_CONFIG or the cluster flags."""
  from hooks.config import flags as epochsync_flags  # pylint: disable=g-import-not-at-top; defines flags
  missing = " and ".join(n for n, v in (("num_workers", num_workers), ("worker_id", worker_id))
                         if v is None)
  try:
    config = epochsync_flags.cluster_from_flags()
  except ConfigError as e:
    return num_workers, worker_id, worker_names, [
        f"{missing} not given and no cluster found to take it from ({e}); pass "
        "worker_id=ClusterConfig.worker_id and num_workers=ClusterConfig.num_workers, or set "
        "TF_CONFIG"]
  if config.is_ps or config.is_evaluator:
    return num_workers, worker_id, worker_names, [
        f"{missing} not given and this task is {config.task_name}, not a chief or worker task; "
        "build the sync optimizer only on training tasks"]
  if num_workers is not None and num_workers != config.num_workers:
    return num_workers, worker_id, worker_names, [
        f"num_workers={num_workers} (or total_num_replicas) but {config.source} lists "
        f"{config.num_workers} chief+worker tasks ({', '.join(config.worker_names)}); pass "
        f"{config.num_workers} or fix {config.source}"]
  if worker_id is None:
    worker_id = config.worker_id
    worker_names = worker_names or config.worker_names
  return config.num_workers, worker_id, worker_names, []


def raise_if_bad_hook_arguments(num_tokens: Any, step_timeout_secs: Any, warn_after_secs: Any,
                                log_every_secs: Any) -> None:
  """Raises ConfigError listing what is wrong with SafeSyncTokensHook's arguments."""
  problems = [] if num_tokens == 0 else [
      f"num_tokens={num_tokens!r} is not supported: it must be 0. Initial tokens let a task "
      "train before every worker joined or take a peer's token (tensorflow issue 11753); "
      "call make_session_run_hook(is_chief, num_tokens=0)"]
  for name, value in (("step_timeout_secs", step_timeout_secs),
                      ("warn_after_secs", warn_after_secs), ("log_every_secs", log_every_secs)):
    if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
      problems.append(f"{name}={value!r} must be a finite number of seconds > 0")
  if problems:
    raise ConfigError("invalid SafeSyncTokensHook arguments:\n  - " + "\n  - ".join(problems))
