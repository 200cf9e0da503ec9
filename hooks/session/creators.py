"""Session creators that start a cluster's sessions quickly, within a deadline, and only once.

TensorFlow's WorkerSessionCreator polls for the chief's initialisation every 30 s
(`recovery_wait_secs`), so a worker that asks a moment too early loses half a minute, and
TensorFlow's session creation waits for the ps tasks with no deadline. These creators first
wait (bounded by `startup_timeout_secs`) until the tasks they need answer, a worker polls the
chief every `poll_secs` and notices within a second when the chief or a ps dies, and neither
re-creates a session after MonitoredSession lost one: an epoch-synchronized job cannot resume
on one task alone, so they raise TaskDiedError naming the dead task instead.

Typical usage:
  creator = hooks.session.creators.session_creator(config, checkpoint_dir=model_dir)
  with tf.compat.v1.train.MonitoredSession(session_creator=creator, hooks=hooks) as sess:
    while not sess.should_stop():
      sess.run(train_op)
"""

import time
from typing import Callable, Optional, Sequence

import tensorflow as tf

from hooks.faults import liveness as liveness_lib
from hooks.checkpoint import mid_epoch as mid_epoch_lib
from hooks.checkpoint import partial_restore as restore_lib
from hooks.config.cluster import ClusterConfig
from hooks.errors import EpochSyncError, StartupTimeoutError, TaskDiedError
from hooks.faults.liveness import LivenessMonitor
from hooks.faults.lost_session import describe_lost_session

__all__ = ["FastWorkerSessionCreator", "EpochSyncChiefSessionCreator", "session_creator"]

_v1 = tf.compat.v1
_RECREATE = "when MonitoredSession tried to re-create its lost session"


class _OnceAndAlive:
  """What both creators share: wait for the needed tasks first, and refuse a second session."""

  def _setup_liveness(self, liveness: Optional[LivenessMonitor], needed: Sequence[str],
                      task_name: str, startup_timeout_secs: float) -> None:
    self._liveness, self._needed = liveness, [n for n in needed
                                               if liveness and n in liveness.addresses]
    self._task, self._startup_timeout = task_name, startup_timeout_secs
    self._created = False

  def _before_create(self) -> float:
    """Refuses a re-creation; waits until the needed tasks answer. Returns the deadline."""
    if self._created:
      cause = describe_lost_session(self._task)
      if self._liveness:
        self._liveness.raise_if_any_died(_RECREATE)
      why = (f", every task still alive (a transient error: {cause})" if self._liveness
             else f" ({cause})")
      raise EpochSyncError(
          f"{self._task} lost its session{why} "
          "and epoch-synchronized training cannot resume it on one task alone: restart the "
          "whole job (every task) from the same model_dir; it resumes from its newest "
          "checkpoint")
    self._created = True
    deadline = time.monotonic() + self._startup_timeout
    if self._liveness and self._needed:
      self._liveness.wait_until_up(self._needed, deadline, "before creating its session")
    return deadline


