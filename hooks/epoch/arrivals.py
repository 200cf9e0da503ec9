"""What arrived at an epoch barrier: the chief's view of a gather, and a worker's release.

The chief decodes its gather's arrivals into each task's `EpochStats` and the problems that
make it refuse them (two tasks with one index, other settings, another barrier); a worker
turns a release that is not its barrier's number into the error that says why.

Typical usage (EpochBarrierHook's):
  stats, problems = arrivals(arrived, own, wait, worker_names, task_name, (n, num_epochs))
  if problems: raise ConfigError("; ".join(problems))
  if got != wait.seq: raise bad_release(got, wait, task_name, chief_name)
"""

from typing import Dict, List, Sequence, Tuple

from hooks.data.epoch_listener import EpochStats
from hooks.epoch.barrier_graph import REFUSED
from hooks.epoch.barrier_wait import Wait
from hooks.errors import ConfigError, EpochSyncError

__all__ = ["arrivals", "bad_release"]

def arrivals(arrived, own: EpochStats, wait: Wait, worker_names: Sequence[str], task_name: str,
             settings: Tuple[int, int]) -> Tuple[Dict[str, EpochStats], List[str]]:
  """The chief's view of a gather: every task's EpochStats by name, and what is wrong with
  them (two tasks with one index, other settings (num_workers, num_epochs), another barrier)."""
  arrivals = {task_name: own}
  problems = []
  for (worker, got_seq, batches, examples, n, epochs), (started, ended) in (
      zip(*arrived) if arrived else ()):
    name = worker_names[worker]
    if name in arrivals:
      problems.append(f"two tasks arrived as {name}: check that each task has its own task "
                      "index in TF_CONFIG (or --task_index)")
    if (n, epochs) != settings:
      problems.append(
          f"{name} was started with {n} workers and num_epochs={epochs}, {task_name} "
          f"with {settings[0]} and {settings[1]}: start every task with the "
          "same cluster and --epochsync_num_epochs")
    elif got_seq != wait.seq:
      problems.append(
          f"{name} arrived at barrier #{got_seq} while the chief waits at {wait.barrier} "
          f"#{wait.seq} (epoch {wait.epoch}): the workers disagree on the epoch; check that "
          "every task restarts from the same model_dir")
    arrivals[name] = EpochStats(wait.epoch, int(batches), int(examples), float(started),
                                float(ended))
  return arrivals, problems


def bad_release(got: int, wait: Wait, task_name: str, chief: str) -> Exception:
  """The error of a worker released with `got` instead of its barrier's number."""
  if got == REFUSED:
    return ConfigError(
        f"{task_name}: {chief} refused the tasks' settings at {wait.barrier} of epoch "
        f"{wait.epoch} (two tasks with one index, or tasks started with different clusters or "
        f"--epochsync_num_epochs): see {chief}'s log")
  return EpochSyncError(f"{task_name} was released from barrier #{got} while waiting at "
                        f"{wait.barrier} #{wait.seq} (epoch {wait.epoch}): the workers disagree "
                        "on the epoch; check num_epochs and model_dir on every task")
