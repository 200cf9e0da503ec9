"""EpochSyncRunConfig's arguments: what it refuses, the settings it resolves, the cluster it sees.

The run config takes tf.estimator.RunConfig's arguments and the epoch-sync settings; these
functions check the first (no distribution strategy, the save period as settings), resolve the
second (argument > flag > EPOCHSYNC_* > default, hooks.config.setting_sources) and read the
training cluster from TF_CONFIG (an evaluator sees the training tasks).

Typical usage (inside EpochSyncRunConfig.__init__):
  problems = rejected_args(kwargs)
  cluster, task_name, has_model_dir = training_cluster(problems)
"""

import dataclasses
import json
import math
import os
from typing import Any, Dict, List, Mapping, Optional, Tuple

from absl import flags as absl_flags

from hooks.config import setting_sources
from hooks.config.cluster import ClusterConfig
from hooks.config.settings import EpochSyncSettings
from hooks.errors import ConfigError

__all__ = ["LOCAL_TASK", "rejected_args", "save_period", "resolved_settings", "counted_cluster",
           "training_cluster"]

_SETTINGS_FIELDS = tuple(f.name for f in dataclasses.fields(EpochSyncSettings))
LOCAL_TASK = "worker:0"  # What RunConfig calls the one task of local mode.
_STRATEGIES = ("train_distribute", "eval_distribute", "experimental_distribute")
_SAVE_KEYS = ("save_checkpoints_secs", "save_checkpoints_steps")


def rejected_args(kwargs: Mapping[str, Any]) -> List[str]:
  """RunConfig arguments that epoch-synchronized training sets itself, each with why and the fix."""
  problems = []
  if kwargs.get("experimental_max_worker_delay_secs") not in (None, 0):
    problems.append(
        f"experimental_max_worker_delay_secs={kwargs['experimental_max_worker_delay_secs']!r}: "
        "workers are never staggered (every epoch starts on all of them at the barrier's "
        "release); remove it")
  if "session_creation_timeout_secs" in kwargs:
    problems.append(
        f"session_creation_timeout_secs={kwargs['session_creation_timeout_secs']!r} is set from "
        "the start-up timeout: pass startup_timeout_secs= (or --epochsync_startup_timeout_secs) "
        "instead")
  for key in _STRATEGIES:
    if kwargs.get(key) is not None:
      problems.append(f"{key}: distribution strategies are not supported; tf-epochsync drives "
                      f"between-graph parameter-server training itself: remove {key}")
  return problems


def save_period(settings: EpochSyncSettings, kwargs: Dict[str, Any],
                 problems: List[str]) -> EpochSyncSettings:
  """`settings` with RunConfig's save_checkpoints_secs/_steps (popped from `kwargs`), if given.

  RunConfig's meaning: neither given keeps `settings`' period (the flags', or every 600 s);
  one given sets it and turns the other off; None (both None) means no mid-epoch checkpoint.
  The values go to `save_checkpoint_secs/_steps` of the settings, never to RunConfig, whose own
  stay None: stock's CheckpointSaverHook would save while the workers train (hooks.checkpoint.mid_epoch
  saves where the model is consistent).
  """
  given = {key: kwargs.pop(key) for key in _SAVE_KEYS if key in kwargs}
  if not given:
    return settings
  secs, steps = given.get("save_checkpoints_secs"), given.get("save_checkpoints_steps")
  if secs is not None and steps is not None:
    problems.append(f"save_checkpoints_secs={secs!r} and save_checkpoints_steps={steps!r}: "
                    "`save_checkpoints_steps` and `save_checkpoints_secs` cannot be both set "
                    "(as in RunConfig); keep one")
    return settings
  bad = [f"{key}={value!r} should be >= 0 (None or 0: no mid-epoch checkpoint)"
         for key, value, number in (("save_checkpoints_secs", secs, (int, float)),
                                    ("save_checkpoints_steps", steps, int))
         if value is not None and (isinstance(value, bool) or not isinstance(value, number) or
                                   not math.isfinite(value) or value < 0)]
  if bad:
    problems.extend(bad)
    return settings
  try:
    return setting_sources.combine(
        settings, dict(save_checkpoint_secs=secs or 0, save_checkpoint_steps=steps or 0),
        setting_sources.sources_of(settings))
  except ConfigError as e:
    problems.append(str(e))
    return settings


