"""EpochSyncRunConfig: a tf.estimator.RunConfig that also carries the epoch-sync settings.

Typical usage:
  config = estimator_ext.EpochSyncRunConfig(model_dir="/shared/run1", num_epochs=3)
  estimator = tf.compat.v1.estimator.Estimator(model_fn, config=config)
  estimator_ext.train_and_evaluate(estimator, train_spec, eval_spec)
"""

import math
from typing import Any, Dict, Optional, Tuple

import tensorflow as tf

from estimator_ext import run_config_args
from estimator_ext.early_stopping import EarlyStopping
from hooks import log as logging
from hooks.config import setting_sources
from hooks.errors import raise_if_problems
from hooks.config.settings import EpochSyncSettings

__all__ = ["EpochSyncRunConfig"]

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
      step_timeout_secs, warn_after_secs, log_every_secs, elastic, spare_workers,
      optional_workers: override `EpochSyncSettings` fields (elastic: a lost worker does not
      stop the job; training through `work_units`, docs/elastic.md; spare_workers: the last
      this many worker tasks stand by and join in place of lost ones; optional_workers: the
      last this many may come up after the start and join the running job then).
    settings: `EpochSyncSettings` to use instead of the flags and variables (the arguments
      above still override its fields).
    num_workers: `int` expected chief+worker tasks (or --epochsync_num_workers, or
      EPOCHSYNC_NUM_WORKERS); checked against TF_CONFIG; with `max_workers`, the launch's.
    max_workers: `int` (elastic) the most chief+worker tasks the job may grow to (or
      --epochsync_max_workers, or EPOCHSYNC_MAX_WORKERS): workers beyond the launch's
      `num_workers` join the running job (docs/elastic.md).
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
               log_every_secs: Optional[float] = None, elastic: Optional[bool] = None,
               spare_workers: Optional[int] = None, optional_workers: Optional[int] = None,
               settings: Optional[EpochSyncSettings] = None, num_workers: Optional[int] = None,
               max_workers: Optional[int] = None, in_loop_eval: Optional[bool] = None,
               early_stopping: Optional[EarlyStopping] = None,
               evaluator_timeout_secs: float = 7200.0, **run_config_kwargs):
    problems = run_config_args.rejected_args(run_config_kwargs)
    run_config_kwargs = dict(run_config_kwargs)
    explicit = dict(num_epochs=num_epochs, sync=sync,
                    divide_by_initial_workers=divide_by_initial_workers,
                    barrier_timeout_secs=barrier_timeout_secs,
                    startup_timeout_secs=startup_timeout_secs,
                    step_timeout_secs=step_timeout_secs, warn_after_secs=warn_after_secs,
                    log_every_secs=log_every_secs, elastic=elastic,
                    spare_workers=spare_workers, optional_workers=optional_workers)
    resolved, flag_counts = run_config_args.resolved_settings(settings, explicit, problems)
    resolved = run_config_args.save_period(resolved, run_config_kwargs, problems)
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
    cluster, task_name, tf_config_model_dir = run_config_args.training_cluster(problems)
    cluster = run_config_args.counted_cluster(
        cluster, task_name, num_workers if num_workers is not None else flag_counts[0],
        max_workers if max_workers is not None else flag_counts[1], problems)
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
    problems = run_config_args.rejected_args(kwargs)
    kwargs = dict(kwargs)
    settings = run_config_args.save_period(self._epochsync_settings, kwargs, problems)
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
    return self._epochsync_cluster.worker_names if self._epochsync_cluster else (run_config_args.LOCAL_TASK,)

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
