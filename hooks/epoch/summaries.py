"""The chief writes per-epoch scalars for TensorBoard: epoch time, steps, each worker's share and wait.

The scalars are written by a chief action of the epoch barrier (after every worker arrived at
the end of an epoch and after the epoch's checkpoint, before the release), one event per
epoch with the epoch as the step, into `<output_dir>/epochsync` (a run of its own, so
TensorBoard pointed at the model_dir shows them beside the training summaries, by epoch).

Typical usage:
  summaries = EpochSummaryHook(barrier, output_dir=model_dir)   # chief only, after the save
  hooks = [done, barrier, save, summaries, epoch_input.hook]
  read_epoch_summaries(model_dir)["epoch/steps"]  # {0: 9, 1: 9, 2: 9}
"""

import collections
import glob
import os
import time
from typing import Dict, Mapping

import tensorflow as tf

from hooks import log as logging
from hooks.epoch.barrier import EpochBarrierHook
from hooks.data.epoch_input import EpochStats
from hooks.errors import ConfigError

__all__ = ["EpochSummaryHook", "read_epoch_summaries", "SUBDIR"]

_v1 = tf.compat.v1
SUBDIR = "epochsync"  # <output_dir>/epochsync: the TensorBoard run of the per-epoch scalars


class EpochSummaryHook(_v1.train.SessionRunHook):
  """On the chief, writes one TensorBoard event per epoch into `<output_dir>/epochsync`.

  Scalars (step = epoch): `epoch/wall_secs` (first start to last arrival), `epoch/steps`
  (global steps in the epoch), `epoch/global_step` (at the save), `epoch/examples` (all
  workers), and per task `batches/<task>`, `examples/<task>`, `epoch_secs/<task>` and
  `barrier_wait_secs/<task>` (from its arrival until the chief finished the epoch's actions,
  the save included; the release follows at once).

    save = ChiefSaveAfterBarrierHook(barrier, model_dir)
    summaries = EpochSummaryHook(barrier, model_dir)   # after the save: it sees its step

  Args:
    barrier: the chief's `EpochBarrierHook` (worker_id 0).
    output_dir: `str`, the model (or summary) directory; the events go to its `epochsync/`.

  Raises:
    ConfigError: if `barrier` is not the chief's or `output_dir` is empty.
  """

  def __init__(self, barrier: EpochBarrierHook, output_dir: str):
    if not output_dir:
      raise ConfigError("EpochSummaryHook: output_dir is empty; pass the model_dir")
    if not barrier.is_chief:
      raise ConfigError(f"EpochSummaryHook runs on the chief only, but the barrier is "
                        f"{barrier.task_name}'s; add it to chief_only_hooks")
    self.logdir = os.path.join(output_dir, SUBDIR)
    self._writer = None
    self._last_step = None
    barrier.add_chief_action(self._write)

  def begin(self):
    self._global_step = _v1.train.get_global_step()

  def after_create_session(self, session, coord):
    if self._global_step is not None:  # The step the (restored) model starts from.
      self._last_step = int(session.run(self._global_step))

  def _write(self, session, epoch: int, arrivals: Mapping[str, EpochStats]) -> Dict[str, object]:
    now = time.time()
    # A lost worker's (elastic) examples and times are unknown (-1, 0): only its batches count.
    live = {t: s for t, s in arrivals.items() if s.examples >= 0}
    values = {
        "epoch/wall_secs": max(s.ended_at for s in live.values()) -
                           min(s.started_at for s in live.values()),
        "epoch/examples": sum(s.examples for s in live.values())}
    if self._global_step is not None:
      step = int(session.run(self._global_step))
      values["epoch/global_step"] = step
      if self._last_step is not None:
        values["epoch/steps"] = step - self._last_step
      self._last_step = step
    for task, s in sorted(arrivals.items()):
      values[f"batches/{task}"] = s.batches
      if task not in live:
        continue
      values[f"examples/{task}"] = s.examples
      values[f"epoch_secs/{task}"] = s.ended_at - s.started_at
      values[f"barrier_wait_secs/{task}"] = max(0.0, now - s.ended_at)
    summary = _v1.Summary(value=[_v1.Summary.Value(tag=tag, simple_value=float(v))
                                 for tag, v in values.items()])
    if self._writer is None:  # Made at the first epoch's end: off the chief's way to the start.
      # A suffix of its own: two writers started in the same second (TensorFlow names event
      # files by the second and the host) would otherwise write to one file.
      self._writer = _v1.summary.FileWriter(
          self.logdir, filename_suffix=f".{os.getpid()}.{time.time_ns()}")
    self._writer.add_summary(summary, global_step=epoch)
    self._writer.flush()
    logging.info("epoch %d summaries written to %s", epoch, self.logdir)
    return {}

  def end(self, session):
    if self._writer is not None:
      self._writer.close()
      self._writer = None


def read_epoch_summaries(output_dir: str) -> Dict[str, Dict[int, float]]:
  """{tag: {epoch: value}} from every event file in `<output_dir>/epochsync` (later wins)."""
  out: Dict[str, Dict[int, float]] = collections.defaultdict(dict)
  for path in sorted(glob.glob(os.path.join(output_dir, SUBDIR, "events.out.tfevents.*"))):
    for event in _v1.train.summary_iterator(path):
      for value in event.summary.value:
        out[value.tag][int(event.step)] = value.simple_value
  return dict(out)
