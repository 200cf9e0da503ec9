"""A worker of an elastic job refuses to start when the chief already found it lost.

The chief fences a lost worker in the work queue (hooks.elastic.lost_workers). A process that
replaces it rejoins the running job (hooks.elastic.rejoin) when its earlier process had joined
the run. If that process was lost before it joined (so this one was not refused at the run's
start), this one would arrive at the start barrier of a job that no longer counts it: it ends
at once with WorkerFencedError instead, before the barrier; relaunched once more, it rejoins.
A process that found the job's epochs all trained (a spare standing by to the end, or a
relaunch after the last epoch; `rejoin.finished`) ends without a step and is not refused.

Typical usage (hooks.session.wiring adds it on every other worker with --epochsync_elastic,
before the barrier):
  hooks.append(FenceCheckHook(queue, rejoin))
"""

from typing import Any

import tensorflow as tf

from hooks.workqueue.unit_passes import UnitPasses

__all__ = ["FenceCheckHook"]


class FenceCheckHook(tf.compat.v1.train.SessionRunHook):
  """Raises WorkerFencedError at session creation if this worker is fenced in `queue`, unless
  its `rejoin` (hooks.elastic.Rejoin) found the job finished."""

  def __init__(self, queue: UnitPasses, rejoin: Any = None):
    self._queue, self._rejoin = queue, rejoin

  def after_create_session(self, session, coord):
    if self._rejoin is None or not self._rejoin.finished:
      self._queue.claims.raise_if_fenced(session)