def resolved_settings(settings: Optional[EpochSyncSettings], explicit: Dict[str, Any],
                       problems: List[str]
                       ) -> Tuple[EpochSyncSettings, Tuple[Optional[int], Optional[int]]]:
  """(settings, (num_workers, max_workers)): arguments > parsed --epochsync_* flags >
  EPOCHSYNC_* > defaults.

  An EpochSyncSettings passed as `settings` counts as arguments for all its fields. The flags
  are defined here (hooks.config.flags imported) if the job did not: their parsers read the
  variables.
  """
  from hooks.config import flags as epochsync_flags  # pylint: disable=g-import-not-at-top
  try:
    if settings is not None:
      given = {f: getattr(settings, f) for f in _SETTINGS_FIELDS}
      resolved = setting_sources.combine(settings, {**given, **{
          k: v for k, v in explicit.items() if v is not None}})
    else:
      resolved = epochsync_flags.settings_from_flags(**explicit)
    epochsync_flags.apply_env()  # EPOCHSYNC_NUM_WORKERS, if no flag says otherwise.
  except ConfigError as e:
    problems.append(str(e))
    return settings or EpochSyncSettings(), (None, None)
  return resolved, tuple(absl_flags.FLAGS[f.name].value
                         for f in (epochsync_flags.NUM_WORKERS, epochsync_flags.MAX_WORKERS))


def counted_cluster(cluster: Optional[ClusterConfig], task_name: Optional[str],
                    num_workers: Optional[int], max_workers: Optional[int],
                    problems: List[str]) -> Optional[ClusterConfig]:
  """`cluster` checked against `num_workers`, or (a job that may grow) with the launch's
  `num_workers` and `max_workers` slots (hooks.config.cluster.ClusterConfig)."""
  if max_workers and cluster is not None:
    try:
      return dataclasses.replace(cluster, launch_workers=num_workers or 0,
                                 max_workers=max_workers)
    except ConfigError as e:
      problems.append(str(e))
      return None
  if num_workers is not None and task_name is not None:
    have = cluster.num_workers if cluster else 1
    if num_workers != have:
      where = (f"TF_CONFIG lists {have} chief+worker tasks ({', '.join(cluster.worker_names)})"
               if cluster else "there is no TF_CONFIG cluster (local mode: 1 task)")
      problems.append(f"num_workers={num_workers!r} but {where}; set num_workers={have} "
                      "(EpochSyncRunConfig or --epochsync_num_workers) or fix TF_CONFIG")
  return cluster


def training_cluster(problems: List[str]) -> Tuple[Optional[ClusterConfig], Optional[str], bool]:
  """(training cluster as this task sees it, this task's name, model_dir in TF_CONFIG).

  None for the cluster in local mode (no TF_CONFIG cluster). The evaluator is not part of the
  training cluster (as in Estimator), so for it the cluster is read as the chief sees it.
  """
  raw = os.environ.get("TF_CONFIG", "")
  if not raw.strip():
    return None, LOCAL_TASK, False
  try:
    tf_config = json.loads(raw)
  except json.JSONDecodeError:
    tf_config = None
  if not isinstance(tf_config, Mapping):  # Let ClusterConfig word the problem.
    try:
      ClusterConfig.from_tf_config(raw)
    except ConfigError as e:
      problems.append(str(e))
    return None, None, False
  has_model_dir = bool(tf_config.get("model_dir"))
  cluster, task = tf_config.get("cluster"), tf_config.get("task")
  if not cluster:
    return None, LOCAL_TASK, has_model_dir
  if isinstance(cluster, Mapping):
    if "master" in cluster:
      problems.append('TF_CONFIG["cluster"] has a "master" job: name it "chief" (one chief task, '
                      'the others under "worker")')
      return None, None, has_model_dir
    if not cluster.get("chief"):
      problems.append('TF_CONFIG["cluster"] has no "chief" job; Estimator needs exactly one: add '
                      '"chief": ["host:port"] (e.g. move worker:0 there)')
      return None, None, has_model_dir
  view: Any = raw
  name = None
  if isinstance(task, Mapping) and task.get("type") == "evaluator" and isinstance(
      cluster, Mapping) and "evaluator" not in cluster:
    if task.get("index") != 0:
      problems.append(f'TF_CONFIG["task"]["index"]={task.get("index")!r}: there is at most one '
                      "evaluator; give it index 0")
    view, name = {"cluster": cluster, "task": {"type": "chief", "index": 0}}, "evaluator:0"
  try:
    config = ClusterConfig.from_tf_config(view)
  except ConfigError as e:
    problems.append(str(e))
    return None, None, has_model_dir
  return config, name or config.task_name, has_model_dir
