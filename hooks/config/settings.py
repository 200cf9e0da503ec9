"""The knobs of epoch-synchronous training (epochs, timeouts, sync mode), validated together.

Typical usage:
  settings = EpochSyncSettings(num_epochs=3, barrier_timeout_secs=600)
  settings = hooks.config.flags.settings_from_flags()   # the same, from --epochsync_* flags
"""

import dataclasses
import math
from typing import Any, Callable

from hooks.errors import raise_if_problems

__all__ = ["EpochSyncSettings", "MIN_LOG_EVERY_SECS"]

# The shortest log period accepted: every wait holds its deadline whatever the period (the
# waits do not depend on it), but more than one "still waiting" line per millisecond is noise.
MIN_LOG_EVERY_SECS = 0.001


def _positive_secs(v: Any) -> bool:
  return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0


@dataclasses.dataclass(frozen=True)
class EpochSyncSettings:
  """The knobs of epoch-synchronous training; `hooks.config.flags.settings_from_flags()` fills it in.

  Usage:

      settings = EpochSyncSettings(num_epochs=3, barrier_timeout_secs=600)

  Args:
    num_epochs: `int` epochs to train, >= 1.
    barrier_timeout_secs: `float` longest wait at an epoch barrier without progress of the
      tasks it waits for (docs/mts.md), > 0.
    startup_timeout_secs: `float` deadline for every task to come up, > 0.
    step_timeout_secs: `float` longest wait of one synchronous step without progress, and
      longest asynchronous step (hooks.faults.stuck_step), > 0; with `elastic`, the longest a
      worker may answer no probe before the chief treats it as lost (half of it when
      synchronous).
    warn_after_secs: `float` a wait logs a WARNING after this long; > 0, < barrier_timeout_secs.
    log_every_secs: `float` period of the "still waiting" INFO lines, >= 0.001.
    progress_secs: `float` period of a worker's progress line within a long epoch, > 0.
    sync: `bool` aggregate gradients synchronously.
    divide_by_initial_workers: `bool` average over the initial, not the active, worker count.
    save_checkpoint_secs: `float` period of the chief's mid-epoch checkpoints, >= 0 (0: none).
    save_checkpoint_steps: `int` the same in steps, >= 0 (0: none); at most one of the two > 0.
    unit_seed: `int` a work queue's order of the units in each epoch is drawn from (seed, epoch).
    unit_shuffle: `bool` reshuffle a work queue's units every epoch (False: their order as given).
    claim_timeout_secs: `float` how long a work queue's claim may go unanswered, > 0.
    elastic: `bool` a lost worker does not stop the job: the chief takes its unit back and the
      others go on (training through a work queue; docs/elastic.md).
    spare_workers: `int` with `elastic`, the job's last this many worker tasks stand by as
      spares and join in place of lost workers, >= 0 (docs/elastic.md).
    optional_workers: `int` with `elastic`, the job's last this many worker tasks are optional:
      the job starts without them and each joins the running job when its process comes up
      (a pod scheduled late), >= 0; not with spare_workers (docs/elastic.md).

  Raises:
    ConfigError: listing every invalid field with its value, the rule and the flag that sets it.
  """

  num_epochs: int = 1
  barrier_timeout_secs: float = 1800.0
  startup_timeout_secs: float = 600.0
  step_timeout_secs: float = 600.0
  warn_after_secs: float = 60.0
  log_every_secs: float = 30.0
  progress_secs: float = 10.0
  sync: bool = True
  divide_by_initial_workers: bool = False
  # As MonitoredTrainingSession's and RunConfig's default: a save every 600 s (docs/mts.md).
  save_checkpoint_secs: float = 600.0
  save_checkpoint_steps: int = 0
  unit_seed: int = 0
  unit_shuffle: bool = True
  claim_timeout_secs: float = 600.0
  elastic: bool = False
  spare_workers: int = 0
  optional_workers: int = 0

  def __post_init__(self):
    problems = []

    def _validate(name: str, predicate: Callable[[Any], bool], rule: str) -> None:
      if not predicate(getattr(self, name)):
        problems.append(f"{name}={getattr(self, name)!r} {rule} (flag --epochsync_{name})")

    secs, is_bool = "must be a finite number of seconds > 0", lambda v: isinstance(v, bool)
    _validate("num_epochs", lambda v: isinstance(v, int) and not is_bool(v) and v >= 1,
              "must be an integer >= 1")
    _validate("barrier_timeout_secs", _positive_secs, secs)
    _validate("startup_timeout_secs", _positive_secs, secs)
    _validate("step_timeout_secs", _positive_secs, secs)
    _validate("warn_after_secs", _positive_secs, secs)
    _validate("warn_after_secs", lambda v: not _positive_secs(v) or v < self.barrier_timeout_secs,
              f"must be < barrier_timeout_secs={self.barrier_timeout_secs!r}; lower it or raise "
              "the timeout")
    _validate("log_every_secs", lambda v: _positive_secs(v) and v >= MIN_LOG_EVERY_SECS,
              f"must be a finite number of seconds >= {MIN_LOG_EVERY_SECS}")
    _validate("progress_secs", _positive_secs, secs)
    _validate("sync", is_bool, "must be True or False")
    _validate("divide_by_initial_workers", is_bool, "must be True or False")
    _validate("save_checkpoint_secs", lambda v: v == 0 or _positive_secs(v),
              "must be a finite number of seconds >= 0 (0: no mid-epoch checkpoint)")
    _validate("save_checkpoint_steps", lambda v: isinstance(v, int) and not is_bool(v) and v >= 0,
              "must be an integer >= 0 (0: no mid-epoch checkpoint)")
    _validate("save_checkpoint_steps",
              lambda v: not (isinstance(v, int) and v > 0 and self.save_checkpoint_secs != 0),
              f"and save_checkpoint_secs={self.save_checkpoint_secs!r} are both set: set one "
              "(the other to 0)")
    _validate("unit_seed", lambda v: isinstance(v, int) and not is_bool(v) and v >= 0,
              "must be an integer >= 0")
    _validate("unit_shuffle", is_bool, "must be True or False")
    _validate("claim_timeout_secs", _positive_secs, secs)
    _validate("elastic", is_bool, "must be True or False")
    _validate("spare_workers", lambda v: isinstance(v, int) and not is_bool(v) and v >= 0,
              "must be an integer >= 0")
    _validate("spare_workers", lambda v: not (isinstance(v, int) and v > 0 and not self.elastic),
              "needs elastic=True (--epochsync_elastic): a spare joins in place of a lost "
              "worker, and only an elastic job goes on without one")
    _validate("optional_workers", lambda v: isinstance(v, int) and not is_bool(v) and v >= 0,
              "must be an integer >= 0")
    _validate("optional_workers",
              lambda v: not (isinstance(v, int) and v > 0 and not self.elastic),
              "needs elastic=True (--epochsync_elastic): an optional worker joins the running "
              "job, and only an elastic job goes on without a worker")
    _validate("optional_workers",
              lambda v: not (isinstance(v, int) and v > 0 and self.spare_workers),
              f"and spare_workers={self.spare_workers!r} are both set: a job has spares or "
              "optional workers, not both; set one (the other to 0)")
    raise_if_problems(problems, "EpochSyncSettings")
