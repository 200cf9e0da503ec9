"""Refuses, before the first training step, set-ups that would make epoch-exact training wrong.

Each check returns the problems it found, one sentence each with the fix, and
`errors.raise_if_problems` turns them into one ConfigError. `EpochInput.hook` runs
`session_hooks_problems` in `begin()` on the hooks of the session it is in, and
`finite_dataset_problems` when the session is created; `ChiefSaveAfterBarrierHook` runs
`writable_dir_problems` in `begin()`.

Typical usage:
  hooks = hooks_of_calling_session(my_hook)       # in my_hook.begin(); None if not found
  raise_if_problems(session_hooks_problems(hooks, "worker:1"), "session hooks of worker:1")
  raise_if_problems(writable_dir_problems(model_dir, "chief:0"), "model_dir of chief:0")
"""

import os
import sys
from typing import List, Optional, Sequence

import tensorflow as tf

from hooks import graph_keys

__all__ = ["hooks_of_calling_session", "session_hooks_problems", "finite_dataset_problems",
           "writable_dir_problems"]

_v1 = tf.compat.v1
_MAX_FRAMES = 8  # MonitoredSession calls begin() 1 frame up; wrappers add a few.


def hooks_of_calling_session(hook: object) -> Optional[List[object]]:
  """The hooks list holding `hook`, read from the frames calling its `begin()`; else None.

  `MonitoredSession` (and so `MonitoredTrainingSession` and `Estimator.train`, which build
  one) calls every hook's `begin()` from a frame whose locals hold the list of all hooks,
  including those added by the wrapper (e.g. a CheckpointSaverHook). Call it from `begin()`.
  """
  frame = sys._getframe(1)  # pylint: disable=protected-access
  for _ in range(_MAX_FRAMES):
    if frame is None:
      return None
    for value in frame.f_locals.values():
      if isinstance(value, (list, tuple)) and any(h is hook for h in value):
        return list(value)
    frame = frame.f_back
  return None


def session_hooks_problems(hooks: Sequence[object], task_name: str) -> List[str]:
  """What in a session's hooks breaks epoch-exact training, each with its fix.

  Refused: a StopAtStepHook (ends the session mid-epoch), a CheckpointSaverHook (saves
  mid-epoch without positions: a restart would train part of an epoch twice), and a
  WorkerDoneSyncReplicasOptimizer train_op in the graph without its SafeSyncTokensHook
  (no task would aggregate: the first step would wait for its token forever).
  """
  problems = []
  for hook in hooks:
    if isinstance(hook, _v1.train.StopAtStepHook):
      problems.append(
          f"{task_name} has a StopAtStepHook (from max_steps, num_steps or last_step): it would "
          "stop training in the middle of an epoch. Remove it (Estimator: train(steps=None, "
          "max_steps=None)); --epochsync_num_epochs decides when training ends")
    elif isinstance(hook, _v1.train.CheckpointSaverHook):
      where = getattr(hook, "_checkpoint_dir", None)
      problems.append(
          f"{task_name} has a CheckpointSaverHook (saving to {where!r}): it saves in the middle "
          "of an epoch without the workers' positions, and a restart would restore that "
          "checkpoint and train part of the epoch twice. Remove it: MonitoredTrainingSession("
          "save_checkpoint_secs=None, save_checkpoint_steps=None), Estimator RunConfig("
          "save_checkpoints_secs=None, save_checkpoints_steps=None), and set the period of "
          "tf-epochsync's own mid-epoch checkpoints instead (--epochsync_save_checkpoint_secs "
          "or _steps); ChiefSaveAfterBarrierHook saves once per epoch (hang exports or "
          "evaluation off it as CheckpointSaverListeners)")
  # A SafeSyncTokensHook names the train_op it drives (no import of hooks.sync here).
  hooked = {_name(op) for op in (getattr(h, "sync_train_op", None) for h in hooks)
            if op is not None}
  for train_op in _v1.get_collection(graph_keys.SYNC_TRAIN_OPS):
    if _name(train_op) not in hooked:
      problems.append(
          f"{task_name}: the train_op {_name(train_op)!r} of a WorkerDoneSyncReplicasOptimizer "
          "has no SafeSyncTokensHook among the session's hooks: no task would aggregate the "
          "gradients and the first step would wait for its token forever. Pass "
          "opt.make_session_run_hook(config.is_chief, num_tokens=0) on every task, e.g. as "
          "epoch_sync_hooks(..., sync_hook=...)")
  return problems


def finite_dataset_problems(cardinality: int, task_name: str) -> List[str]:
  """A dataset of INFINITE cardinality can never end an epoch; UNKNOWN is accepted."""
  if cardinality != tf.data.INFINITE_CARDINALITY:
    return []
  return [f"{task_name}: the dataset handed to EpochInput is infinite (tf.data cardinality "
          "INFINITE, e.g. a .repeat() without a count), so its epoch would never end. Hand over "
          "one pass over this worker's shard: remove the .repeat(); EpochInput reads it again "
          "every epoch, --epochsync_num_epochs times"]


def writable_dir_problems(path: str, task_name: str, what: str = "model_dir") -> List[str]:
  """Whether `task_name` can create `path` and write a file in it (then removed)."""
  fix = (f"pass a {what} that {task_name} can create and write (and every ps task: each writes "
         "the variables it holds), e.g. a volume shared by all tasks, or fix its permissions")
  if not path:
    return [f"{what} is empty; {fix}"]
  probe = os.path.join(path, f".epochsync-write-check-{os.getpid()}")
  try:
    if tf.io.gfile.exists(path) and not tf.io.gfile.isdir(path):
      return [f"{what}={path!r} is a file, not a directory; {fix}"]
    tf.io.gfile.makedirs(path)
    with tf.io.gfile.GFile(probe, "w") as f:
      f.write("epochsync")
    tf.io.gfile.remove(probe)
  except (tf.errors.OpError, OSError) as e:
    reason = e.message if isinstance(e, tf.errors.OpError) else str(e)
    return [f"{what}={path!r} is not writable on {task_name} ({reason.strip()}); {fix}"]
  return []


def _name(tensor_or_op) -> str:
  return getattr(tensor_or_op, "name", str(tensor_or_op))
