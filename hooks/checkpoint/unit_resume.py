"""The chief's resume of a work queue from a mid-epoch checkpoint, before any worker claims.

A mid-epoch checkpoint holds the queue as it was at the save; the model holds a part of each
unit in flight then (hooks.workqueue.resume_plan). Right after the session restored it, before
the run starts (RunStartHook: no worker claims before that), the chief rewrites the queue: the
units the model holds whole stay done, those it holds in part are handed out again after the
batches it holds, the others from their start. The positions come from the checkpoint file
itself (the saved step S, or each worker's applied batches), so a job resumes the checkpoint
with another number of workers too. Units that changed since the save (their fingerprint) are
refused before any step. A unit the model holds whole whose end was not recorded yet (the save
came between its last step and its owner's next claim) is done, where tf.data knows its batch
count without reading it (a record range); else it is handed out again, its reader skipping
every batch of it.

The epoch's audit line then counts every attempt: each worker's batches and examples are those
of this attempt plus what it trained before the resumes (the units done then, and its parts of
the units in flight: `unit_parts`, whose examples the chief counts at the resume), and a worker
of an earlier attempt that this one lacks (a relaunch with fewer workers) is listed too.

Typical usage (hooks.session.wiring puts it on the chief, after the MidEpochRestoreHook):
  resume = UnitResumeHook(epoch_input, model_dir, barrier, worker_names)
  hooks = [guard, MidEpochRestoreHook(model_dir, n), resume, run_start, ...]
"""

import json
import os
from typing import Any, Dict, Sequence, Tuple

import numpy as np
import tensorflow as tf

from hooks import graph_keys
from hooks import log as logging
from hooks.checkpoint import mid_epoch
from hooks.checkpoint.mid_epoch import EPOCH, MID_EPOCH_DIR, STEPS
from hooks.errors import ConfigError
from hooks.faults.waiting import run_options, run_uncancelled
from hooks.workqueue.audit import earlier_attempts, worker_name
from hooks.workqueue.layout import fingerprint_value, units_of_size
from hooks.workqueue.resume_plan import plan_resume
from hooks.workqueue.unit_passes import work_queue_of
from hooks.workqueue.units import fingerprint

__all__ = ["UnitResumeHook"]

_v1 = tf.compat.v1
_TIMEOUT_SECS = 60.0
_STATE = "epochsync/workqueue/state"
RESUMED_UNITS = "unit_resumes.jsonl"  # In MID_EPOCH_DIR: the parts of units in flight, per resume.


