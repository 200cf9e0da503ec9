"""A step's stateful ops wait until every partition of the step has started.

TensorFlow rejects a RunGraph whose request id the task saw among its last 100,000 (ABORTED
"The same RunGraph (Worker) request was received twice"; docs/reliability.md): the rejected
partition runs nothing, the step's other partitions run until the master cancels them. A step
whose own partition took its batch before a ps partition was rejected could not be run again
exactly. The gate makes each task that holds a variable (every ps) send a timestamp (stateful:
never constant-folded) that the step's input read waits for, and the ops in
`graph_keys.STEP_START_OPS` (e.g. the sync optimizer's GRAD marker, on a ps) wait for that
read, and the step marker (`graph_keys.STEP_MARKERS`) waits for the gate itself: when any partition of the step is rejected, none of the step's stateful ops ran, and
the step runs again (hooks.faults.step_retry). Cost: each step's batch is taken one message
from every ps later; the model's ops wait for the variables anyway.

Typical usage (EpochInput's hook, in begin(), before the graph is finalized):
  tasks = step_gate.install([take_op, next_op], own_device="/job:worker/task:1")
  # tasks == ["ps:0", "ps:1"]; graph_keys.GATED_TASKS holds them for the retry
"""

import weakref
from typing import List, Optional, Sequence

import tensorflow as tf

from hooks import graph_keys

__all__ = ["install", "task_of", "gate_ops"]

_v1 = tf.compat.v1
# The graphs already gated. Not a graph collection: every checkpoint save exports the meta
# graph, and a Python bool in a collection makes it warn ("Issue encountered when serializing").
_INSTALLED: "weakref.WeakSet[tf.Graph]" = weakref.WeakSet()


def task_of(device: str) -> Optional[str]:
  """"ps:1" for "/job:ps/replica:0/task:1/device:CPU:0"; None without a job."""
  spec = tf.DeviceSpec.from_string(device or "")
  if not spec.job:
    return None
  return f"{spec.job}:{spec.task or 0}"


def gate_ops(devices: Sequence[str], own_device: str, name: str) -> List[tf.Operation]:
  """One timestamp op on each task of `devices` other than `own_device`'s (one per task)."""
  own, ops, seen = task_of(own_device), [], set()
  for device in devices:
    task = task_of(device)
    if task is None or task == own or task in seen:
      continue
    seen.add(task)
    job, index = task.split(":")
    with tf.device(f"/job:{job}/task:{index}"):
      ops.append(tf.timestamp(name=f"{name}_{job}_{index}").op)
  return ops


def install(input_ops: Sequence[tf.Operation], own_device: str) -> List[str]:
  """Gates `input_ops` (the step's input read, on this task) on every other task holding a
  global variable, and STEP_START_OPS on input_ops[0]; returns the gated task names.

  Local mode (no job in `own_device`) gates nothing. Idempotent per graph.
  """
  graph = _v1.get_default_graph()
  if task_of(own_device) is None or graph in _INSTALLED:
    return list(graph.get_collection(graph_keys.GATED_TASKS))
  _INSTALLED.add(graph)
  devices = [v.device for v in graph.get_collection(_v1.GraphKeys.GLOBAL_VARIABLES)]
  with tf.name_scope("epochsync_input/gate"):
    gates = gate_ops(devices, own_device, "started")
  for op in input_ops:
    op._add_control_inputs(gates)  # pylint: disable=protected-access
  for op in graph.get_collection(graph_keys.STEP_START_OPS):
    op._add_control_inputs([input_ops[0]])  # pylint: disable=protected-access
  for op in graph.get_collection(graph_keys.STEP_MARKERS):
    op._add_control_inputs(gates)  # pylint: disable=protected-access
  for gate in gates:
    graph.add_to_collection(graph_keys.STEP_GATES, gate)
  tasks = [task_of(g.device) for g in gates]
  for task in tasks:
    graph.add_to_collection(graph_keys.GATED_TASKS, task)
  return tasks
