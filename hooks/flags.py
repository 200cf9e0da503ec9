"""Defines the --epochsync_* and cluster flags with their validators, and converts them to configs.

Typical usage:
  from hooks import flags as epochsync_flags
  def main(argv):
    cluster = epochsync_flags.cluster_from_flags()   # TF_CONFIG first, then --job_name etc.
    settings = epochsync_flags.settings_from_flags()
  app.run(main)
"""

import math

from absl import flags

from hooks import cluster as _cluster
from hooks import settings as _settings

__all__ = [
    "NUM_WORKERS",
    "NUM_EPOCHS",
    "BARRIER_TIMEOUT_SECS",
    "STARTUP_TIMEOUT_SECS",
    "STEP_TIMEOUT_SECS",
    "WARN_AFTER_SECS",
    "LOG_EVERY_SECS",
    "SYNC",
    "DIVIDE_BY_INITIAL_WORKERS",
    "define_cluster_flags",
    "cluster_from_flags",
    "settings_from_flags",
]

_DEFAULTS = _settings.EpochSyncSettings()


def _define_secs(name: str, default: float, help_text: str,
                 minimum: float = 0.0) -> flags.FlagHolder:
  """DEFINE_float with the rule "finite and > 0" (or ">= minimum") registered next to it."""
  holder = flags.DEFINE_float(name, default, help_text)
  rule = f">= {minimum}" if minimum else "> 0"
  flags.register_validator(
      name, lambda v: v is not None and math.isfinite(v) and v > 0 and v >= minimum,
      message=f"must be a finite number of seconds {rule}")
  return holder


NUM_WORKERS = flags.DEFINE_integer(
    "epochsync_num_workers", None,
    "Expected number of training tasks (chief + worker); if set, it must match TF_CONFIG or "
    "--chief_hosts/--worker_hosts.", lower_bound=1)
NUM_EPOCHS = flags.DEFINE_integer(
    "epochsync_num_epochs", _DEFAULTS.num_epochs, "Epochs to train; every worker reads its "
    "whole shard once per epoch.", lower_bound=1)
BARRIER_TIMEOUT_SECS = _define_secs(
    "epochsync_barrier_timeout_secs", _DEFAULTS.barrier_timeout_secs,
    "Seconds a task waits at an epoch barrier for the others before raising.")
STARTUP_TIMEOUT_SECS = _define_secs(
    "epochsync_startup_timeout_secs", _DEFAULTS.startup_timeout_secs,
    "Seconds a task waits for every other task to come up before raising.")
STEP_TIMEOUT_SECS = _define_secs(
    "epochsync_step_timeout_secs", _DEFAULTS.step_timeout_secs,
    "Seconds one synchronous step may wait for gradients or its token before raising.")
WARN_AFTER_SECS = _define_secs(
    "epochsync_warn_after_secs", _DEFAULTS.warn_after_secs,
    "A wait longer than this logs a WARNING naming the missing tasks; must be below "
    "--epochsync_barrier_timeout_secs.")
LOG_EVERY_SECS = _define_secs(
    "epochsync_log_every_secs", _DEFAULTS.log_every_secs,
    "Period of the INFO lines listing who is still missing during a wait; only the logging "
    "depends on it, never a deadline.", minimum=_settings.MIN_LOG_EVERY_SECS)
SYNC = flags.DEFINE_bool(
    "epochsync_sync", _DEFAULTS.sync,
    "Aggregate gradients synchronously over the active workers (else train asynchronously).")
DIVIDE_BY_INITIAL_WORKERS = flags.DEFINE_bool(
    "epochsync_divide_by_initial_workers", _DEFAULTS.divide_by_initial_workers,
    "Divide summed gradients by the initial worker count instead of the active one.")


@flags.multi_flags_validator([WARN_AFTER_SECS.name, BARRIER_TIMEOUT_SECS.name])
def _check_warn_before_timeout(values) -> bool:
  warn, limit = values[WARN_AFTER_SECS.name], values[BARRIER_TIMEOUT_SECS.name]
  if warn is not None and limit is not None and warn >= limit:
    raise flags.ValidationError(
        f"--{WARN_AFTER_SECS.name}={warn} must be < --{BARRIER_TIMEOUT_SECS.name}={limit}, "
        "or the warning comes after the timeout; lower the first or raise the second")
  return True


# Each settings field and the flag that sets it.
_SETTINGS_FLAGS = {
    "num_epochs": NUM_EPOCHS,
    "barrier_timeout_secs": BARRIER_TIMEOUT_SECS,
    "startup_timeout_secs": STARTUP_TIMEOUT_SECS,
    "step_timeout_secs": STEP_TIMEOUT_SECS,
    "warn_after_secs": WARN_AFTER_SECS,
    "log_every_secs": LOG_EVERY_SECS,
    "sync": SYNC,
    "divide_by_initial_workers": DIVIDE_BY_INITIAL_WORKERS,
}


def define_cluster_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """Defines the classic cluster flags that `flag_values` does not have yet.

  Called at import for absl.flags.FLAGS. Scripts such as tensorflow's mnist_replica.py define
  --job_name etc. themselves; those are kept as they are, provided they are defined before
  `hooks.flags` is imported. Calling this twice is harmless.

  Args:
    flag_values: `absl.flags.FlagValues` to define the flags in.
  """
  hosts = "Comma-separated host:port list of the {} job; ignored when TF_CONFIG is set."
  for define, name, help_text in (
      (flags.DEFINE_string, "job_name",
       "This task's job: chief, worker, ps or evaluator; ignored when TF_CONFIG is set."),
      (flags.DEFINE_integer, "task_index",
       "This task's index within --job_name; ignored when TF_CONFIG is set."),
      (flags.DEFINE_string, "ps_hosts", hosts.format("ps")),
      (flags.DEFINE_string, "worker_hosts", hosts.format("worker")),
      (flags.DEFINE_string, "chief_hosts", hosts.format("chief") + " Optional."),
      (flags.DEFINE_string, "evaluator_hosts", hosts.format("evaluator") + " Optional.")):
    if name not in flag_values:
      define(name, None, help_text, flag_values=flag_values)


define_cluster_flags()


def cluster_from_flags(flag_values: flags.FlagValues = flags.FLAGS) -> _cluster.ClusterConfig:
  """This task's ClusterConfig: TF_CONFIG if set, else the cluster flags; see `cluster.resolve`.

  Raises:
    ConfigError: the cluster is invalid or disagrees with --epochsync_num_workers.
  """
  num_workers = (getattr(flag_values, NUM_WORKERS.name) if NUM_WORKERS.name in flag_values
                 else None)
  return _cluster.resolve(flag_values=flag_values, num_workers=num_workers)


def settings_from_flags(flag_values: flags.FlagValues = flags.FLAGS) -> _settings.EpochSyncSettings:
  """The parsed --epochsync_* flags as an EpochSyncSettings.

  Raises:
    ConfigError: a value breaks a rule of EpochSyncSettings (possible if set after parsing).
  """
  return _settings.EpochSyncSettings(
      **{field: getattr(flag_values, holder.name) for field, holder in _SETTINGS_FLAGS.items()})
