"""EpochSyncRunConfig: a tf.estimator.RunConfig that also carries the epoch-sync settings.

Typical usage:
  config = estimator_ext.EpochSyncRunConfig(model_dir="/shared/run1", num_epochs=3)
  estimator = tf.compat.v1.estimator.Estimator(model_fn, config=config)
  estimator_ext.train_and_evaluate(estimator, train_spec, eval_spec)
"""

import dataclasses
import json
import math
import os
from typing import Any, Dict, List, Mapping, Optional, Tuple

from absl import flags as absl_flags
import tensorflow as tf

from estimator_ext.early_stopping import EarlyStopping
from hooks import log as logging
from hooks.config import setting_sources
from hooks.config.cluster import ClusterConfig
from hooks.errors import ConfigError, raise_if_problems
from hooks.config.settings import EpochSyncSettings

__all__ = ["EpochSyncRunConfig"]

_SETTINGS_FIELDS = tuple(f.name for f in dataclasses.fields(EpochSyncSettings))
_LOCAL_TASK = "worker:0"  # What RunConfig calls the one task of local mode.
_STRATEGIES = ("train_distribute", "eval_distribute", "experimental_distribute")
_SAVE_KEYS = ("save_checkpoints_secs", "save_checkpoints_steps")


def _rejected_args(kwargs: Mapping[str, Any]) -> List[str]:
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