class FastWorkerSessionCreator(_v1.train.WorkerSessionCreator, _OnceAndAlive):
  """A WorkerSessionCreator that re-checks readiness every `poll_secs` instead of 30 s.

    creator = FastWorkerSessionCreator(master=server.target, poll_secs=0.5,
                                       max_wait_secs=600)
    sess = tf.compat.v1.train.MonitoredSession(session_creator=creator)

  Args:
    poll_secs: `float`, seconds between two readiness checks.
    task_name: `str`, this task ("worker:1"), and chief_name: the task that initialises
      the model ("chief:0"); both only for the timeout's message.
    liveness: a `LivenessMonitor`; then the creator first waits for `needed` (default: every
      ps task) to answer, and while the model is not ready, a chief or ps that dies raises
      TaskDiedError within a second or two. None: the deadline only.
    needed: task names this worker waits to answer before its first readiness check. The
      chief is not one of them by default: once it has initialised the model it may finish
      (and exit) before a slow worker even starts.
    Other args as `tf.compat.v1.train.WorkerSessionCreator`.

  Raises:
    StartupTimeoutError: from create_session() after `max_wait_secs`, naming the chief (or the
      tasks that never came up).
    TaskDiedError: the chief or a ps died during the wait, or (on a second call, when
      MonitoredSession re-creates a lost session) a task is found dead.
    EpochSyncError: on a second call when no task is found dead.
  """

  def __init__(self, scaffold=None, master: str = "", config=None,
               max_wait_secs: float = 600.0, poll_secs: float = 0.5,
               task_name: str = "this worker", chief_name: str = "the chief",
               liveness: Optional[LivenessMonitor] = None,
               needed: Optional[Sequence[str]] = None):
    super().__init__(scaffold=scaffold, master=master, config=config,
                     max_wait_secs=max_wait_secs)
    self._poll_secs, self._max_wait = poll_secs, max_wait_secs
    self._task_name, self._chief_name = task_name, chief_name
    if needed is None and liveness is not None:
      needed = [n for n in sorted(liveness.addresses) if n.startswith("ps:")]
    self._setup_liveness(liveness, needed or (), task_name, max_wait_secs)
    self._watched = [n for n in [chief_name, *self._needed]
                     if liveness is not None and n in liveness.addresses]

  def create_session(self):
    self._before_create()
    try:
      return super().create_session()
    except tf.errors.DeadlineExceededError as e:
      raise StartupTimeoutError(
          f"session creation timed out after {self._max_wait:g} s on {self._task_name}: the "
          f"model is still not initialised; missing {self._chief_name} (check its log or raise "
          f"--epochsync_startup_timeout_secs)", [self._chief_name]) from e

  def _death_while_not_ready(self) -> Optional[TaskDiedError]:
    """The TaskDiedError of a chief or ps that died while the model was not ready, or None.

    Returned, not raised: the poll it precedes may still find the model ready (a chief that
    initialised it and has since finished is no reason to fail).
    """
    if not self._watched:
      return None
    try:
      self._liveness.check(self._watched, f"for {self._chief_name} to initialise the model")
    except TaskDiedError as died:
      return died
    return None

  def _get_session_manager(self):
    if self._session_manager is None:
      self._session_manager = _PollingSessionManager(
          self._death_while_not_ready,
          local_init_op=self._scaffold.local_init_op,
          local_init_feed_dict=self._scaffold.local_init_feed_dict,
          ready_op=self._scaffold.ready_op,
          ready_for_local_init_op=self._scaffold.ready_for_local_init_op,
          graph=_v1.get_default_graph(),
          recovery_wait_secs=self._poll_secs)
    return self._session_manager


