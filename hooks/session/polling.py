"""A SessionManager for a worker's wait for the chief: it can fail on what it finds meanwhile.

TensorFlow's `SessionManager.wait_for_session` re-checks the model's readiness until its
deadline and cannot be told that the chief died. This one asks a callback before each
re-check; an error it returns is raised when that re-check still finds the model unready.

Typical usage (FastWorkerSessionCreator's):
  manager = PollingSessionManager(death_while_not_ready, ready_op=scaffold.ready_op,
                                  graph=tf.compat.v1.get_default_graph(),
                                  recovery_wait_secs=0.5)
  session = manager.wait_for_session(master, max_wait_secs=float("inf"))
"""

from typing import Callable, Optional

import tensorflow as tf

__all__ = ["PollingSessionManager"]


class PollingSessionManager(tf.compat.v1.train.SessionManager):
  """A SessionManager whose wait_for_session fails on a death found while the model is unready.

  Before each re-check (not the first), `death_while_not_ready()` probes; the error it returns
  is raised only if that re-check finds the model still not ready.
  """

  def __init__(self, death_while_not_ready: Callable[[], Optional[Exception]], **kwargs):
    super().__init__(**kwargs)
    self._death_while_not_ready = death_while_not_ready
    self._polls = 0
    self._death: Optional[Exception] = None

  def _try_run_local_init_op(self, sess):  # The first call of each poll of wait_for_session.
    self._polls += 1
    self._death = self._death_while_not_ready() if self._polls > 1 else None
    ok, message = super()._try_run_local_init_op(sess)
    if not ok and self._death is not None:
      self._safe_close(sess)
      raise self._death
    return ok, message

  def _model_ready(self, sess):
    ready, message = super()._model_ready(sess)
    if not ready and self._death is not None:
      self._safe_close(sess)
      raise self._death
    return ready, message
