"""Cluster test task: adds (worker_id + 1) to `counter` on ps:0, `--repeat` times.

With --mode=crash it exits 3 after printing a reason; with --mode=hang it sleeps forever
(the launcher must kill it at the job deadline).
"""

import sys
import time

from absl import app
from absl import flags
import tensorflow as tf

from hooks.config import cluster as cluster_lib
from hooks.session import creators as session_lib

_REPEAT = flags.DEFINE_integer("repeat", 5, "Increments per worker.")
_MODE = flags.DEFINE_enum("mode", "ok", ["ok", "crash", "hang"], "How this task behaves.")

_v1 = tf.compat.v1


def main(argv):
  del argv
  if _MODE.value == "crash":
    print("increment task: simulated crash (reason: --mode=crash)", flush=True)
    sys.exit(3)
  if _MODE.value == "hang":
    print("increment task: hanging on purpose", flush=True)
    time.sleep(10_000)
  _v1.disable_v2_behavior()
  config = cluster_lib.ClusterConfig.from_tf_config()
  server = tf.distribute.Server(config.cluster_spec(), job_name=config.task_type,
                                task_index=config.task_index)
  with _v1.device("/job:ps/task:0"):
    counter = _v1.get_variable("counter", [], tf.int64, _v1.zeros_initializer())
  increment = counter.assign_add(config.worker_id + 1)
  with _v1.train.MonitoredSession(
      session_creator=session_lib.session_creator(config, master=server.target)) as sess:
    for _ in range(_REPEAT.value):
      sess.run(increment)
  print(f"{config.task_name} added {_REPEAT.value} x {config.worker_id + 1}", flush=True)


if __name__ == "__main__":
  app.run(main)