def _save_period(settings: EpochSyncSettings, kwargs: Dict[str, Any],
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


def _resolved_settings(settings: Optional[EpochSyncSettings], explicit: Dict[str, Any],
                       problems: List[str]) -> Tuple[EpochSyncSettings, Optional[int]]:
  """(settings, num_workers): arguments > parsed --epochsync_* flags > EPOCHSYNC_* > defaults.

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
    return settings or EpochSyncSettings(), None
  return resolved, absl_flags.FLAGS[epochsync_flags.NUM_WORKERS.name].value


def _training_cluster(problems: List[str]) -> Tuple[Optional[ClusterConfig], Optional[str], bool]:
  """(training cluster as this task sees it, this task's name, model_dir in TF_CONFIG).

  None for the cluster in local mode (no TF_CONFIG cluster). The evaluator is not part of the
  training cluster (as in Estimator), so for it the cluster is read as the chief sees it.
  """
  raw = os.environ.get("TF_CONFIG", "")
  if not raw.strip():
    return None, _LOCAL_TASK, False
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
    return None, _LOCAL_TASK, has_model_dir
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


class EpochSyncRunConfig(tf.estimator.RunConfig):
  """A RunConfig for `estimator_ext.train_and_evaluate`: RunConfig's arguments plus epoch sync.

  Each epoch-sync setting comes from, in this order: its argument here (or `settings`), its
  --epochsync_* flag if given, its EPOCHSYNC_* variable, its default; with or without absl flag
  parsing. It turns off what epoch-synchronized training must not have: stock's
  CheckpointSaverHook, which would save while workers train (the chief saves one checkpoint per
  epoch after the barrier, and mid-epoch ones every `save_checkpoints_secs`, 600 s by default,
  where the model holds whole steps), staggered worker starts and TensorFlow's 30 s worker
  start-up poll.
  TF_CONFIG needs a "chief" job (the chief is `chief:0`, worker id 0; `worker:i` is worker id
  i+1); without a cluster in TF_CONFIG, training runs in this one process (local mode).

      config = EpochSyncRunConfig(model_dir="/shared/run1", num_epochs=3)
      config = EpochSyncRunConfig(model_dir=d, num_epochs=20, early_stopping=EarlyStopping())
      est = tf.compat.v1.estimator.Estimator(model_fn, config=config)
      estimator_ext.train_and_evaluate(est, train_spec, eval_spec)

  Args:
    model_dir: `str` checkpoints, the epoch audit and eval results; storage every task sees.
    num_epochs, sync, divide_by_initial_workers, barrier_timeout_secs, startup_timeout_secs,
      step_timeout_secs, warn_after_secs, log_every_secs: override `EpochSyncSettings` fields.
    settings: `EpochSyncSettings` to use instead of the flags and variables (the arguments
      above still override its fields).
    num_workers: `int` expected chief+worker tasks (or --epochsync_num_workers, or
      EPOCHSYNC_NUM_WORKERS); checked against
      TF_CONFIG.
    in_loop_eval: `bool` the chief evaluates each epoch's checkpoint between its save and the
      release of the workers (always on in local mode; default: on iff `early_stopping`).
    early_stopping: `EarlyStopping` rule (needs in-loop evaluation).
    evaluator_timeout_secs: `float` longest wait of the evaluator task for the next epoch's
      checkpoint while no training task makes progress (an epoch may last longer).
    **run_config_kwargs: any other `tf.estimator.RunConfig` argument; `save_checkpoints_secs`/
      `_steps` set the mid-epoch checkpoints' period (neither given: the settings', 600 s;
      `save_checkpoints_secs=None` or 0: none).

  Raises:
    ConfigError: listing every problem at once (both save_checkpoints_* or a negative one, a
      worker delay, strategies, invalid settings or EPOCHSYNC_* variables (named with their
      value), a TF_CONFIG without chief, a worker count that disagrees with TF_CONFIG).
  """

  def __init__(self, model_dir: Optional[str] = None, *, num_epochs: Optional[int] = None,
               sync: Optional[bool] = None, divide_by_initial_workers: Optional[bool] = None,
               barrier_timeout_secs: Optional[float] = None,
               startup_timeout_secs: Optional[float] = None,
               step_timeout_secs: Optional[float] = None, warn_after_secs: Optional[float] = None,
               log_every_secs: Optional[float] = None,
               settings: Optional[EpochSyncSettings] = None, num_workers: Optional[int] = None,
               in_loop_eval: Optional[bool] = None,
               early_stopping: Optional[EarlyStopping] = None,
               evaluator_timeout_secs: float = 7200.0, **run_config_kwargs):
    problems = _rejected_args(run_config_kwargs)
    run_config_kwargs = dict(run_config_kwargs)
    explicit = dict(num_epochs=num_epochs, sync=sync,
                    divide_by_initial_workers=divide_by_initial_workers,
                    barrier_timeout_secs=barrier_timeout_secs,
                    startup_timeout_secs=startup_timeout_secs,
                    step_timeout_secs=step_timeout_secs, warn_after_secs=warn_after_secs,
                    log_every_secs=log_every_secs)
    resolved, flag_num_workers = _resolved_settings(settings, explicit, problems)
    resolved = _save_period(resolved, run_config_kwargs, problems)
    if early_stopping is not None and not isinstance(early_stopping, EarlyStopping):
      problems.append(f"early_stopping={early_stopping!r} must be an "
                      "estimator_ext.EarlyStopping(metric=..., patience=...)")
    if in_loop_eval is not None and not isinstance(in_loop_eval, bool):
      problems.append(f"in_loop_eval={in_loop_eval!r} must be True or False")
    if early_stopping is not None and in_loop_eval is False:
      problems.append("early_stopping needs in-loop evaluation (the chief decides between the "
                      "save and the release of an epoch): drop in_loop_eval=False")
    if (not isinstance(evaluator_timeout_secs, (int, float)) or
        isinstance(evaluator_timeout_secs, bool) or not math.isfinite(evaluator_timeout_secs) or
        evaluator_timeout_secs <= 0):
      problems.append(f"evaluator_timeout_secs={evaluator_timeout_secs!r} must be a finite "
                      "number of seconds > 0")
    cluster, task_name, tf_config_model_dir = _training_cluster(problems)
    num_workers = num_workers if num_workers is not None else flag_num_workers
    if num_workers is not None and task_name is not None:
      have = cluster.num_workers if cluster else 1
      if num_workers != have:
        where = (f"TF_CONFIG lists {have} chief+worker tasks ({', '.join(cluster.worker_names)})"
                 if cluster else "there is no TF_CONFIG cluster (local mode: 1 task)")
        problems.append(f"num_workers={num_workers!r} but {where}; set num_workers={have} "
                        "(EpochSyncRunConfig or --epochsync_num_workers) or fix TF_CONFIG")
    raise_if_problems(problems, "EpochSyncRunConfig")
    super().__init__(model_dir=model_dir, save_checkpoints_steps=None,
                     save_checkpoints_secs=None, experimental_max_worker_delay_secs=0,
                     session_creation_timeout_secs=resolved.startup_timeout_secs,
                     **run_config_kwargs)
    self._epochsync_settings = resolved
    self._epochsync_cluster = cluster
    self._epochsync_task_name = task_name
    self._epochsync_model_dir_given = model_dir is not None or tf_config_model_dir
    self._epochsync_early_stopping = early_stopping
    self._epochsync_in_loop_eval = (cluster is None or bool(in_loop_eval) or
                                    early_stopping is not None)
    self._epochsync_evaluator_timeout_secs = float(evaluator_timeout_secs)
    logging.info("tf-epochsync run config: %s; %s", self.describe(), resolved)
    if self.worker_id == 0:  # The chief (or local mode's one task) says where each came from.
      setting_sources.log_sources_once(resolved, task_name)

  def replace(self, **kwargs) -> "EpochSyncRunConfig":
    """RunConfig.replace(), except for the arguments this config sets itself.

    `save_checkpoints_secs`/`_steps` set the mid-epoch checkpoints' period (as in __init__).

    Raises:
      ConfigError: for both save_checkpoints_* or a negative one, a worker delay,
        session_creation_timeout_secs or a distribution strategy.
    """
    problems = _rejected_args(kwargs)
    kwargs = dict(kwargs)
    settings = _save_period(self._epochsync_settings, kwargs, problems)
    raise_if_problems(problems, "EpochSyncRunConfig.replace()")
    config = super().replace(**kwargs)
    config._epochsync_settings = settings  # pylint: disable=protected-access
    return config

  def describe(self) -> str:
    """One line, e.g. "worker:1 of cluster {chief: 1, worker: 2, ps: 2} from TF_CONFIG"."""
    if self._epochsync_cluster is None:
      return f"{self._epochsync_task_name} (local mode: no TF_CONFIG cluster)"
    if self._epochsync_task_name == "evaluator:0":
      return "evaluator:0 of " + self._epochsync_cluster.describe().split(" of ", 1)[1]
    return self._epochsync_cluster.describe()

  settings = property(lambda self: self._epochsync_settings,
                      doc="The resolved `EpochSyncSettings` (num_epochs, sync, timeouts).")
  epochsync_cluster = property(
      lambda self: self._epochsync_cluster,
      doc="The training cluster (`hooks.config.cluster.ClusterConfig`) as this task sees it (the "
          "evaluator: as the chief sees it); None in local mode.")
  is_local = property(lambda self: self._epochsync_cluster is None,
                      doc="True without a TF_CONFIG cluster: one process trains and evaluates.")
  task_name = property(lambda self: self._epochsync_task_name,
                       doc='This task: "chief:0", "worker:1", "ps:0", "evaluator:0", or '
                           '"worker:0" in local mode.')
  early_stopping = property(lambda self: self._epochsync_early_stopping,
                            doc="The `EarlyStopping` rule, or None.")
  in_loop_eval = property(lambda self: self._epochsync_in_loop_eval,
                          doc="True if the chief evaluates every epoch before releasing it.")
  evaluator_timeout_secs = property(lambda self: self._epochsync_evaluator_timeout_secs,
                                    doc="Longest wait of the evaluator for one epoch.")

  @property
  def num_workers(self) -> int:
    """Training tasks (chief + workers); 1 in local mode."""
    return self._epochsync_cluster.num_workers if self._epochsync_cluster else 1

  @property
  def worker_names(self) -> Tuple[str, ...]:
    """("chief:0", "worker:0", ...) by worker id; ("worker:0",) in local mode."""
    return self._epochsync_cluster.worker_names if self._epochsync_cluster else (_LOCAL_TASK,)

  @property
  def worker_id(self) -> Optional[int]:
    """This training task's shard index in [0, num_workers) (chief 0); None on ps/evaluator."""
    names = self.worker_names
    return names.index(self._epochsync_task_name) if self._epochsync_task_name in names else None

  def run_record(self) -> Dict[str, Any]:
    """The settings every task must agree on, as the chief writes them for the evaluator."""
    s = self._epochsync_settings
    return {"num_epochs": s.num_epochs, "sync": s.sync,
            "divide_by_initial_workers": s.divide_by_initial_workers,
            "worker_names": list(self.worker_names),
            "early_stopping": (self._epochsync_early_stopping.to_dict()
                               if self._epochsync_early_stopping else None)}
