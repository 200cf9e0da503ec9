"""The units of a work queue: files or record ranges of files, checked before the first step.

A unit is what one worker trains in one go: a whole file, or records [start, end) of it. The
job's epoch is the list of its units; each epoch hands every unit out once
(hooks.workqueue.queue_graph). `unit_fn` turns one unit, given as tensors, into the user's
`tf.data.Dataset` of batches (its parse and batch), so batches never span two units: a unit's
last batch may be partial.

Typical usage:
  units = [WorkUnit("/data/part-0.tfrecord"), WorkUnit("/data/part-1.tfrecord", 0, 5000)]
  def unit_fn(unit):  # unit.path: tf.string, unit.start / unit.count: tf.int64 (count -1: all)
    return (tf.data.TFRecordDataset(unit.path).skip(unit.start).take(unit.count)
            .map(parse).batch(256))
  problems = unit_problems(units)   # [] or what is wrong, naming the unit
"""

import dataclasses
import hashlib
from typing import List, NamedTuple, Sequence

import tensorflow as tf

__all__ = ["WorkUnit", "UnitTensors", "unit_problems", "fingerprint", "units_of_files"]


@dataclasses.dataclass(frozen=True)
class WorkUnit:
  """Records [start, end) of `path`; end=None: to the end of the file.

  `path` may be "" when `unit_fn` reads from elsewhere (e.g. rows of an in-memory array); then
  nothing is checked on disk.
  """
  path: str
  start: int = 0
  end: "int | None" = None

  @property
  def count(self) -> int:
    """Records in the unit, -1 when it runs to the end of its file."""
    return -1 if self.end is None else self.end - self.start

  def __str__(self) -> str:
    return f"{self.path or '<rows>'}[{self.start}:{'' if self.end is None else self.end}]"


class UnitTensors(NamedTuple):
  """What `unit_fn` receives: the unit's fields as scalar tensors (count -1: to the end)."""
  index: tf.Tensor
  path: tf.Tensor
  start: tf.Tensor
  count: tf.Tensor


def units_of_files(paths: Sequence[str]) -> List[WorkUnit]:
  """One unit per file, in the order given."""
  return [WorkUnit(str(p)) for p in paths]


def unit_problems(units: Sequence[WorkUnit]) -> List[str]:
  """What is wrong with `units`, each problem naming its unit; [] when nothing is."""
  if not isinstance(units, (list, tuple)) or not units:
    return [f"units={units!r} must be a non-empty list of hooks.workqueue.WorkUnit"]
  problems, seen = [], {}
  for i, unit in enumerate(units):
    if not isinstance(unit, WorkUnit):
      problems.append(f"units[{i}]={unit!r} is not a WorkUnit(path, start, end)")
      continue
    if unit in seen:
      problems.append(f"units[{i}] {unit} repeats units[{seen[unit]}]: each unit is trained "
                      "once per epoch; remove the duplicate")
      continue
    seen[unit] = i
    if unit.start < 0 or (unit.end is not None and unit.end <= unit.start):
      problems.append(f"units[{i}] {unit}: the range must hold at least one record "
                      "(0 <= start < end)")
    if unit.path and not tf.io.gfile.exists(unit.path):
      problems.append(f"units[{i}]: file {unit.path} does not exist (or cannot be read)")
  return problems


def fingerprint(units: Sequence[WorkUnit]) -> str:
  """A short hash of the units and their order: a checkpoint's queue belongs to these units."""
  digest = hashlib.sha256()
  for unit in units:
    digest.update(f"{unit.path}\0{unit.start}\0{unit.end}\n".encode())
  return digest.hexdigest()[:16]

