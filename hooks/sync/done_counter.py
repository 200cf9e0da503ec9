"""Tells the PS "worker i is done with epoch e" the moment this worker's shard runs out.

The signal is a per-worker entry of `epochsync/done_epochs` on ps:0 (epoch + 1 once done),
plus every op registered under `graph_keys.DONE_OPS` (e.g. the sync optimizer's done
marker, which lets the aggregation stop waiting for this worker's gradients).

Typical usage:
  done = WorkerDoneHook(epoch_input, num_workers=3, worker_id=config.worker_id)
  hooks = [done, barrier, epoch_input.hook]
"""

from typing import Optional, Sequence

import tensorflow as tf

from hooks import graph_keys
from hooks import log as logging
from hooks.config.cluster import worker_problems
from hooks.data.epoch_input import EpochInput, EpochListener, EpochStats
from hooks.errors import ConfigError
from hooks.faults.waiting import run_options

__all__ = ["WorkerDoneHook"]

_v1 = tf.compat.v1
_RPC_TIMEOUT_SECS = 60.0


class WorkerDoneHook(_v1.train.SessionRunHook, EpochListener):
  """Signals the PS once per epoch that this worker has trained its whole shard.

  It acts before the epoch barrier (lower `order`), right after this worker's last step
  of the epoch, or at the epoch's start when the shard is empty.

    done = WorkerDoneHook(epoch_input, num_workers=3, worker_id=config.worker_id)
    with tf.compat.v1.train.MonitoredSession(session_creator=creator,
                                             hooks=[done, epoch_input.hook]) as sess:
      while not sess.should_stop(): sess.run(train_op)

  Args:
    epoch_input: `EpochInput` whose epoch ends are signalled.
    num_workers: `int`, training tasks (chief + workers).
    worker_id: `int`, this task's index in `worker_names`.
    worker_names: task names by worker id, for logs.
    ps_device: the device holding `epochsync/done_epochs`.

  Raises:
    ConfigError: for num_workers < 1 or a worker_id out of range.
  """

  order = 10

  def __init__(self, epoch_input: EpochInput, num_workers: int, worker_id: int,
               worker_names: Optional[Sequence[str]] = None,
               ps_device: str = "/job:ps/task:0"):
    problems = worker_problems(num_workers, worker_id, worker_names)
    if problems:
      raise ConfigError("WorkerDoneHook: " + "; ".join(problems))
    self.num_workers, self.worker_id = num_workers, worker_id
    self.task_name = (worker_names or [f"worker:{i}" for i in range(num_workers)])[worker_id]
    self._ps_device = ps_device
    epoch_input.add_listener(self)

  def begin(self):
    with _v1.device(self._ps_device), tf.name_scope("epochsync_done"):
      self._done_epochs = _v1.get_variable(
          "epochsync/done_epochs", [self.num_workers], tf.int64, _v1.zeros_initializer(),
          trainable=False, use_resource=False)
      _v1.add_to_collection(graph_keys.STATE_VARIABLES, self._done_epochs)
      self._epoch = _v1.placeholder(tf.int64, [], "epoch")
      mark = _v1.scatter_max(self._done_epochs, [self.worker_id], [self._epoch + 1])
      with tf.control_dependencies([mark]):
        self._num_done = tf.reduce_sum(
            tf.cast(self._done_epochs.read_value() > self._epoch, tf.int32))
    # Extra done signals (e.g. the sync optimizer's marker) run in the same session.run.
    self._extra = _v1.get_collection(graph_keys.DONE_OPS)

  def epoch_ended(self, session, stats: EpochStats) -> None:
    # Cannot block (a scatter and enqueues into unbounded queues); the deadline is generous.
    num_done, _ = session.run([self._num_done, self._extra], {self._epoch: stats.epoch},
                              options=run_options(_RPC_TIMEOUT_SECS))
    logging.info("%s done with epoch %d; %d/%d workers done", self.task_name, stats.epoch,
                 num_done, self.num_workers)  # Its batches and examples: the progress line.
