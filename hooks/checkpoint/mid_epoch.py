"""Mid-epoch checkpoints that a relaunched job resumes exactly, inside the epoch.

The chief saves the model every `save_checkpoint_secs` (or `_steps`) into
`<model_dir>/mid_epoch/` (`model.ckpt-epoch0003-<global_step>`, its own `checkpoint` file, the
newest 2 kept) with every worker's position in its shard. Synchronous training saves in the
chief's aggregation thread between two aggregations, where the variables hold exactly the
epoch's steps 0..S-1: a worker with n batches has trained min(S, n). Asynchronous training
saves from the chief's after_run, with each worker's count of applied batches (counted in the
run that consumes the batch). On a restart the chief restores the newest mid-epoch checkpoint
if its epoch is not completed in the newest epoch checkpoint (`checkpoint_to_restore`), and
every worker skips what it trained (`MidEpochResume.resume_batches`). The epoch checkpoints in
`<model_dir>`, their retention and the evaluator never see a mid-epoch one.

Typical usage (hooks.epoch_sync_hooks does this):
  resume = MidEpochResume(epoch_input, num_workers, worker_id)  # every task (mid_epoch_resume)
  save = MidEpochSaveHook(epoch_input, barrier, model_dir, save_secs=600, sync_hook=sync_hook)
"""

import json
import os
import re
import time
import weakref
from typing import Any, Callable, Dict, Optional

import tensorflow as tf

from hooks.epoch import audit as audit_lib
from hooks import graph_keys
from hooks.faults import heartbeat
from hooks.faults import step_retry
from hooks import log as logging
from hooks.data.epoch_input import EpochInput
from hooks.errors import ConfigError
from hooks.faults.waiting import run_options

__all__ = ["MidEpochSaveHook", "checkpoint_to_restore", "MID_EPOCH_DIR"]

_v1 = tf.compat.v1
MID_EPOCH_DIR = "mid_epoch"
RESUMES_FILENAME = "resumes.jsonl"  # In MID_EPOCH_DIR: one line per resume from a checkpoint.
MAX_TO_KEEP = 2
# position: [epoch, synchronous steps aggregated in it (-1: asynchronous, see `applied`),
# worker count, the attempt that started the epoch, the attempt that saved]
EPOCH, STEPS, WORKERS, FIRST_ATTEMPT, ATTEMPT = range(5)
EPOCH_SHIFT = graph_keys.EPOCH_SHIFT  # applied[i] = epoch * EPOCH_SHIFT + its batches then
POSITION_NAME, APPLIED_NAME = "epochsync/mid_epoch/position", "epochsync/mid_epoch/applied"
_TIMEOUT_SECS = 60.0
_NAME = re.compile(r"-epoch(\d+)-\d+$")
_states: "weakref.WeakKeyDictionary[tf.Graph, Dict[str, tf.Variable]]" = (
    weakref.WeakKeyDictionary())


def mid_epoch_dir(model_dir: str) -> str:
  return os.path.join(model_dir, MID_EPOCH_DIR)


def checkpoint_to_restore(model_dir: Optional[str], log: bool = True) -> Optional[str]:
  """The newest mid-epoch checkpoint if its epoch is after the newest epoch checkpoint's, else None.

  None means: restore `<model_dir>`'s newest (epoch) checkpoint as usual. A stale mid-epoch
  checkpoint (of an epoch an epoch checkpoint completed) is never restored; INFO says so
  (with `log`: a caller that only checks passes log=False).
  """
  mid = model_dir and tf.train.latest_checkpoint(mid_epoch_dir(model_dir))
  match = mid and _NAME.search(mid)
  if not match:
    return None
  newest = tf.train.latest_checkpoint(model_dir)
  completed = 0
  if newest:
    names = dict(tf.train.list_variables(newest))
    completed = (int(tf.train.load_variable(newest, "epochsync/completed_epochs"))
                 if "epochsync/completed_epochs" in names else 1 << 62)  # stock: unknown
  if int(match.group(1)) < completed:
    if log:
      logging.info("ignoring the mid-epoch checkpoint %s: %s completed its epoch", mid, newest)
    return None
  if log:
    logging.info("restoring the mid-epoch checkpoint %s (newer than %s)", mid, newest)
  return mid


