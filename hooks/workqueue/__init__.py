"""Balanced epochs: the epoch's units handed to whichever worker is free, exactly once.

Typical usage:
  from hooks.workqueue import WorkUnit, work_queue_input
  units = [WorkUnit(path) for path in sorted(glob.glob("/data/part-*.tfrecord"))]
  epoch_input = work_queue_input(units, unit_fn, num_epochs=3, num_workers=config.num_workers,
                                 worker_id=config.worker_id, task_name=config.task_name)
"""

from hooks.workqueue.input import WorkQueueSpec, work_queue_input
from hooks.workqueue.replay import UnitReplay
from hooks.workqueue.units import UnitTensors, WorkUnit, fingerprint, unit_problems, units_of_files

__all__ = ["WorkUnit", "UnitTensors", "work_queue_input", "WorkQueueSpec", "units_of_files", "unit_problems",
           "fingerprint", "UnitReplay"]
