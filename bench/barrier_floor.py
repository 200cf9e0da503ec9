"""The floor under a barrier's latency: one arrive-and-wait run when the release is already in.

A worker's barrier is one `session.run` that enqueues its arrival, marks it and dequeues its
release, all on ps:0. When the release is already queued, that run costs what it costs with
nobody to wait for; it is the least any barrier of this shape can take after the last arrival.
This measures it beside a trivial read of a scalar on ps:0 (the round trip, RTT), with and
without the `BackgroundRun` thread the barrier waits in, one process (1 ps + 1 worker), so no
scheduling of other workers is included.

Typical usage:
  python -m bench.barrier_floor                      # 5 repetitions of 200 runs each
  python -m bench.barrier_floor --runs=500 --output=bench/results/barrier_floor.json
"""

import statistics
import subprocess
import sys
import time

from absl import app
from absl import flags

from bench import common

_RUNS = flags.DEFINE_integer("runs", 200, "Runs of each kind per repetition.", lower_bound=10)
_REPETITIONS = flags.DEFINE_integer("repetitions", 5, "Repetitions (kinds alternate).",
                                    lower_bound=1)
_OUTPUT = flags.DEFINE_string("output", None, "Write the results as JSON here.")

_PS_CODE = ("import sys, tensorflow as tf; tf.distribute.Server(tf.train.ClusterSpec("
            "{'ps': [sys.argv[1]], 'worker': [sys.argv[2]]}), 'ps', 0).join()")


def _measure(kinds, runs: int):
  """Median seconds of each kind's call, alternating kinds run by run."""
  times = {name: [] for name in kinds}
  for i in range(runs):
    for name, call in kinds.items():
      start = time.perf_counter()
      call(i)
      times[name].append(time.perf_counter() - start)
  return {name: statistics.median(x) for name, x in times.items()}


def main(argv):
  del argv
  import portpicker  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from hooks.faults.waiting import BackgroundRun  # pylint: disable=g-import-not-at-top
  v1 = tf.compat.v1
  v1.disable_v2_behavior()
  ps_address, worker_address = (f"localhost:{portpicker.pick_unused_port()}" for _ in range(2))
  ps = subprocess.Popen([sys.executable, "-c", _PS_CODE, ps_address, worker_address],
                        stderr=subprocess.DEVNULL, start_new_session=True)
  try:
    cluster = tf.train.ClusterSpec({"ps": [ps_address], "worker": [worker_address]})
    server = tf.distribute.Server(cluster, "worker", 0)
    with v1.device("/job:ps/task:0"):
      release_q = v1.FIFOQueue(-1, [tf.int64], shapes=[[]], shared_name="floor_release")
      seq = v1.placeholder(tf.int64, [])
      arrived = v1.get_variable("arrived", [4], tf.int64, v1.zeros_initializer(),
                                use_resource=False)
      with tf.control_dependencies([release_q.enqueue([seq]),  # the release, already in
                                    v1.scatter_update(arrived, [1], [seq])]):
        arrive_and_wait = tf.identity(release_q.dequeue())
      read = tf.identity(arrived)
    config = v1.ConfigProto(device_filters=["/job:ps", "/job:worker/task:0"])
    with v1.Session(server.target, config=config) as sess:
      sess.run(v1.global_variables_initializer())

      def in_background(i):
        call = BackgroundRun(sess, arrive_and_wait, time.monotonic() + 60, feed_dict={seq: i})
        call.wait_until_deadline(1.0)
        call.result()

      kinds = {"rtt": lambda i: sess.run(read),
               "arrive_and_wait": lambda i: sess.run(arrive_and_wait, {seq: i}),
               "arrive_and_wait_in_background": in_background}
      _measure(kinds, 20)  # warm-up: each fetch's first run registers its graph
      reps = [_measure(kinds, _RUNS.value) for _ in range(_REPETITIONS.value)]
  finally:
    ps.kill()
  result = {name: common.summary(r[name] * 1e3 for r in reps) for name in kinds}
  rtt = result["rtt"]["median"]
  print("kind                            median ms (min..max)  in RTTs")
  for name, s in result.items():
    print(f"{name:<30}  {s['median']:.3f} ({s['min']:.3f}..{s['max']:.3f})  "
          f"{s['median'] / rtt:5.2f}")
  print(f"load average (1, 5, 15 min): {common.load_average()}")
  common.write_results(_OUTPUT.value, result, sys.argv, load_average=common.load_average())


if __name__ == "__main__":
  app.run(main)
