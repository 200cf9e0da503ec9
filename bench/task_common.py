"""What the benchmarks' cluster tasks share: the task's start and a hook timing each step.

Typical usage (in a bench/*_task.py main):
  config, settings, server = start_task()
  steps = StepTimes()
  with tf.compat.v1.train.MonitoredSession(..., hooks=[steps] + hooks) as sess: ...
  json.dump({"steps": steps.steps}, f)
"""

import time
from typing import List, Tuple

import tensorflow as tf

from hooks.config import flags as epochsync_flags

__all__ = ["StepTimes", "start_task"]

_v1 = tf.compat.v1


def start_task() -> Tuple[object, object, tf.distribute.Server]:
  """Graph mode; this task's ClusterConfig and Settings from the flags, and its started server."""
  _v1.disable_v2_behavior()
  config = epochsync_flags.cluster_from_flags()
  settings = epochsync_flags.settings_from_flags()
  server = tf.distribute.Server(config.cluster_spec(), job_name=config.task_type,
                                task_index=config.task_index, config=config.session_config())
  return config, settings, server


class StepTimes(_v1.train.SessionRunHook):
  """Put it first: each step's [start, end] in time.time(), before any epoch-end work."""

  def __init__(self):
    self.steps: List[List[float]] = []
    self._start = 0.0

  def before_run(self, run_context):
    self._start = time.time()

  def after_run(self, run_context, run_values):
    self.steps.append([self._start, time.time()])
