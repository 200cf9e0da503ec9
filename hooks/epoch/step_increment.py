"""Makes the graph's increments of a ref-variable global_step atomic.

`Optimizer.apply_gradients(global_step=...)` increments a ref-variable global step (the kind
`tf.compat.v1.disable_v2_behavior()` makes) with `state_ops.assign_add(global_step, 1)`, whose
`use_locking` defaults to False: the kernel reads, adds and writes without the variable's lock.
Asynchronous workers' runs of it on the ps overlap, and two that overlap count one step
(a CI run of 8 asynchronous workers audited global_step 479 after 480 batches;
tests/test_step_increment.py loses ~20 of 32,000 such increments in one process).
A resource-variable global step is not affected: its AssignAddVariableOp always locks.

`lock_global_step_increments` sets `use_locking` on every such AssignAdd/AssignSub before the
session is created (the EpochBarrierHook calls it in `begin()`), so the step counts every batch.
The lock is the variable's own mutex, held for one scalar add.

    global_step = tf.compat.v1.train.get_or_create_global_step()
    train_op = optimizer.minimize(loss, global_step=global_step)
    lock_global_step_increments(tf.compat.v1.get_default_graph())  # -> 1 op changed
    with tf.compat.v1.train.MonitoredTrainingSession(...) as session: ...
"""

from typing import List

import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2

from hooks import log as logging

__all__ = ["lock_global_step_increments"]

_v1 = tf.compat.v1
_UPDATES = ("AssignAdd", "AssignSub")


def lock_global_step_increments(graph: tf.Graph) -> List[str]:
  """Sets use_locking=True on the unlocked AssignAdd/AssignSub ops of `graph`'s ref-variable
  global_step; returns their names (none when the step is a resource variable or absent)."""
  global_step = _v1.train.get_global_step(graph)
  if global_step is None or global_step.op.type not in ("VariableV2", "Variable"):
    return []
  unlocked = [op for op in graph.get_operations()
              if op.type in _UPDATES and op.inputs[0].op is global_step.op
              and not op.get_attr("use_locking")]
  locked = attr_value_pb2.AttrValue(b=True)
  for op in unlocked:
    op._set_attr("use_locking", locked)  # pylint: disable=protected-access
  if unlocked:
    logging.info("global_step's increments %s now hold its lock (use_locking): without it, "
                 "workers' overlapping increments on the ps count one step for two",
                 [op.name for op in unlocked])
  return [op.name for op in unlocked]
