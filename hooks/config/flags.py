"""Defines the --epochsync_* and cluster flags with their validators, and converts them to configs.

Every --epochsync_x flag can also be set by the environment variable EPOCHSYNC_X: a flag given on
the command line wins over the variable, the variable over the default. The variables are read by
`settings_from_flags()` and `cluster_from_flags()` (or `apply_env()`), which also work when the
flags were never parsed (a job that does not use absl): then only the variables count.

Typical usage:
  from hooks.config import flags as epochsync_flags
  def main(argv):
    cluster = epochsync_flags.cluster_from_flags()   # TF_CONFIG first, then --job_name etc.
    settings = epochsync_flags.settings_from_flags()  # flags, then EPOCHSYNC_* variables
  app.run(main)
"""

import math
import os
from typing import Any, Dict, Mapping, Optional

from absl import flags

from hooks.config import cluster as _cluster
from hooks.config import env_flags
from hooks.config.env_flags import env_var
from hooks.config import setting_sources as _sources
from hooks.config import settings as _settings
from hooks.errors import ConfigError

__all__ = [
    "NUM_WORKERS",
    "MAX_WORKERS",
    "NUM_EPOCHS",
    "BARRIER_TIMEOUT_SECS",
    "STARTUP_TIMEOUT_SECS",
    "STEP_TIMEOUT_SECS",
    "WARN_AFTER_SECS",
    "LOG_EVERY_SECS",
    "PROGRESS_SECS",
    "SAVE_CHECKPOINT_SECS",
    "SAVE_CHECKPOINT_STEPS", "UNIT_SEED", "UNIT_SHUFFLE", "CLAIM_TIMEOUT_SECS",
    "ELASTIC", "SPARE_WORKERS", "OPTIONAL_WORKERS",
    "SYNC",
    "DIVIDE_BY_INITIAL_WORKERS",
    "ENV_PREFIX",
    "EPOCHSYNC_FLAGS",
    "env_var",
    "apply_env",
    "define_cluster_flags",
    "cluster_from_flags",
    "settings_from_flags",
]

ENV_PREFIX = "EPOCHSYNC_"

_DEFAULTS = _settings.EpochSyncSettings()


_SECS_RULES: Dict[str, str] = {}  # For docs/flags.md: each seconds flag's rule ("> 0", ...).


def _define_secs(name: str, default: float, help_text: str,
                 minimum: float = 0.0) -> flags.FlagHolder:
  """DEFINE_float with the rule "finite and > 0" (or ">= minimum") registered next to it."""
  holder = flags.DEFINE_float(name, default, help_text)
  rule = f">= {minimum}" if minimum else "> 0"
  flags.register_validator(
      name, lambda v: v is not None and math.isfinite(v) and v > 0 and v >= minimum,
      message=f"must be a finite number of seconds {rule}")
  _SECS_RULES[name] = rule
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
    "Seconds a task waits at an epoch barrier while the tasks it waits for make no progress (no "
    "step; a save of the chief counts as progress) before raising; an epoch may last longer.")
STARTUP_TIMEOUT_SECS = _define_secs(
    "epochsync_startup_timeout_secs", _DEFAULTS.startup_timeout_secs,
    "Seconds a task waits for every other task to come up before raising (at the start barrier, "
    "and for the chief's initialisation and start of the run: seconds without progress of the "
    "tasks it waits for; a chief restoring a checkpoint makes progress).")
STEP_TIMEOUT_SECS = _define_secs(
    "epochsync_step_timeout_secs", _DEFAULTS.step_timeout_secs,
    "Seconds one synchronous step may wait for gradients or its token while no task makes "
    "progress (a save of the chief counts as progress) before raising; in asynchronous "
    "training, seconds one step may stay in session.run before its process ends (exit 1); "
    "with --epochsync_elastic, seconds a worker may answer no probe before the chief treats "
    "it as lost (frozen; half of it in synchronous training, whose steps wait for it until "
    "then).")
WARN_AFTER_SECS = _define_secs(
    "epochsync_warn_after_secs", _DEFAULTS.warn_after_secs,
    "A wait whose tasks made no progress for longer than this logs a WARNING naming them; "
    "must be below "
    "--epochsync_barrier_timeout_secs.")
LOG_EVERY_SECS = _define_secs(
    "epochsync_log_every_secs", _DEFAULTS.log_every_secs,
    "Period of the INFO lines listing who is still missing during a wait; only the logging "
    "depends on it, never a deadline.", minimum=_settings.MIN_LOG_EVERY_SECS)
PROGRESS_SECS = _define_secs(
    "epochsync_progress_secs", _DEFAULTS.progress_secs,
    "Period of a worker's progress line (batches done, examples/s) within a long epoch; every "
    "epoch's end logs one line anyway.")
SYNC = flags.DEFINE_bool(
    "epochsync_sync", _DEFAULTS.sync,
    "Aggregate gradients synchronously over the active workers (else train asynchronously).")
DIVIDE_BY_INITIAL_WORKERS = flags.DEFINE_bool(
    "epochsync_divide_by_initial_workers", _DEFAULTS.divide_by_initial_workers,
    "Divide summed gradients by the initial worker count instead of the active one.")