def state(num_workers: int, ps_device: str) -> Dict[str, tf.Variable]:
  """The saved position variables of this graph (built once, on `ps_device`)."""
  graph = _v1.get_default_graph()
  if graph not in _states:
    with _v1.device(ps_device), tf.name_scope("epochsync_mid_epoch"):
      spec = {"position": ([5], [-1, 0, 0, 0, 0]), "shard_batches": ([num_workers], -1),
              "applied": ([num_workers], 0)}
      _states[graph] = {name: _v1.get_variable(
          f"epochsync/mid_epoch/{name}", shape, tf.int64, _v1.constant_initializer(init),
          trainable=False, use_resource=False) for name, (shape, init) in spec.items()}
    for var in _states[graph].values():
      _v1.add_to_collection(graph_keys.STATE_VARIABLES, var)
  return _states[graph]


class MidEpochSaveHook(_v1.train.SessionRunHook):
  """The chief: saves a mid-epoch checkpoint every `save_secs` seconds or `save_steps` steps.

    save = MidEpochSaveHook(epoch_input, barrier, model_dir, save_secs=600,
                            sync_hook=opt_hook)   # sync_hook=None: asynchronous training

  Args:
    epoch_input: the chief's `EpochInput`.
    barrier: the chief's `EpochBarrierHook` (its audit line gets the attempts of a resumed
      epoch and what each worker skipped).
    checkpoint_dir: `str`, the model_dir; saves go to `<checkpoint_dir>/mid_epoch/`.
    save_secs / save_steps: the period; exactly one > 0.
    sync_hook: the chief's `SafeSyncTokensHook`: save between two aggregations. None: save
      from after_run (asynchronous training).
    saver: a `Saver` whose SaverDef is used (max_to_keep 2); default: the Scaffold's.
    positions: (elastic synchronous) per worker, epoch * EPOCH_SHIFT + its batches in the model
      (the work queue's `accepted`): saved as each worker's own position, as asynchronous
      training's applied counts, since an elastic job's workers are not in lockstep.

  Raises:
    ConfigError: not the chief's barrier, no checkpoint_dir, or not exactly one period > 0.
  """

  def __init__(self, epoch_input: EpochInput, barrier: Any, checkpoint_dir: str,
               save_secs: float = 600.0, save_steps: int = 0, sync_hook: Any = None,
               saver: Optional[_v1.train.Saver] = None, checkpoint_basename: str = "model.ckpt",
               ps_device: str = "/job:ps/task:0", clock: Callable[[], float] = time.monotonic,
               positions: Optional[tf.Variable] = None):
    if not checkpoint_dir or not barrier.is_chief or (save_secs > 0) == (save_steps > 0):
      raise ConfigError(
          f"MidEpochSaveHook needs the chief's barrier, a checkpoint_dir and exactly one of "
          f"save_secs={save_secs!r} and save_steps={save_steps!r} > 0 (the other 0)")
    self._input, self._barrier, self._dir = epoch_input, barrier, checkpoint_dir
    self._secs, self._steps_period, self._clock = float(save_secs), int(save_steps), clock
    self._sync, self._base_saver, self._basename = sync_hook is not None, saver, checkpoint_basename
    self._saver: Optional[_v1.train.Saver] = None
    self._ps, self._ready, self._positions = ps_device, False, positions
    self.saved: list = []
    if sync_hook is not None:
      sync_hook.on_aggregated(self._after_aggregation)
    barrier.add_chief_action(self._audit_fields)

  def begin(self):
    variables = state(self._barrier.num_workers, self._ps)
    self._graph = _v1.get_default_graph()  # The aggregation thread saves outside of it.
    self._global_step = _v1.train.get_global_step()
    with tf.name_scope("epochsync_mid_epoch/save"):
      self._position = _v1.placeholder(tf.int64, [5], "position")
      writes = [variables["position"].assign(self._position)]
      if self._positions is not None:  # Each worker's own: in the same run as the step's.
        n = self._barrier.num_workers
        writes.append(variables["applied"].assign(self._positions.read_value()[:n]))
      with tf.control_dependencies(writes):
        self._set_position = tf.cast(self._global_step, tf.int64) + 0
      completed = [v for v in _v1.global_variables()
                   if v.op.name == "epochsync/completed_epochs"]  # The barrier's.
      self._read = (completed[0].read_value() if completed else tf.constant(0, tf.int64),
                    variables["position"].read_value(), variables["applied"].read_value(),
                    tf.cast(self._global_step, tf.int64) + 0)

  def after_create_session(self, session, coord):
    completed, position, applied, step = session.run(self._read,
                                                     options=run_options(_TIMEOUT_SECS))
    self._epoch, position = int(completed), [int(v) for v in position]
    self._warn_if_not_resumed(position)
    attempt = 1 + max((int(l.get("attempt", 1)) for l in audit_lib.read_audit(self._dir)),
                      default=0)
    self._attempt = max(attempt, position[ATTEMPT] + 1)
    resumed = position[EPOCH] == self._epoch
    self._first_attempt = position[FIRST_ATTEMPT] if resumed else self._attempt
    self._epoch_steps = max(position[STEPS], 0) if resumed else 0
    self._resumed_epoch = self._epoch if resumed else None
    if resumed:  # One line per resume: the epoch's audit line lists them all.
      tf.io.gfile.makedirs(mid_epoch_dir(self._dir))
      with open(os.path.join(mid_epoch_dir(self._dir), RESUMES_FILENAME), "a") as f:
        f.write(json.dumps({
            "epoch": self._epoch, "attempt": self._attempt, "global_step": int(step),
            "epoch_step": position[STEPS], "applied": [
                graph_keys.batches_in_epoch(int(a), self._epoch)
                for a in applied]}) + "\n")
    self._since, self._last, self._last_step = 0, self._clock(), int(step)
    self._ready = True

  def _warn_if_not_resumed(self, position) -> None:
    """A newer mid-epoch checkpoint that the session does not hold: say what is re-trained."""
    newer = checkpoint_to_restore(self._dir, log=False)
    if not newer:
      return
    saved = [int(v) for v in tf.train.load_variable(newer, POSITION_NAME)]
    if saved == position:
      return
    logging.warning(
        "the session restored %s, not the newer mid-epoch checkpoint %s: epoch %d is trained "
        "again from its start (the %s that checkpoint holds are lost and trained again); to "
        "resume exactly, put hooks.MidEpochRestoreHook(model_dir, num_workers) before the "
        "RunStartHook in the chief's hooks (hooks.epoch_sync_hooks does)",
        tf.train.latest_checkpoint(self._dir) or "no checkpoint", newer, saved[EPOCH],
        f"{saved[STEPS]} synchronous steps" if saved[STEPS] >= 0 else "per-worker positions")

  def _after_aggregation(self, session, grads: int) -> None:
    """Synchronous: the aggregation thread, after a run that applied a step (grads > 0)."""
    if not self._ready:
      return
    if grads == 0:  # Every worker is done with the epoch.
      self._epoch, self._epoch_steps = self._epoch + 1, 0
      return
    self._epoch_steps += 1
    # Elastic: -1, each worker's own position (`positions`), as asynchronous training's.
    steps = -1 if self._positions is not None else self._epoch_steps
    self._maybe_save(session, self._epoch, steps, 1)

  def before_run(self, run_context):
    return None if self._sync else _v1.train.SessionRunArgs(self._global_step)

  def after_run(self, run_context, run_values):
    if not self._sync and run_values.results is not None:  # Asynchronous: global steps.
      step, new = int(run_values.results), int(run_values.results) - self._last_step
      self._last_step = step
      self._maybe_save(run_context.session, self._input.hook.epoch, -1, max(new, 1))

  def _maybe_save(self, session, epoch: int, epoch_steps: int, new_steps: int) -> None:
    self._since += new_steps
    if self._steps_period and self._since < self._steps_period:
      return
    if self._secs and self._clock() - self._last < self._secs:
      return
    start = time.monotonic()
    position = [epoch, epoch_steps, self._barrier.num_workers, self._first_attempt
                if epoch == self._resumed_epoch else self._attempt, self._attempt]
    # Both runs set what they set again when run twice: run again if TensorFlow rejected them.
    task = self._barrier.task_name
    step = int(step_retry.run_rerunnable(lambda: session.run(
        self._set_position, {self._position: position}, options=run_options(_TIMEOUT_SECS)),
                                         "the mid-epoch position's write", task))
    # A new thread is eager (TF2 behaviour); Saver needs graph. busy: the steps waiting for
    # this save (synchronous: the chief saves between two aggregations) see progress.
    with self._graph.as_default(), heartbeat.busy("saving"):
      path = step_retry.run_rerunnable(lambda: self._get_saver().save(
          session, os.path.join(mid_epoch_dir(self._dir), f"{self._basename}-epoch{epoch:04d}"),
          global_step=step, write_meta_graph=False), "the mid-epoch checkpoint save", task)
    logging.info("chief saved a mid-epoch checkpoint of epoch %d (%s, global_step %d) to %s in "
                 "%.2f s", epoch, f"{epoch_steps} synchronous steps" if epoch_steps >= 0 else
                 "each worker's own position", step, path, time.monotonic() - start)
    self.saved.append(path)
    self._since, self._last = 0, self._clock()

  def _get_saver(self) -> _v1.train.Saver:
    """A Saver of the Scaffold's save ops with its own retention (no new ops: graph final)."""
    if self._saver is None:
      base = self._base_saver or self._graph.get_collection(_v1.GraphKeys.SAVERS)[0]
      saver_def = type(base.saver_def)()
      saver_def.CopyFrom(base.saver_def)
      saver_def.max_to_keep, saver_def.keep_checkpoint_every_n_hours = MAX_TO_KEEP, 10000.0
      tf.io.gfile.makedirs(mid_epoch_dir(self._dir))
      self._saver = _v1.train.Saver(saver_def=saver_def)
      earlier = tf.train.get_checkpoint_state(mid_epoch_dir(self._dir))
      if earlier:  # An earlier attempt's: kept within max_to_keep as well.
        self._saver.recover_last_checkpoints(list(earlier.all_model_checkpoint_paths))
    return self._saver

  def _audit_fields(self, session, epoch: int, arrivals) -> Dict[str, object]:
    """The audit line's attempts; for a resumed epoch, the step and batches it resumed from."""
    fields: Dict[str, object] = {"attempt": self._attempt}
    if epoch != self._resumed_epoch:
      return fields
    names = self._barrier.worker_names
    with open(os.path.join(mid_epoch_dir(self._dir), RESUMES_FILENAME)) as f:
      resumes = [r for r in map(json.loads, f) if r["epoch"] == epoch]
    for r in resumes:  # What each worker skipped: min(S, its shard), or its own count.
      s, applied = r["epoch_step"], r.pop("applied")
      r["skipped_batches"] = {name: min(s, arrivals[name].batches) if s >= 0 else applied[i]
                              for i, name in enumerate(names) if name in arrivals}
    fields["attempts"] = list(range(self._first_attempt, self._attempt + 1))
    fields["resumed_from"] = resumes
    return fields