class EpochSyncChiefSessionCreator(_v1.train.ChiefSessionCreator, _OnceAndAlive):
  """A ChiefSessionCreator that waits for the ps tasks with a deadline and creates one session.

  It restores the newest mid-epoch checkpoint instead of the newest epoch checkpoint when its
  epoch is later (`hooks.checkpoint.mid_epoch.checkpoint_to_restore`), and checkpoints written without
  tf-epochsync (a stock job switched on) or with
  another worker count: every model variable is restored, tf-epochsync's own state starts
  fresh, and one WARNING line says so (`hooks.checkpoint.partial_restore`). As in stock, the scaffold's `init_fn`
  (a warm start) runs only when there is no checkpoint to restore.

    creator = EpochSyncChiefSessionCreator(master=server.target, checkpoint_dir=model_dir,
                                           liveness=monitor_for(config))
    sess = tf.compat.v1.train.MonitoredSession(session_creator=creator)

  Args:
    liveness: a `LivenessMonitor`; the creator first waits until every ps task answers.
    startup_timeout_secs: `float`, how long it waits for them.
    task_name: `str`, this task, for messages.
    Other args as `tf.compat.v1.train.ChiefSessionCreator`.

  Raises:
    StartupTimeoutError: a ps task never came up, naming it.
    TaskDiedError / EpochSyncError: on a second call (see FastWorkerSessionCreator).
  """

  def __init__(self, scaffold=None, master: str = "", config=None,
               checkpoint_dir: Optional[str] = None, checkpoint_filename_with_path=None,
               liveness: Optional[LivenessMonitor] = None,
               startup_timeout_secs: float = 600.0, task_name: str = "the chief"):
    super().__init__(scaffold=scaffold, master=master, config=config,
                     checkpoint_dir=checkpoint_dir,
                     checkpoint_filename_with_path=checkpoint_filename_with_path)
    needed = [n for n in sorted(liveness.addresses) if n.startswith("ps:")] if liveness else []
    self._setup_liveness(liveness, needed, task_name, startup_timeout_secs)

  def create_session(self):
    self._before_create()
    mid_epoch = (not self._checkpoint_filename_with_path and
                 mid_epoch_lib.checkpoint_to_restore(self._checkpoint_dir))
    if mid_epoch:  # Newer than the newest epoch checkpoint (hooks.checkpoint.mid_epoch).
      self._checkpoint_dir, self._checkpoint_filename_with_path = None, mid_epoch
    plan = self._partial_restore_plan()
    if plan is None:
      return super().create_session()
    # Built before the scaffold finalizes the graph. The session manager then initialises
    # everything as if there were no checkpoint, and the saver restores the model over it.
    saver = _v1.train.Saver(var_list=plan.restore, sharded=True, allow_empty=True)
    renamed = plan.renamed and _v1.train.Saver(var_list=plan.renamed, sharded=True)
    self._scaffold.finalize()
    # As ChiefSessionCreator.create_session, without the checkpoint and without the scaffold's
    # init_fn: stock runs init_fn (a warm start) only when there is no checkpoint to restore.
    sess = self._get_session_manager().prepare_session(
        self._master, saver=self._scaffold.saver, config=self._config,
        init_op=self._scaffold.init_op, init_feed_dict=self._scaffold.init_feed_dict)
    saver.restore(sess, plan.checkpoint)
    if renamed:
      renamed.restore(sess, plan.checkpoint)
    restore_lib.log_plan(plan, completed_epochs_fresh=any(
        v.op.name.endswith("completed_epochs") for v in plan.fresh))
    return sess

  def _partial_restore_plan(self):
    """A RestorePlan if the checkpoint lacks (or mis-shapes) tf-epochsync's state, else None."""
    path = self._checkpoint_filename_with_path or (
        self._checkpoint_dir and tf.train.latest_checkpoint(self._checkpoint_dir))
    if not path:
      return None
    plan = restore_lib.restore_plan(path, _v1.global_variables())
    return plan if plan.fresh or plan.renamed else None


class _PollingSessionManager(_v1.train.SessionManager):
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


def session_creator(config: ClusterConfig, master: str, scaffold=None,
                    checkpoint_dir: Optional[str] = None,
                    startup_timeout_secs: float = 600.0, poll_secs: float = 0.5):
  """The chief's EpochSyncChiefSessionCreator (restores `checkpoint_dir`) or a fast worker one.

  Both use `config.session_config()` so a task only talks to the ps tasks and itself, and
  `hooks.faults.liveness.monitor_for(config)` to wait for the tasks they need and to name a dead one.
  """
  monitor = liveness_lib.monitor_for(config)
  if config.is_chief:
    return EpochSyncChiefSessionCreator(
        scaffold=scaffold, master=master, config=config.session_config(),
        checkpoint_dir=checkpoint_dir, liveness=monitor,
        startup_timeout_secs=startup_timeout_secs, task_name=config.task_name)
  return FastWorkerSessionCreator(
      scaffold=scaffold, master=master, config=config.session_config(),
      max_wait_secs=startup_timeout_secs, poll_secs=poll_secs, task_name=config.task_name,
      chief_name=config.worker_names[0], liveness=monitor)