class UnitResumeHook(_v1.train.SessionRunHook):
  """The chief: hands out again what a restored mid-epoch checkpoint's queue holds in part.

  Args:
    epoch_input: the chief's `EpochInput` over a work queue (`hooks.workqueue.work_queue_input`).
    checkpoint_dir: the model_dir.
    barrier: the chief's `EpochBarrierHook`: its audit line gets the units' parts trained before
      each resume of the epoch (`unit_parts`).
    worker_names: the training tasks by worker id.

  Raises:
    ConfigError: (at session start) the checkpoint was written without a work queue, or for
      other units; the message says what to do.
  """

  def __init__(self, epoch_input: Any, checkpoint_dir: str, barrier: Any,
               worker_names: Sequence[str]):
    self._input, self._queue = epoch_input, work_queue_of(epoch_input)
    self._dir, self._names = checkpoint_dir, list(worker_names)
    self.plan = None  # The ResumePlan written, if any.
    barrier.add_chief_action(self._audit_fields)

  def after_create_session(self, session, coord):
    path = mid_epoch.checkpoint_to_restore(self._dir, log=False)
    if not path:
      return
    ops = self._queue.claims.ops
    held = session.run(ops.vector, options=run_options(_TIMEOUT_SECS))
    saved, position, applied = self._read(path, len(held))
    if not np.array_equal(held, saved):
      return  # The session does not hold that checkpoint (MidEpochSaveHook says so).
    parts = ops.layout.parts(saved)
    if int(parts["epoch"]) != position[EPOCH]:
      return  # No unit of the checkpoint's epoch was handed out yet.
    self._check_units(int(parts["fingerprint"]), position[EPOCH])
    steps = position[STEPS]
    if steps >= 0:  # Synchronous: the model holds steps 0..S-1 of every worker.
      position_of = lambda owner: steps
    else:  # Asynchronous (or elastic synchronous): each owner's batches of this epoch.
      position_of = lambda owner: _applied(applied, owner, position[EPOCH])
    plan = plan_resume(saved, ops.layout, position_of, resumed_step=max(steps, 0))
    finished = self._finished(session, plan.in_flight)
    self.plan = plan_resume(saved, ops.layout, position_of, resumed_step=max(steps, 0),
                            finished=finished) if finished else plan
    self._record(session, position[EPOCH], parts)
    run_uncancelled(session, ops.assign, {ops.new_vector: self.plan.state}, _TIMEOUT_SECS)
    logging.info("the work queue resumes epoch %d from %s: %s", position[EPOCH], path,
                 self.plan.describe())

  def _finished(self, session, in_flight: Dict[int, int]) -> Dict[int, Tuple[int, int]]:
    """The units in flight whose every batch the model holds: unit -> (batches, examples)."""
    finished = {}
    for unit, held in sorted(in_flight.items()):
      if self._queue.batches_of(session, unit) == held:
        finished[unit] = (held, self._examples(session, unit, held))
    return finished

  def _examples(self, session, unit: int, batches: int) -> int:
    return self._input.count_examples(session, self._queue.feeds_of(unit), batches)

  def _record(self, session, epoch: int, saved) -> None:
    """Appends who trained which batches of the units in flight, and their examples (the
    queue forgets it): a read of each such unit up to the batches the model holds."""
    parts = [{"index": unit, "worker": worker_name(self._names, int(saved["owner"][unit])),
              "first_batch": int(saved["first_batch"][unit]),
              "from": int(saved["skip"][unit]), "to": held,
              "examples": (self._examples(session, unit, held) -
                           self._examples(session, unit, int(saved["skip"][unit])))}
             for unit, held in sorted(self.plan.in_flight.items())]
    with open(os.path.join(mid_epoch.mid_epoch_dir(self._dir), RESUMED_UNITS), "a") as f:
      f.write(json.dumps({"epoch": epoch, "parts": parts}) + "\n")

  def _audit_fields(self, session, epoch: int, arrivals) -> Dict[str, object]:
    """For a resumed epoch: `unit_parts`, the batches of units in flight at each resume, by the
    worker that trained them (batch k of a unit: its worker's batch first_batch + k, for k in
    [from, to)); and `trained_across_attempts`, each worker's batches and examples of the whole
    epoch (hooks.epoch.audit puts them in `workers`)."""
    path = os.path.join(mid_epoch.mid_epoch_dir(self._dir), RESUMED_UNITS)
    if not tf.io.gfile.exists(path):
      return {}
    with open(path) as f:
      resumes = [line["parts"] for line in map(json.loads, f) if line["epoch"] == epoch]
    if not resumes:
      return {}
    parts = [p for resume in resumes for p in resume]
    state = session.run(self._queue.claims.state, options=run_options(_TIMEOUT_SECS))
    trained = earlier_attempts(state, parts, self._names)
    offset = int(state["resumed_step"])  # Where each worker's batch count started.
    for name, stats in arrivals.items():
      counts = trained.setdefault(name, [0, 0])
      counts[0] += stats.batches - offset
      known = counts[1] is not None and stats.examples is not None and stats.examples >= 0
      counts[1] = counts[1] + stats.examples if known else None  # (elastic: a lost worker's)
    fields: Dict[str, object] = {"trained_across_attempts": {
        name: {"batches": b, "examples": e} for name, (b, e) in sorted(trained.items())}}
    if parts:
      fields["unit_parts"] = parts
    return fields

  def _read(self, path: str, size: int):
    names = dict(tf.train.list_variables(path))
    if _STATE not in names:
      raise ConfigError(
          f"the mid-epoch checkpoint {path} was written without a work queue, and this job "
          f"trains from one: its workers' positions are in static shards; resume it with the "
          f"static shards it was written with, or delete <model_dir>/{MID_EPOCH_DIR} to train "
          "the epoch again from its start with the queue")
    if names[_STATE] != [size]:
      raise ConfigError(
          f"the mid-epoch checkpoint {path} holds a work queue of another number of units "
          f"({units_of_size(names[_STATE][0])} there, {len(self._queue.units)} here): pass the units "
          f"it was written with, or delete <model_dir>/{MID_EPOCH_DIR} to train the epoch "
          "again from its start")
    load = lambda name: np.asarray(tf.train.load_variable(path, name), np.int64)
    return (load(_STATE), [int(v) for v in load(mid_epoch.POSITION_NAME)],
            [int(v) for v in load(mid_epoch.APPLIED_NAME)])

  def _check_units(self, saved: int, epoch: int) -> None:
    now = fingerprint_value(fingerprint(self._queue.units))
    if saved != now:
      raise ConfigError(
          f"the units changed since the mid-epoch checkpoint of epoch {epoch} was written "
          f"(their fingerprint: {saved:x} then, {now:x} now; a unit's path, range or place in "
          f"the list differs): the positions it holds are in those units; pass the same units "
          f"in the same order, or delete <model_dir>/{MID_EPOCH_DIR} to train the epoch again "
          "from its start")


def _applied(applied, owner: int, epoch: int) -> int:
  """The owner's batches applied in `epoch` (mid_epoch's encoding), 0 if it counted none."""
  value = applied[owner] if 0 <= owner < len(applied) else 0
  return graph_keys.batches_in_epoch(value, epoch)
