"""The exceptions tf-epochsync raises, one subclass per kind of failure.

Typical usage:
  try:
    ...
  except hooks.errors.BarrierTimeoutError as e:
    logging.error("worker(s) %s never arrived", e.missing)

The tree:

    EpochSyncError                  base of everything raised here
    +-- ConfigError (ValueError)    bad TF_CONFIG, flags or arguments; says what to change
    +-- ClusterLaunchError          the local launcher: a task crashed or timed out
    +-- SyncTimeoutError            a bounded wait expired
    |   +-- BarrierTimeoutError     an epoch barrier (start / epoch_end) expired
    |   +-- StepTimeoutError        a synchronous step's gradients or token never came
    |   +-- StartupTimeoutError     a worker's session: the chief never initialised the model
    |   +-- ClaimTimeoutError       a work queue's claim of the next unit never got an answer
    +-- TaskDiedError               a task this one waited for died or restarted
    +-- EpochIncompleteError        the session ended before num_epochs finished
    +-- WorkQueueError              a work queue's epoch is not exact (a unit missing or short)
    +-- UnsupportedTensorFlowError (ImportError)  `import hooks`: no TensorFlow, or not 2.15-2.21
    +-- EstimatorUnavailableError (ImportError)   `import estimator_ext`: no tf.estimator here
"""

from typing import Sequence

__all__ = [
    "EpochSyncError",
    "ConfigError",
    "ClusterLaunchError",
    "SyncTimeoutError",
    "BarrierTimeoutError",
    "StepTimeoutError",
    "StartupTimeoutError",
    "ClaimTimeoutError",
    "TaskDiedError",
    "EpochIncompleteError",
    "WorkQueueError",
    "WorkerFencedError",
    "FENCED_MARK",
    "UnsupportedTensorFlowError",
    "EstimatorUnavailableError",
    "raise_if_problems",
]


class EpochSyncError(Exception):
  """Base class of every error raised by tf-epochsync."""


class ConfigError(EpochSyncError, ValueError):
  """A TF_CONFIG, flag or argument value is invalid; the message says what to change."""


class ClusterLaunchError(EpochSyncError):
  """A task of a local cluster crashed or outlived the job's deadline."""


class SyncTimeoutError(EpochSyncError):
  """A bounded wait expired.

  Attributes:
    missing: the task names (`worker:2`, `chief:0`) that had not arrived.
  """

  def __init__(self, message: str, missing: Sequence[str] = ()):
    super().__init__(message)
    self.missing = tuple(missing)


class BarrierTimeoutError(SyncTimeoutError):
  """An epoch barrier timed out; `missing` names the tasks that never arrived."""


class StepTimeoutError(SyncTimeoutError):
  """A synchronous step waited too long for gradients or for its token."""


class StartupTimeoutError(SyncTimeoutError):
  """A worker's session creation timed out; `missing` names the chief it waited for."""


class ClaimTimeoutError(SyncTimeoutError):
  """A worker's claim of its next unit from the work queue on ps:0 got no answer in time."""


class TaskDiedError(EpochSyncError):
  """A task this one waited for died or restarted (its server is gone or has a new incarnation).

  Attributes:
    task: the dead task's name ("worker:2", "chief:0", "ps:1").
    where: where this task waited for it ('at barrier "epoch_end" in epoch 1').
  """

  def __init__(self, message: str, task: str, where: str = ""):
    super().__init__(message)
    self.task, self.where = task, where

  def __reduce__(self):
    return (TaskDiedError, (str(self), self.task, self.where))


class EpochIncompleteError(EpochSyncError):
  """The training session ended before the configured number of epochs finished."""


class WorkQueueError(EpochSyncError):
  """The work queue's epoch is not exact: a unit never handed out, never finished, or holding
  other counts than its worker trained or than its records; the message names each."""


# In the message of the step that a fenced worker's gate failed (hooks.workqueue.elastic_graph).
FENCED_MARK = "epochsync: this worker is fenced"


class WorkerFencedError(EpochSyncError):
  """(Elastic training) The chief found this worker lost and gave its unit to another; the
  worker ends without training more.

  Attributes:
    task: this worker's name ("worker:2").
  """

  def __init__(self, message: str, task: str):
    super().__init__(message)
    self.task = task

  def __reduce__(self):
    return (WorkerFencedError, (str(self), self.task))


class UnsupportedTensorFlowError(EpochSyncError, ImportError):
  """`import hooks` found no TensorFlow, or one outside 2.15-2.21; the message says what to install."""


class EstimatorUnavailableError(EpochSyncError, ImportError):
  """`import estimator_ext` found no tf.estimator: TensorFlow 2.16+ or no tensorflow-estimator 2.15.

  The message says which, and points at the `hooks` API, which works on TensorFlow 2.15-2.21.
  """


def raise_if_problems(problems: Sequence[str], what: str) -> None:
  """Raises one ConfigError listing every problem found in `what`, if there is any."""
  if problems:
    raise ConfigError(f"invalid {what} ({len(problems)} problem(s)):\n  - "
                      + "\n  - ".join(problems))
