"""How a worker beyond the launch's cluster starts its server and its sessions (a job that may
grow: --epochsync_max_workers, docs/elastic.md, "More workers than the launch's").

The ps tasks know only the workers they were launched with, and a ps receives a worker's
tensors by calling that worker. Such a worker's sessions therefore bring their own cluster (the
ps tasks and itself) in `ConfigProto.cluster_def`, TensorFlow's ClusterSpec propagation, and ask
the ps tasks to serve them with the launch's variables
(`experimental.share_session_state_in_clusterspec_propagation`). TensorFlow refuses such a
cluster to a server booted as the task it names, so the worker's server boots as job
`JOINING_JOB`. tests/test_tf_cluster_propagation.py pins both conditions.

Typical usage (ClusterConfig's `start_server` and `session_config` call these):
  server = start_server(config.cluster_spec(), config.task_type, config.task_index,
                        own_address=None, config=session_config)   # a task of the launch
  session_config = with_propagated_cluster(session_config, ps_addresses, 3, "pod-3:2222")
"""

from typing import Any, Optional, Sequence

__all__ = ["JOINING_JOB", "start_server", "with_propagated_cluster"]

JOINING_JOB = "epochsync_joining"  # The job a worker beyond the launch's cluster boots as.


def with_propagated_cluster(session_config: Any, ps_addresses: Sequence[str],
                            worker_index: int, own_address: str) -> Any:
  """`session_config` (changed in place) with the cluster a session of `worker:worker_index`
  at `own_address` brings: the ps tasks and itself, the launch's variables shared. A config
  that brings a cluster already is left as it is."""
  if not session_config.HasField("cluster_def"):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    propagated = tf.train.ClusterSpec({"ps": list(ps_addresses),
                                       "worker": {worker_index: own_address}})
    session_config.cluster_def.CopyFrom(propagated.as_cluster_def())
    session_config.experimental.share_session_state_in_clusterspec_propagation = True
  return session_config


def start_server(cluster_spec: Any, task_type: str, task_index: int,
                 own_address: Optional[str], config: Any, protocol: Optional[str]) -> Any:
  """The started `tf.distribute.Server` of `task_type:task_index` in `cluster_spec`, or, given
  `own_address` (a worker beyond the launch), of a lone `JOINING_JOB` task there."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  if own_address is not None:
    cluster_spec = tf.train.ClusterSpec({JOINING_JOB: [own_address]})
    task_type, task_index = JOINING_JOB, 0
  return tf.distribute.Server(cluster_spec, job_name=task_type, task_index=task_index,
                              config=config, protocol=protocol)
