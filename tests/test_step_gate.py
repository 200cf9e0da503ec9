"""hooks.data.step_gate: a step's stateful ops wait until every partition of it started."""

import tensorflow as tf

from hooks import graph_keys
from hooks.data.epoch_input import EpochInput
from hooks.sync.optimizer import WorkerDoneSyncReplicasOptimizer

v1 = tf.compat.v1
WORKER = "/job:worker/task:1"


def _two_ps_sync_graph():
  """worker:1 of 2 on a replica_device_setter over 2 ps: an embedding on each ps."""
  cluster = {"ps": ["p0:1", "p1:1"], "worker": ["w0:1", "w1:1"]}
  with v1.device(v1.train.replica_device_setter(cluster=cluster, worker_device=WORKER)):
    global_step = v1.train.get_or_create_global_step()
    epoch_input = EpochInput(tf.data.Dataset.range(6).batch(2), num_epochs=1,
                             task_name="worker:1")
    ids = epoch_input.get_next()
    a = v1.get_variable("a", [6, 2], initializer=v1.zeros_initializer(), use_resource=False)
    b = v1.get_variable("b", [6, 2], initializer=v1.zeros_initializer(), use_resource=False)
    loss = tf.reduce_sum(tf.nn.embedding_lookup(a, ids)) + tf.reduce_sum(
        tf.nn.embedding_lookup(b, ids))
    opt = WorkerDoneSyncReplicasOptimizer(v1.train.GradientDescentOptimizer(0.1), 2, 1)
    opt.minimize(loss, global_step=global_step)
  assert {a.device, b.device} == {"/job:ps/task:0", "/job:ps/task:1"}
  return epoch_input, opt


def _gates(op):
  return sorted(c.device for c in op.control_inputs if c.type == "Timestamp")


def test_the_steps_input_read_waits_for_every_ps_and_the_grad_marker_for_the_read():
  with tf.Graph().as_default() as graph:
    epoch_input, _ = _two_ps_sync_graph()
    epoch_input.hook.begin()
    lookahead = epoch_input._lookahead  # pylint: disable=protected-access
    take, next_read = lookahead.read_ops
    for op in (take, next_read):
      assert _gates(op) == ["/job:ps/task:0", "/job:ps/task:1"], op.name
      assert op.device == WORKER
    (marker,) = graph.get_collection(graph_keys.STEP_START_OPS)
    assert marker.type == "QueueEnqueueV2" and take in marker.control_inputs
    assert sorted(graph.get_collection(graph_keys.GATED_TASKS)) == ["ps:0", "ps:1"]
    epoch_input.hook.begin()  # a second session on the same graph adds nothing
    assert len(graph.get_collection(graph_keys.GATED_TASKS)) == 2 and len(_gates(take)) == 2


def test_the_aggregation_takes_its_markers_once_every_other_ps_started():
  with tf.Graph().as_default():
    _, opt = _two_ps_sync_graph()
    seen, todo = set(), [opt.sync_ops.aggregate_op.op]
    while todo:
      op = todo.pop()
      if op not in seen:
        seen.add(op)
        todo += [t.op for t in op.inputs] + list(op.control_inputs)
    (take_markers,) = [op for op in seen if op.type == "QueueDequeueManyV2"]
    assert take_markers.device == "/job:ps/task:0"
    assert _gates(take_markers) == ["/job:ps/task:1"]  # ps:0's own part holds the queue


def test_local_mode_gates_nothing():
  with tf.Graph().as_default() as graph:
    epoch_input = EpochInput(tf.data.Dataset.range(4).batch(2), num_epochs=1)
    v1.get_variable("w", [2], initializer=v1.zeros_initializer())
    epoch_input.hook.begin()
    assert not graph.get_collection(graph_keys.GATED_TASKS)
    assert not [op for op in graph.get_operations() if op.type == "Timestamp"]


def test_the_chiefs_aggregation_run_has_no_partition_on_the_chiefs_own_task():
  """TensorFlow can reject a run's partition on the chief's own task alone, after its ps part
  ran: the aggregation must have none (it stores its result on the ps; a read fetches it)."""
  import portpicker  # pylint: disable=import-outside-toplevel
  ports = [portpicker.pick_unused_port() for _ in range(2)]
  cluster = tf.train.ClusterSpec({"ps": [f"localhost:{ports[0]}"],
                                  "worker": [f"localhost:{ports[1]}"]})
  ps = tf.distribute.Server(cluster, job_name="ps", task_index=0)
  worker = tf.distribute.Server(cluster, job_name="worker", task_index=0)
  del ps  # serves in this process until the end of the test
  with tf.Graph().as_default():
    with v1.device(v1.train.replica_device_setter(cluster=cluster,
                                                  worker_device="/job:worker/task:0")):
      global_step = v1.train.get_or_create_global_step()
      w = v1.get_variable("w", [2], initializer=v1.zeros_initializer(), use_resource=False)
      opt = WorkerDoneSyncReplicasOptimizer(v1.train.GradientDescentOptimizer(0.1), 1, 0)
      opt.minimize(tf.reduce_sum(w * w), global_step=global_step)
    ops = opt.sync_ops
    with v1.Session(worker.target) as session:
      session.run([v1.global_variables_initializer(), v1.local_variables_initializer()])
      session.run(ops.chief_init_op)
      session.run(ops.stop_op)  # a STOP marker: the aggregation returns at once
      metadata = v1.RunMetadata()
      session.run(ops.aggregate_and_store_op, run_metadata=metadata,
                  options=v1.RunOptions(output_partition_graphs=True))
      devices = {node.device for graph in metadata.partition_graphs for node in graph.node}
      assert devices == {"/job:ps/replica:0/task:0/device:CPU:0"}
      assert session.run(ops.last_aggregate) < 0  # what it stored: the STOP


def test_the_gated_graph_exports_without_a_warning():
  """Every save exports the meta graph: a Python object in a collection makes it warn (it did,
  on TensorFlow 2.21, for the gate's "installed" mark)."""
  import logging  # pylint: disable=g-import-not-at-top
  records = []
  handler = logging.Handler(logging.WARNING)
  handler.emit = records.append
  with tf.Graph().as_default() as graph:
    epoch_input, _ = _two_ps_sync_graph()
    epoch_input.hook.begin()
    tf.get_logger().addHandler(handler)
    try:
      v1.train.export_meta_graph(graph=graph)
    finally:
      tf.get_logger().removeHandler(handler)
  assert [r.getMessage() for r in records if "serializ" in r.getMessage()] == []


def test_the_step_marker_waits_for_every_ps_whichever_is_built_first():
  """The StuckStepWatchdog's marker is set only once every gated ps's part of the step started:
  a marker still behind then means none of the step's stateful ops ran."""
  from hooks.faults.stuck_step import StuckStepWatchdog  # pylint: disable=import-outside-toplevel
  for marker_first in (True, False):
    with tf.Graph().as_default():
      epoch_input, _ = _two_ps_sync_graph()
      watchdog = StuckStepWatchdog("worker:1")
      if marker_first:
        watchdog.build(WORKER)
      epoch_input.hook.begin()
      if not marker_first:
        watchdog.build(WORKER)
      mark = watchdog.before_step().fetches.op
      assert mark.device == WORKER
      assert _gates(mark) == ["/job:ps/task:0", "/job:ps/task:1"], marker_first
