"""In-loop evaluation on the chief (train -> barrier -> save -> evaluate -> release) and its stop.

`InLoopEvaluation` is a chief action of the epoch barrier, registered after the epoch save: it
evaluates the checkpoint just saved while every worker is still held, writes the eval line, and
applies early stopping. `StopAfterEpochHook` (on every task) carries the decision: the chief sets
`epochsync/stop_after_epoch` on ps:0 before the release, and each task, right after the release,
ends its training at that epoch boundary.

Typical usage (what estimator_ext.train_and_evaluate does on the chief):
  stop = StopAfterEpochHook(epoch_input, config.task_name, is_chief=True)
  barrier.add_chief_action(InLoopEvaluation(estimator, eval_spec, save_hook, stop, config))
"""

import time
from typing import Any, Dict, List, Optional

import tensorflow as tf

from estimator_ext import eval_log
from estimator_ext.early_stopping import EarlyStoppingState
from hooks import log as logging
from hooks.checkpoint.epoch_save import ChiefSaveAfterBarrierHook
from hooks.data.epoch_input import EpochInput, EpochListener, EpochStats
from hooks.faults.waiting import run_options

__all__ = ["InLoopEvaluation", "StopAfterEpochHook"]

_v1 = tf.compat.v1
# Reads and assignments of one scalar on ps:0 never wait on a peer; this bounds a dead ps.
_RUN_OPTIONS = run_options(60.0)


class StopAfterEpochHook(_v1.train.SessionRunHook, EpochListener):
  """Ends training on every task at the epoch boundary the chief chose (early stopping).

  It acts right after the epoch barrier (order 25 > the barrier's 20): a task that reads
  `stop_after_epoch == e` after epoch e's release trains no further epoch and its session ends
  cleanly. The variable is not checkpointed; after a restart the chief sets it again from its
  eval log before the start barrier.

    stop = StopAfterEpochHook(epoch_input, "worker:1", is_chief=False)
    hooks = [done, barrier, stop, epoch_input.hook]

  Args:
    epoch_input: the `EpochInput` whose `num_epochs` is cut short.
    task_name: `str` this task, for logs.
    is_chief: `bool` this task initialises the variable (before the start barrier).
    ps_device: the device of `epochsync/stop_after_epoch` ("" in local mode).
  """

  order = 25

  def __init__(self, epoch_input: EpochInput, task_name: str, is_chief: bool,
               ps_device: str = "/job:ps/task:0"):
    self._input, self.task_name, self._is_chief = epoch_input, task_name, is_chief
    self._ps_device = ps_device
    self.restored_stop: Optional[int] = None  # The chief: an early stop found in its eval log.
    self.stopped_after: Optional[int] = None
    epoch_input.add_listener(self)

  def begin(self):
    with _v1.device(self._ps_device):
      self._var = _v1.get_variable(
          "epochsync/stop_after_epoch", [], tf.int64, _v1.constant_initializer(-1),
          trainable=False, collections=[], use_resource=False)
      self._value = _v1.placeholder(tf.int64, [], "stop_after_epoch_value")
      self._assign = self._var.assign(self._value)

  def after_create_session(self, session, coord):
    if self._is_chief:  # Before epoch_input.hook runs the start barrier.
      session.run(self._var.initializer, options=_RUN_OPTIONS)
      if self.restored_stop is not None:
        session.run(self._assign, {self._value: self.restored_stop}, options=_RUN_OPTIONS)

  def stop_after(self, session, epoch: int) -> None:
    """The chief, before releasing epoch `epoch`: every task stops after it."""
    session.run(self._assign, {self._value: epoch}, options=_RUN_OPTIONS)

  def session_created(self, session, start_epoch: int) -> None:
    stop = int(session.run(self._var, options=_RUN_OPTIONS))
    if 0 <= stop < start_epoch:
      logging.info("%s: training stopped early after epoch %d in an earlier run; nothing to do",
                   self.task_name, stop)
      self.stopped_after = stop
      self._input.num_epochs = start_epoch

  def epoch_ended(self, session, stats: EpochStats) -> None:
    if stats.epoch + 1 >= self._input.num_epochs:
      return
    if int(session.run(self._var, options=_RUN_OPTIONS)) == stats.epoch:
      logging.info("%s stops after epoch %d of %d: the chief's early stopping", self.task_name,
                   stats.epoch, self._input.num_epochs)
      self.stopped_after = stats.epoch
      self._input.num_epochs = stats.epoch + 1


class InLoopEvaluation:
  """The chief's barrier action after the save: evaluate the epoch, then maybe stop training.

  It runs while every worker waits at the epoch barrier, so the next epoch starts only after the
  result is known (its time counts against --epochsync_barrier_timeout_secs on the workers).

    evaluation = InLoopEvaluation(estimator, eval_spec, save_hook, stop_hook, config)
    barrier.add_chief_action(evaluation)  # after ChiefSaveAfterBarrierHook registered its save

  Args:
    estimator: the `Estimator` being trained.
    eval_spec: `tf.estimator.EvalSpec` (input_fn, steps, name, hooks, exporters).
    save: the chief's `ChiefSaveAfterBarrierHook` (its `saved` paths).
    stop: this task's `StopAfterEpochHook`.
    config: the `EpochSyncRunConfig` (num_epochs, early_stopping, task_name).
  """

  def __init__(self, estimator, eval_spec, save: ChiefSaveAfterBarrierHook,
               stop: StopAfterEpochHook, config):
    self._estimator, self._spec, self._save, self._stop = estimator, eval_spec, save, stop
    self._num_epochs = config.settings.num_epochs
    self._task = config.task_name
    self._state = EarlyStoppingState(config.early_stopping) if config.early_stopping else None
    self.exports: Dict[int, List[Any]] = {}
    for line in eval_log.read_eval_log(estimator.model_dir, self._task, eval_spec.name):
      if self._state:  # Rebuild the best epoch and the patience count after a restart.
        self._state.update(line["epoch"], line["metrics"])
      if line.get("early_stop"):
        stop.restored_stop = line["epoch"]

  def __call__(self, session, epoch: int, arrivals) -> Dict[str, Any]:
    checkpoint = self._save.saved[epoch]
    metrics, line = eval_log.evaluate_checkpoint(self._estimator, self._spec, epoch, checkpoint,
                                                 self._task)
    last = epoch + 1 >= self._num_epochs
    reason = self._state.update(epoch, metrics) if self._state else None
    if reason and not last:
      self._stop.stop_after(session, epoch)
      line["early_stop"] = reason
      logging.info("%s: %s; every task stops after epoch %d", self._task, reason, epoch)
    else:
      reason = None
    self.exports[epoch] = eval_log.export(self._estimator, self._spec, checkpoint, metrics,
                                          is_final=last or reason is not None)
    eval_log.append_line(self._estimator, self._spec, self._task, line)
    fields: Dict[str, Any] = {"eval": line["metrics"], "evaluated_at": time.time()}
    if reason:
      fields["early_stop"] = reason
    return fields