SAVE_CHECKPOINT_SECS = flags.DEFINE_float(
    "epochsync_save_checkpoint_secs", _DEFAULTS.save_checkpoint_secs,
    "Period of the chief's mid-epoch checkpoints in seconds (0: none); a restart resumes each "
    "worker's shard after the last batch saved. As MonitoredTrainingSession's default, 600.")
flags.register_validator(SAVE_CHECKPOINT_SECS.name,
                         lambda v: v is not None and math.isfinite(v) and v >= 0,
                         message="must be a finite number of seconds >= 0 (0: none)")
_SECS_RULES[SAVE_CHECKPOINT_SECS.name] = ">= 0 (0: none)"
SAVE_CHECKPOINT_STEPS = flags.DEFINE_integer(
    "epochsync_save_checkpoint_steps", _DEFAULTS.save_checkpoint_steps,
    "Period of the chief's mid-epoch checkpoints in global steps (0: none); set it or "
    "--epochsync_save_checkpoint_secs, not both.", lower_bound=0)

UNIT_SEED = flags.DEFINE_integer(
    "epochsync_unit_seed", _DEFAULTS.unit_seed,
    "A work queue's order of the units in each epoch is drawn from (this seed, the epoch).",
    lower_bound=0)
UNIT_SHUFFLE = flags.DEFINE_bool(
    "epochsync_unit_shuffle", _DEFAULTS.unit_shuffle,
    "Reshuffle a work queue's units every epoch (false: their order as given, every epoch).")
CLAIM_TIMEOUT_SECS = _define_secs(
    "epochsync_claim_timeout_secs", _DEFAULTS.claim_timeout_secs,
    "Seconds a work queue's claim of the next unit may go unanswered (retried safely: a claim "
    "is answered once) before raising ClaimTimeoutError.")
ELASTIC = flags.DEFINE_bool(
    "epochsync_elastic", _DEFAULTS.elastic,
    "A lost worker does not stop the job: the chief takes its unit back into the work queue and "
    "the others go on (training through a work queue, asynchronous or synchronous; "
    "docs/elastic.md).")
SPARE_WORKERS = flags.DEFINE_integer(
    "epochsync_spare_workers", _DEFAULTS.spare_workers,
    "With --epochsync_elastic, the job's last this many worker tasks stand by as spares (graph "
    "built, session up) and join in place of lost workers (docs/elastic.md).", lower_bound=0)
OPTIONAL_WORKERS = flags.DEFINE_integer(
    "epochsync_optional_workers", _DEFAULTS.optional_workers,
    "With --epochsync_elastic, the job's last this many worker tasks are optional: the job "
    "starts without them, and each joins the running job when its process comes up (a pod "
    "scheduled late); not with --epochsync_spare_workers (docs/elastic.md).", lower_bound=0)
MAX_WORKERS = flags.DEFINE_integer(
    "epochsync_max_workers", None,
    "With --epochsync_elastic, the most training tasks (chief + worker) the job may grow to: "
    "workers beyond the launch's --epochsync_num_workers (a replica count raised on a running "
    "TFJob) join the running job; set both, the same on every task (docs/elastic.md).",
    lower_bound=1)


@flags.multi_flags_validator([SAVE_CHECKPOINT_SECS.name, SAVE_CHECKPOINT_STEPS.name])
def _check_one_save_period(values) -> bool:
  secs, steps = values[SAVE_CHECKPOINT_SECS.name], values[SAVE_CHECKPOINT_STEPS.name]
  if secs and steps:
    raise flags.ValidationError(
        f"--{SAVE_CHECKPOINT_SECS.name}={secs} and --{SAVE_CHECKPOINT_STEPS.name}={steps} are "
        f"both set: set one, the other to 0")
  return True


@flags.multi_flags_validator([WARN_AFTER_SECS.name, BARRIER_TIMEOUT_SECS.name])
def _check_warn_before_timeout(values) -> bool:
  warn, limit = values[WARN_AFTER_SECS.name], values[BARRIER_TIMEOUT_SECS.name]
  if warn is not None and limit is not None and warn >= limit:
    raise flags.ValidationError(
        f"--{WARN_AFTER_SECS.name}={warn} must be < --{BARRIER_TIMEOUT_SECS.name}={limit}, "
        "or the warning comes after the timeout; lower the first or raise the second")
  return True


# Rules that involve two flags, for docs/flags.md (the validator above enforces it).
_CROSS_RULES = {WARN_AFTER_SECS.name: f"< --{BARRIER_TIMEOUT_SECS.name}",
                SAVE_CHECKPOINT_STEPS.name: f"not with --{SAVE_CHECKPOINT_SECS.name} > 0"}

