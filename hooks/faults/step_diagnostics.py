"""What a late synchronous step is waiting for, from the ps' (step, progress) vector.

progress[i] is the step of worker i's last gradient sent, -1 once it sent DONE in this epoch,
-2 (active) at an epoch's start (hooks.sync.optimizer writes it).

Typical usage (SafeSyncTokensHook's watchdog):
  step, summary, missing = describe_step(read, worker_names)
"""

from typing import Callable, List, Sequence, Tuple

import tensorflow as tf

__all__ = ["describe_step"]

_PROGRESS_DONE = -1  # As in hooks.sync.optimizer (not imported: that module imports tokens).
_FLAG = "--epochsync_step_timeout_secs"


def describe_step(read: Callable[[], Tuple[int, Sequence[int]]], names: Sequence[str]
                ) -> Tuple[str, str, List[str]]:
  """(step, "k/N workers sent their gradient; missing ... (fix)", missing task names)."""
  try:
    step, progress = read()
  except tf.errors.OpError as e:
    return "?", (f"could not read the workers' progress from the ps ({e.message}); check the ps "
                 f"tasks' logs or raise {_FLAG}"), []
  active = [i for i, p in enumerate(progress) if p != _PROGRESS_DONE]
  sent = [i for i in active if progress[i] >= step]
  stale = [i for i in active if 0 <= progress[i] < step - 1]  # Sent a marker for an old step.
  missing = [names[i] for i in active if i not in sent and i not in stale]
  parts = [f"{len(sent)}/{len(active)} workers sent their gradient"]
  if missing:
    whose = "its log" if len(missing) == 1 else "their logs"
    parts.append(f"missing {', '.join(missing)} (check {whose} or raise {_FLAG})")
  if stale:
    parts.append(f"stale gradient from {', '.join(names[i] for i in stale)} (local_step "
                 f"{', '.join(str(progress[i]) for i in stale)} < {step}: every worker must run "
                 "EPOCH_START_OPS at each epoch start)")
  if not missing and not stale:
    parts[0] = (f"all {len(active)} active workers sent their gradient but no token came; check "
                f"the aggregation in {names[0]}'s log or raise {_FLAG}")
  return step, "; ".join(parts), missing
