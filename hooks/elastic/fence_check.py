"""A worker of an elastic job refuses to start when the chief already found it lost.

The chief fences a lost worker in the work queue (hooks.elastic.lost_workers). A process that
replaces it rejoins the running job (hooks.elastic.rejoin) when its earlier process had joined
the run. If that process was lost before it joined (so this one was not refused at the run's
start), this one would arrive at the start barrier of a job that no longer counts it: it ends
at once with WorkerFencedError instead, before the barrier; relaunched once more, it rejoins.

Typical usage (hooks.session.wiring adds it on every other worker with --epochsync_elastic,
before the barrier):
  hooks.append(FenceCheckHook(queue))
"""

import tensorflow as tf

from hooks.workqueue.unit_passes import UnitPasses

__all__ = ["FenceCheckHook"]


class FenceCheckHook(tf.compat.v1.train.SessionRunHook):
  """Raises WorkerFencedError at session creation if this worker is fenced in `queue`."""

  def __init__(self, queue: UnitPasses):
    self._queue = queue

  def after_create_session(self, session, coord):
    self._queue.claims.raise_if_fenced(session)
