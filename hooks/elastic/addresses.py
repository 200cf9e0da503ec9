"""Where each worker beyond the launch's cluster listens, kept on ps:0 for the chief's probes.

A job that may grow (--epochsync_max_workers) has worker slots that no task's cluster gave an
address at the launch: a worker that comes up in one (a replica count raised on a running
TFJob) writes its own address here before it joins, and the chief, once it sees the join, reads
it and probes that worker as it probes the others (hooks.faults.liveness). A relaunched process
writes it again before its join, so the chief probes the address of the process that joined.

The table is a hash table resource on ps:0 shared by name (`shared_name`), which every task's
graph, and the joining worker's propagated session, finds in ps:0's resource manager. It is not
a variable: no checkpoint holds it and no initializer resets it; a ps:0 that restarts ends the
job, whose relaunched workers write their addresses again.

Typical usage (hooks.session.wiring with --epochsync_max_workers):
  addresses = WorkerAddresses(ps_device="/job:ps/task:0")    # every task, before the session
  addresses.write(session, config.worker_id, "pod-4.svc:2222")   # the joining worker
  address = addresses.read(session, 4)                           # the chief: "" if none
"""

import tensorflow as tf

from hooks.faults.waiting import run_uncancelled

__all__ = ["WorkerAddresses"]

_v1 = tf.compat.v1
_RUN_TIMEOUT_SECS = 60.0  # a write or a read waits for nothing but ps:0
_SHARED_NAME = "epochsync_worker_addresses"


class WorkerAddresses:
  """The worker id -> "host:port" table on `ps_device`; build it before the graph is final."""

  def __init__(self, ps_device: str):
    with _v1.device(ps_device), tf.name_scope("epochsync_worker_addresses"):
      table = tf.raw_ops.MutableHashTableV2(key_dtype=tf.int64, value_dtype=tf.string,
                                            shared_name=_SHARED_NAME,
                                            use_node_name_sharing=False)
      self._worker = _v1.placeholder(tf.int64, [], "worker")
      self._address = _v1.placeholder(tf.string, [], "address")
      self._write = tf.raw_ops.LookupTableInsertV2(
          table_handle=table, keys=tf.reshape(self._worker, [1]),
          values=tf.reshape(self._address, [1]))
      self._read = tf.raw_ops.LookupTableFindV2(
          table_handle=table, keys=self._worker, default_value=tf.constant("", tf.string))

  def write(self, session, worker_id: int, address: str) -> None:
    """Records that worker `worker_id` listens at `address` (its last write wins)."""
    run_uncancelled(session, self._write, {self._worker: worker_id, self._address: address},
                    _RUN_TIMEOUT_SECS)

  def read(self, session, worker_id: int) -> str:
    """The address worker `worker_id` last wrote, or "" if none did."""
    return run_uncancelled(session, self._read, {self._worker: worker_id},
                           _RUN_TIMEOUT_SECS).decode()
