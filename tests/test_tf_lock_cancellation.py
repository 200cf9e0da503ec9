"""Why no run in the work queue's lock is ever cancelled: TensorFlow's tf.CriticalSection lets a
second run in while one holds it, once a run waiting for it is cancelled.

TensorFlow's MutexLock kernel (core/kernels/mutex_ops.cc) ends a wait with
`local_locked = locked_ = !cancelled`: a cancelled waiter marks the lock free while another run
holds it. A run deadline (RunOptions.timeout_in_ms) and a killed client process both cancel the
waiting run on the ps. These tests pin that behaviour (TensorFlow 2.15 to 2.21): if one fails, a
TensorFlow release fixed the lock, and docs/reliability.md ("The work queue's lock") can say so.

Each run below counts the runs inside the lock (`inside`) and keeps the most seen (`most`):
  holder: holds the lock 3-5 s;  waiter: waits for it, then is cancelled;  third: comes after.
"""

import subprocess
import sys
import threading
import time

import portpicker
import tensorflow as tf

_v1 = tf.compat.v1


def _lock_graph():
  """(graph, run, n, init, most): `run` holds the lock for a busy loop of `n` iterations."""
  graph = tf.Graph()
  with graph.as_default(), _v1.device("/job:ps/task:0"):
    inside, most = (_v1.get_variable(name, [], tf.int64, _v1.zeros_initializer(),
                                     use_resource=True) for name in ("inside", "most"))
    lock = tf.CriticalSection(shared_name="pinned_lock")
    n = _v1.placeholder(tf.int32, [])

    def count_and_hold():
      with tf.control_dependencies([inside.assign_add(1)]):
        seen = inside.read_value()
      with tf.control_dependencies([most.assign(tf.maximum(most.read_value(), seen))]):
        busy = tf.while_loop(lambda i, a: i < n, lambda i, a: (i + 1, a * 1.0000001 + 1.0),
                             [tf.constant(0), tf.constant(1.0)])[1]
      with tf.control_dependencies([busy]):
        with tf.control_dependencies([inside.assign_sub(1)]):
          return tf.identity(seen)

    run = lock.execute(count_and_hold)
    init = _v1.global_variables_initializer()
  return graph, run, n, init, most


def _cluster(workers: int):
  ports = [f"localhost:{portpicker.pick_unused_port()}" for _ in range(1 + workers)]
  spec = tf.train.ClusterSpec({"ps": ports[:1], "worker": ports[1:]})
  return ports, [tf.distribute.Server(spec, job_name=job, task_index=0)
                 for job in ("ps", "worker")]


def _session(target, graph, worker: int):
  config = _v1.ConfigProto(device_filters=["/job:ps", f"/job:worker/task:{worker}"])
  return _v1.Session(target, graph=graph, config=config)


def _hold_calibrated(session, run, n, secs: float):
  """A thread running `run` for about `secs` seconds, started."""
  started = time.monotonic()
  session.run(run, {n: 20000})
  iterations = int(20000 * secs / max(time.monotonic() - started, 1e-3))
  holder = threading.Thread(target=session.run, args=(run, {n: iterations}), daemon=True)
  holder.start()
  return holder


def test_a_waiter_cancelled_by_its_deadline_lets_a_second_run_in_beside_the_holder():
  for cancel in (False, True):  # without the cancelled waiter: one run inside at a time
    _, (_, worker) = _cluster(1)
    graph, run, n, init, most = _lock_graph()
    with _session(worker.target, graph, 0) as session:
      session.run(init)
      holder = _hold_calibrated(session, run, n, secs=3.0)
      time.sleep(0.1)
      if cancel:
        try:
          session.run(run, {n: 1}, options=_v1.RunOptions(timeout_in_ms=100))
        except tf.errors.DeadlineExceededError:
          pass
      assert holder.is_alive(), "the holder ended before the third run: hold it longer"
      session.run(run, {n: 1})
      holder.join(60)
      assert session.run(most) == (2 if cancel else 1), cancel


def test_a_waiter_whose_process_is_killed_lets_a_second_run_in_beside_the_holder():
  ports, (_, worker) = _cluster(2)
  graph, run, n, init, most = _lock_graph()
  with _session(worker.target, graph, 0) as session:
    session.run(init)
    child = subprocess.Popen([sys.executable, __file__] + ports, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
      assert child.stdout.readline().strip() == "ready"
      holder = _hold_calibrated(session, run, n, secs=5.0)
      time.sleep(0.2)
      child.stdin.write("go\n")
      child.stdin.flush()
      assert child.stdout.readline().strip() == "running"
      time.sleep(1.0)  # its run reaches ps:0 and waits for the lock
    finally:
      child.kill()
      child.wait(30)
    time.sleep(0.5)
    assert holder.is_alive(), "the holder ended before the third run: hold it longer"
    session.run(run, {n: 1})
    holder.join(60)
    assert session.run(most) == 2


def _waiter(ports):
  """The killed test's waiter process (worker:1): prints "ready", then on a line of stdin runs
  into the lock and is killed while it waits."""
  spec = tf.train.ClusterSpec({"ps": ports[:1], "worker": ports[1:]})
  server = tf.distribute.Server(spec, job_name="worker", task_index=1)
  graph, run, n, _, _ = _lock_graph()
  with _session(server.target, graph, 1) as session:
    session.run(run, {n: 1})
    print("ready", flush=True)
    sys.stdin.readline()
    print("running", flush=True)
    session.run(run, {n: 1})


if __name__ == "__main__":
  _waiter(sys.argv[1:])
