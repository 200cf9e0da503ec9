"""Every training task's side of mid-epoch checkpoints: skip what was trained, count batches.

The chief restores a mid-epoch checkpoint (hooks.checkpoint.mid_epoch); at session start each worker
reads the position it holds and skips the batches of its shard the checkpoint includes
(synchronous: min(S, shard); asynchronous: its own applied count), after checking the worker
count and its shard's size. Asynchronous training counts each worker's applied batches here.
With a work queue a worker skips no shard: it starts at the step position (S, or 0 when
asynchronous) and the units in flight skip their own batches (hooks.checkpoint.unit_resume).

Typical usage (hooks.epoch_sync_hooks does this):
  resume = MidEpochResume(epoch_input, num_workers, worker_id, count_applied=not sync)
  hooks = [..., resume, ..., epoch_input.hook]
"""

from typing import Optional, Sequence

import numpy as np
import tensorflow as tf

from hooks import graph_keys
from hooks import log as logging
from hooks.checkpoint import mid_epoch
from hooks.data.epoch_input import EpochInput, EpochListener, EpochStats
from hooks.errors import ConfigError
from hooks.checkpoint.mid_epoch import EPOCH, EPOCH_SHIFT, MID_EPOCH_DIR, STEPS, WORKERS
from hooks.faults.waiting import run_options
from hooks.workqueue.unit_passes import work_queue_of

__all__ = ["MidEpochResume"]

_v1 = tf.compat.v1
_TIMEOUT_SECS = 60.0


class MidEpochResume(_v1.train.SessionRunHook, EpochListener):
  """Every training task: skips what it trained before a mid-epoch checkpoint; counts batches.

  At session start it reads the restored position: in the checkpoint's epoch it skips
  min(S, shard) batches (synchronous) or its own applied count (asynchronous), after checking
  that the worker count and its shard's size are those the checkpoint was saved with. It
  records its shard's size (the cardinality, else the batches counted in an epoch) for that
  check, and in asynchronous mode counts its applied batches in each step's run.

  Raises:
    ConfigError: (at session start) the checkpoint was saved with another worker count or
      another size of this worker's shard; the message says what to do.
  """
  order = 30

  def __init__(self, epoch_input: EpochInput, num_workers: int, worker_id: int,
               worker_names: Optional[Sequence[str]] = None, count_applied: bool = False,
               ps_device: str = "/job:ps/task:0"):
    self._input, self._n, self._id, self._ps = epoch_input, num_workers, worker_id, ps_device
    self.task_name = (worker_names or [f"worker:{i}" for i in range(num_workers)])[worker_id]
    self._count_applied = count_applied
    self._by_unit = work_queue_of(epoch_input) is not None  # Units skip their own batches.
    self._cardinality = 0  # The shard's cardinality as read at session start (< 0 unknown).
    epoch_input.add_listener(self)

  def begin(self):
    state = mid_epoch.state(self._n, self._ps)
    with _v1.device(self._ps), tf.name_scope("epochsync_mid_epoch/resume"):
      self._value = _v1.placeholder(tf.int64, [], "value")
      self._set_shard = _v1.scatter_update(state["shard_batches"], [self._id], [self._value])
      self._set_applied = _v1.scatter_update(state["applied"], [self._id], [self._value])
      self._read = (state["position"].read_value(), state["shard_batches"][self._id],
                    state["applied"][self._id], self._input.batches_per_epoch_tensor)
      if self._count_applied:  # In the run that consumes the batch.
        self._input.add_step_op(_v1.scatter_add(state["applied"], [self._id], [1]).op)

  def resume_batches(self, session, epoch: int) -> Optional[int]:
    position, saved, applied, cardinality = (int(x) if np.ndim(x) == 0 else [int(v) for v in x]
                                             for x in session.run(self._read))
    skip = None
    if position[EPOCH] == epoch:
      skip = self._check_and_skip(epoch, position, saved, applied, cardinality)
      if self._by_unit and self._count_applied:
        # Before this worker's first claim: a save between that claim and epoch_started must
        # not pair the unit's new first_batch with the earlier attempt's count.
        session.run(self._set_applied, {self._value: epoch * EPOCH_SHIFT},
                    options=run_options(_TIMEOUT_SECS))
    self._cardinality = cardinality
    if cardinality >= 0:
      session.run(self._set_shard, {self._value: cardinality})
    return skip

  def _check_and_skip(self, epoch: int, position, saved: int, applied: int,
                      cardinality: int) -> int:
    if self._by_unit:  # A work queue: any worker count; the units in flight skip (unit_resume).
      return max(position[STEPS], 0)  # The workers' position: step S, or 0 (asynchronous).
    what_to_do = ("resume from the last epoch checkpoint instead (delete <model_dir>/"
                  f"{MID_EPOCH_DIR}; the epoch is then trained again from its start)")
    if position[WORKERS] != self._n:
      raise ConfigError(
          f"{self.task_name}: the mid-epoch checkpoint of epoch {epoch} was saved by a job of "
          f"{position[WORKERS]} workers and this job has {self._n}: a worker's position holds "
          f"only for the shards it was saved with; restart with {position[WORKERS]} workers, "
          f"or {what_to_do}")
    if saved >= 0 and cardinality >= 0 and saved != cardinality:
      raise ConfigError(
          f"{self.task_name}: its shard had {saved} batches when the mid-epoch checkpoint of "
          f"epoch {epoch} was saved and has {cardinality} now: skipping what it trained would "
          f"resume at another example; restore the same shard (same data, same order), or "
          f"{what_to_do}")
    if position[STEPS] >= 0:
      skip = position[STEPS]
    else:  # Asynchronous: this worker's own count, if it was counting in this epoch.
      skip = graph_keys.batches_in_epoch(applied, epoch)
    known = cardinality if cardinality >= 0 else saved
    skip = min(skip, known) if known >= 0 else skip
    logging.info("%s resumes epoch %d from a mid-epoch checkpoint: skips the %d batches of its "
                 "shard trained before it", self.task_name, epoch, skip)
    return skip

  def epoch_started(self, session, epoch: int) -> None:
    if self._count_applied:
      session.run(self._set_applied, {self._value: epoch * EPOCH_SHIFT + self._input.hook.batches},
                  options=run_options(_TIMEOUT_SECS))

  def epoch_ended(self, session, stats: EpochStats) -> None:
    if self._cardinality < 0:  # Unknown: the size as counted.
      session.run(self._set_shard, {self._value: stats.batches}, options=run_options(_TIMEOUT_SECS))