# Every --epochsync_* flag, in the order of docs/flags.md.
EPOCHSYNC_FLAGS = (NUM_EPOCHS, NUM_WORKERS, SYNC, DIVIDE_BY_INITIAL_WORKERS, STARTUP_TIMEOUT_SECS,
                   BARRIER_TIMEOUT_SECS, STEP_TIMEOUT_SECS, WARN_AFTER_SECS, LOG_EVERY_SECS,
                   PROGRESS_SECS, SAVE_CHECKPOINT_SECS, SAVE_CHECKPOINT_STEPS, UNIT_SEED,
                   UNIT_SHUFFLE, CLAIM_TIMEOUT_SECS, ELASTIC, SPARE_WORKERS, OPTIONAL_WORKERS,
                   MAX_WORKERS)

# Each settings field and the flag that sets it.
_SETTINGS_FLAGS = {
    "num_epochs": NUM_EPOCHS,
    "barrier_timeout_secs": BARRIER_TIMEOUT_SECS,
    "startup_timeout_secs": STARTUP_TIMEOUT_SECS,
    "step_timeout_secs": STEP_TIMEOUT_SECS,
    "warn_after_secs": WARN_AFTER_SECS,
    "log_every_secs": LOG_EVERY_SECS,
    "progress_secs": PROGRESS_SECS,
    "sync": SYNC,
    "divide_by_initial_workers": DIVIDE_BY_INITIAL_WORKERS,
    "save_checkpoint_secs": SAVE_CHECKPOINT_SECS,
    "save_checkpoint_steps": SAVE_CHECKPOINT_STEPS,
    "unit_seed": UNIT_SEED,
    "unit_shuffle": UNIT_SHUFFLE,
    "claim_timeout_secs": CLAIM_TIMEOUT_SECS,
    "elastic": ELASTIC,
    "spare_workers": SPARE_WORKERS,
    "optional_workers": OPTIONAL_WORKERS,
}


def define_cluster_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """Defines the classic cluster flags that `flag_values` does not have yet.

  Called at import for absl.flags.FLAGS. Scripts such as tensorflow's mnist_replica.py define
  --job_name etc. themselves; those are kept as they are, provided they are defined before
  `hooks.config.flags` is imported. Calling this twice is harmless.

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


def apply_env(flag_values: flags.FlagValues = flags.FLAGS,
              env: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
  """Sets every --epochsync_* flag not given on the command line from its EPOCHSYNC_* variable
  (hooks.config.env_flags.apply_env); returns {flag name: variable name} of those it set.

  Raises:
    ConfigError: naming every variable with a bad value, the value and the rule (the flags are
      left as they were).
  """
  return env_flags.apply_env(EPOCHSYNC_FLAGS, flag_values, env)


def cluster_from_flags(flag_values: flags.FlagValues = flags.FLAGS,
                       env: Optional[Mapping[str, str]] = None) -> _cluster.ClusterConfig:
  """This task's ClusterConfig: TF_CONFIG if set, else the cluster flags; see `cluster.resolve`.

  Works with unparsed flags too (a job that does not use absl): then only TF_CONFIG and
  EPOCHSYNC_NUM_WORKERS count.

  Raises:
    ConfigError: the cluster is invalid, disagrees with --epochsync_num_workers (or
      --epochsync_max_workers), or neither
      TF_CONFIG nor parsed cluster flags exist.
  """
  env = os.environ if env is None else env
  apply_env(flag_values, env)
  num_workers, max_workers = (flag_values[f.name].value if f.name in flag_values else None
                              for f in (NUM_WORKERS, MAX_WORKERS))
  if not flag_values.is_parsed() and not (env.get("TF_CONFIG") or "").strip():
    raise ConfigError("no cluster: TF_CONFIG is not set and the flags were not parsed, so "
                      "--job_name/--ps_hosts/--worker_hosts cannot be read; export TF_CONFIG "
                      "(Kubeflow TFJob format) or parse the flags (absl app.run) before this call")
  return _cluster.resolve(env=env, flag_values=flag_values, num_workers=num_workers,
                          max_workers=max_workers)


def settings_from_flags(flag_values: flags.FlagValues = flags.FLAGS,
                        env: Optional[Mapping[str, str]] = None,
                        **explicit: Any) -> _settings.EpochSyncSettings:
  """EpochSyncSettings: `explicit` arguments > --epochsync_* flags > EPOCHSYNC_* vars > defaults.

  Works with unparsed flags too (a job that never calls absl's app.run): then the arguments, the
  variables and the defaults count. `setting_sources.sources_of()` tells each value's source.

      settings = settings_from_flags(num_epochs=3)   # 3 whatever the flag or variable says

  Raises:
    ConfigError: a variable has a bad value (named, with the value and the rule), or the values
      break a rule of EpochSyncSettings (each one's source named).
  """
  applied = apply_env(flag_values, env)
  env = os.environ if env is None else env
  values, sources = {}, {}
  for field, holder in _SETTINGS_FLAGS.items():
    flag = flag_values[holder.name]
    values[field] = flag.value
    if holder.name in applied:
      sources[field] = f"{applied[holder.name]}={env[applied[holder.name]]!r}"
    elif flag.present or not flag.using_default_value:
      sources[field] = f"--{holder.name}"
  return _sources.combine(_settings.EpochSyncSettings(**values), explicit, sources)
