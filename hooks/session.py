"""Session creators that start a cluster's sessions quickly and within a deadline.

TensorFlow's WorkerSessionCreator polls for the chief's initialisation every 30 s
(`recovery_wait_secs`), so a worker that asks a moment too early loses half a minute.
These creators poll every `poll_secs` and give up after `startup_timeout_secs`.

Typical usage:
  creator = hooks.session.session_creator(config, checkpoint_dir=model_dir)
  with tf.compat.v1.train.MonitoredSession(session_creator=creator, hooks=hooks) as sess:
    while not sess.should_stop():
      sess.run(train_op)
"""

from typing import Optional

import tensorflow as tf

from hooks.cluster import ClusterConfig
from hooks.errors import StartupTimeoutError

__all__ = ["FastWorkerSessionCreator", "session_creator"]

_v1 = tf.compat.v1


class FastWorkerSessionCreator(_v1.train.WorkerSessionCreator):
  """A WorkerSessionCreator that re-checks readiness every `poll_secs` instead of 30 s.

    creator = FastWorkerSessionCreator(master=server.target, poll_secs=0.5,
                                       max_wait_secs=600)
    sess = tf.compat.v1.train.MonitoredSession(session_creator=creator)

  Args:
    poll_secs: `float`, seconds between two readiness checks.
    task_name: `str`, this task ("worker:1"), and chief_name: the task that initialises
      the model ("chief:0"); both only for the timeout's message.
    Other args as `tf.compat.v1.train.WorkerSessionCreator`.

  Raises:
    StartupTimeoutError: from create_session() after `max_wait_secs`, naming the chief.
  """

  def __init__(self, scaffold=None, master: str = "", config=None,
               max_wait_secs: float = 600.0, poll_secs: float = 0.5,
               task_name: str = "this worker", chief_name: str = "the chief"):
    super().__init__(scaffold=scaffold, master=master, config=config,
                     max_wait_secs=max_wait_secs)
    self._poll_secs, self._max_wait = poll_secs, max_wait_secs
    self._task_name, self._chief_name = task_name, chief_name

  def create_session(self):
    try:
      return super().create_session()
    except tf.errors.DeadlineExceededError as e:
      raise StartupTimeoutError(
          f"session creation timed out after {self._max_wait:g} s on {self._task_name}: the "
          f"model is still not initialised; missing {self._chief_name} (check its log or raise "
          f"--epochsync_startup_timeout_secs)", [self._chief_name]) from e

  def _get_session_manager(self):
    if self._session_manager is None:
      self._session_manager = _v1.train.SessionManager(
          local_init_op=self._scaffold.local_init_op,
          local_init_feed_dict=self._scaffold.local_init_feed_dict,
          ready_op=self._scaffold.ready_op,
          ready_for_local_init_op=self._scaffold.ready_for_local_init_op,
          graph=_v1.get_default_graph(),
          recovery_wait_secs=self._poll_secs)
    return self._session_manager


def session_creator(config: ClusterConfig, master: str, scaffold=None,
                    checkpoint_dir: Optional[str] = None,
                    startup_timeout_secs: float = 600.0, poll_secs: float = 0.5):
  """The chief's ChiefSessionCreator (restores `checkpoint_dir`) or a fast worker creator.

  Both use `config.session_config()` so a task only talks to the ps tasks and itself.
  """
  if config.is_chief:
    return _v1.train.ChiefSessionCreator(
        scaffold=scaffold, master=master, config=config.session_config(),
        checkpoint_dir=checkpoint_dir)
  return FastWorkerSessionCreator(
      scaffold=scaffold, master=master, config=config.session_config(),
      max_wait_secs=startup_timeout_secs, poll_secs=poll_secs, task_name=config.task_name,
      chief_name=config.worker_names[0])
