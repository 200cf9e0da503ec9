"""Serves one parameter-server task of the cluster in TF_CONFIG until it is killed.

Typical usage (what LocalCluster starts for every `ps` task):
  TF_CONFIG='{"cluster": {...}, "task": {"type": "ps", "index": 0}}' python -m hooks.testing.ps_task
"""

import time

from absl import app
from absl import flags

from hooks.config import cluster as cluster_lib
from hooks import log as logging


_NEVER_SERVE = flags.DEFINE_boolean(
    "never_serve", False, "Fault tests: never start the server (a ps that never comes up); the "
    "launcher's deadline ends the process.")


def main(argv):
  del argv
  config = cluster_lib.ClusterConfig.from_tf_config()
  if _NEVER_SERVE.value:
    logging.info("%s: --never_serve: not starting a server", config.task_name)
    time.sleep(24 * 3600)
  import tensorflow as tf  # only task processes import TensorFlow
  server = tf.distribute.Server(config.cluster_spec(), job_name=config.task_type,
                                task_index=config.task_index, protocol="grpc", start=True)
  logging.info("%s serving at %s", config.task_name, server.target)
  server.join()


if __name__ == "__main__":
  app.run(main)
