"""Restores a checkpoint that lacks tf-epochsync's own state, or holds it for another cluster.

A job that switches tf-epochsync on goes on from the checkpoint a stock job wrote: it has every
model variable but none of `graph_keys.STATE_VARIABLES` (completed epochs, done counters,
progress). A job restarted with another worker count finds those with another shape. In both
cases the chief restores every model variable (global_step included) and starts the state
fresh: epoch counting starts at 0 for a stock checkpoint, and the per-worker counters are
resized. A missing or mismatched *model* variable is left to TensorFlow's usual error.

Typical usage (EpochSyncChiefSessionCreator does this):
  plan = restore_plan(checkpoint, tf.compat.v1.global_variables())
  if plan.fresh:
    saver = tf.compat.v1.train.Saver(var_list=plan.restore)   # before the graph is finalized
"""

import dataclasses
from typing import Dict, List, Optional, Sequence, Tuple

import tensorflow as tf

from hooks import graph_keys
from hooks import log as logging

__all__ = ["RestorePlan", "restore_plan", "checkpoint_key"]

_v1 = tf.compat.v1


@dataclasses.dataclass(frozen=True)
class RestorePlan:
  """What to restore from `checkpoint` and which tf-epochsync variables start fresh (and why)."""
  checkpoint: str
  restore: List[tf.Variable]
  fresh: List[tf.Variable]
  reasons: List[str]
  # State saved under its caller's name scope (e.g. `head/epochsync_sync_0/progress`, as a
  # canned estimator's was before the names were absolute): checkpoint name -> variable.
  renamed: Dict[str, tf.Variable] = dataclasses.field(default_factory=dict)

  def describe(self) -> str:
    renamed = "".join(f"; {v.op.name} from {n}" for n, v in self.renamed.items())
    return (f"restoring {len(self.restore)} variables from {self.checkpoint}{renamed}; "
            f"tf-epochsync's own state starts fresh ({'; '.join(self.reasons) or 'none'})")


def checkpoint_key(var: tf.Variable) -> Tuple[str, List[int]]:
  """The name and full shape under which a Saver stores `var` (a partition: its whole)."""
  info = getattr(var, "_save_slice_info", None)
  if info is not None:
    return info.full_name, list(info.full_shape)
  return var.op.name, var.shape.as_list()


def restore_plan(checkpoint: str, variables: Sequence[tf.Variable],
                 state: Optional[Sequence[tf.Variable]] = None) -> RestorePlan:
  """Splits `variables` into those to restore from `checkpoint` and state to start fresh.

  Args:
    checkpoint: a checkpoint path prefix.
    variables: the variables a Saver of this graph would restore.
    state: tf-epochsync's own variables; default: the graph's `graph_keys.STATE_VARIABLES`.
  """
  state = list(_v1.get_collection(graph_keys.STATE_VARIABLES) if state is None else state)
  stored: Dict[str, List[int]] = dict(tf.train.list_variables(checkpoint))
  state_ids = {id(v) for v in state}
  restore, fresh, reasons, renamed = [], [], [], {}
  for var in variables:
    name, shape = checkpoint_key(var)
    scoped = [s for s in stored if s.endswith("/" + name) and list(stored[s]) == shape]
    if id(var) in state_ids and name not in stored and len(scoped) == 1:
      renamed[scoped[0]] = var
    elif id(var) in state_ids and name not in stored:
      fresh.append(var)
      reasons.append(f"{name} is not in the checkpoint")
    elif id(var) in state_ids and list(stored[name]) != shape:
      fresh.append(var)
      reasons.append(f"{name} has shape {list(stored[name])} there and {shape} here (the "
                     f"checkpoint was written with another number of workers)")
    else:
      restore.append(var)
  return RestorePlan(checkpoint, restore, fresh, reasons, renamed)


def log_plan(plan: RestorePlan, completed_epochs_fresh: bool) -> None:
  """One line saying what was restored and where epoch counting starts."""
  start = ("epoch counting starts at 0 for this run" if completed_epochs_fresh else
           "epoch counting goes on from the checkpoint")
  logging.warning("%s; %s", plan.describe(), start)
