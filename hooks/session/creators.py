"""Session creators that start a cluster's sessions quickly, within a deadline, and only once.

TensorFlow's WorkerSessionCreator polls for the chief's initialisation every 30 s
(`recovery_wait_secs`), so a worker that asks a moment too early loses half a minute, and
TensorFlow's session creation waits for the ps tasks with no deadline. These creators first
wait (bounded by `startup_timeout_secs`) until the tasks they need answer, a worker polls the
chief every `poll_secs` (and gives up only when the chief made no progress, restoring included,
for `startup_timeout_secs`) and notices within a second when the chief or a ps dies, and neither
re-creates a session after MonitoredSession lost one: an epoch-synchronized job cannot resume
on one task alone, so they raise TaskDiedError naming the dead task instead.

Typical usage:
  creator = hooks.session.creators.session_creator(config, checkpoint_dir=model_dir)
  with tf.compat.v1.train.MonitoredSession(session_creator=creator, hooks=hooks) as sess:
    while not sess.should_stop():
      sess.run(train_op)
"""

import time
from typing import Optional, Sequence

import tensorflow as tf

from hooks.faults import liveness as liveness_lib
from hooks.checkpoint import mid_epoch as mid_epoch_lib
from hooks.checkpoint import partial_restore as restore_lib
from hooks.config.cluster import ClusterConfig
from hooks.errors import ConfigError, EpochSyncError, StartupTimeoutError, TaskDiedError
from hooks.faults.liveness import LivenessMonitor
from hooks.faults.lost_session import describe_lost_session
from hooks.faults.restore_beat import restoring_beat, start_up_watch
from hooks.session.polling import PollingSessionManager

__all__ = ["FastWorkerSessionCreator", "EpochSyncChiefSessionCreator", "session_creator"]

_v1 = tf.compat.v1
_RECREATE = "when MonitoredSession tried to re-create its lost session"


# TensorFlow's refusal of a propagated cluster that names the task its server booted as.
_BOOTED_AS_ITSELF = "names the job and task index to be the same names"


class _OnceAndAlive:
  """What both creators share: wait for the needed tasks first, and refuse a second session."""

  def _setup_liveness(self, liveness: Optional[LivenessMonitor], needed: Sequence[str],
                      task_name: str, startup_timeout_secs: float) -> None:
    self._liveness, self._needed = liveness, [n for n in needed
                                               if liveness and n in liveness.addresses]
    self._task, self._startup_timeout = task_name, startup_timeout_secs
    self._created = False

  def _ps0_target(self, worker_names: Optional[Sequence[str]]) -> Optional[str]:
    """Where the heartbeat rows live, when start-up waits are bounded by progress."""
    address = self._liveness and worker_names and self._liveness.addresses.get("ps:0")
    return "grpc://" + address if address else None

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
    worker_names: the training tasks by worker id (the chief first); with `liveness`, the
      wait for the chief's initialisation times out only after `max_wait_secs` without
      progress of the chief (its heartbeat beats while it restores a checkpoint). None: after
      `max_wait_secs` of waiting.
    Other args as `tf.compat.v1.train.WorkerSessionCreator`.

  Raises:
    StartupTimeoutError: from create_session() after `max_wait_secs` (without progress of the
      chief, with `worker_names`), naming the chief (or the tasks that never came up).
    TaskDiedError: the chief or a ps died during the wait, or (on a second call, when
      MonitoredSession re-creates a lost session) a task is found dead.
    EpochSyncError: on a second call when no task is found dead.
  """

  def __init__(self, scaffold=None, master: str = "", config=None,
               max_wait_secs: float = 600.0, poll_secs: float = 0.5,
               task_name: str = "this worker", chief_name: str = "the chief",
               liveness: Optional[LivenessMonitor] = None,
               needed: Optional[Sequence[str]] = None,
               worker_names: Optional[Sequence[str]] = None):
    if needed is None and liveness is not None:
      needed = [n for n in sorted(liveness.addresses) if n.startswith("ps:")]
    self._setup_liveness(liveness, needed or (), task_name, max_wait_secs)
    self._progress_target, self._worker_names = self._ps0_target(worker_names), worker_names
    # Bounded by the chief's progress: TensorFlow's own deadline must not cut the wait short.
    super().__init__(scaffold=scaffold, master=master, config=config,
                     max_wait_secs=float("inf") if self._progress_target else max_wait_secs)
    self._poll_secs, self._max_wait = poll_secs, max_wait_secs
    self._task_name, self._chief_name = task_name, chief_name
    self._watched = [n for n in [chief_name, *self._needed]
                     if liveness is not None and n in liveness.addresses]
    self._watch = None

  def create_session(self):
    self._before_create()
    try:
      return super().create_session()
    except tf.errors.DeadlineExceededError as e:
      raise StartupTimeoutError(
          f"session creation timed out after {self._max_wait:g} s on {self._task_name}: the "
          f"model is still not initialised; missing {self._chief_name} (check its log or raise "
          f"--epochsync_startup_timeout_secs)", [self._chief_name]) from e
    except tf.errors.InvalidArgumentError as e:
      if _BOOTED_AS_ITSELF not in e.message:
        raise
      raise ConfigError(
          f"{self._task_name} is beyond the launch's cluster (--epochsync_max_workers): its "
          "session brings its cluster to the ps tasks, and TensorFlow refuses that cluster to "
          "a server booted as the task it names. Start this task's server with "
          "config.start_server() (hooks.config.cluster.ClusterConfig), not "
          "tf.distribute.Server(config.cluster_spec(), ...)") from e

  def _death_while_not_ready(self) -> Optional[EpochSyncError]:
    """The TaskDiedError of a chief or ps that died while the model was not ready, the
    StartupTimeoutError of a chief that made no progress for `max_wait_secs`, or None.

    Returned, not raised: the poll it precedes may still find the model ready (a chief that
    initialised it and has since finished is no reason to fail).
    """
    if self._progress_target:
      if self._watch is None:
        self._watch = start_up_watch(self._progress_target, self._worker_names)
        self._waiting_since = time.monotonic()
      if self._watch.observe([0]) >= self._max_wait:
        return StartupTimeoutError(
            f"session creation timed out after {time.monotonic() - self._waiting_since:.0f} s "
            f"on {self._task_name}, the last {self._max_wait:g} s without progress of "
            f"{self._chief_name} ({self._watch.describe([0])}): the model is still not "
            f"initialised; missing {self._chief_name} (check its log or raise "
            "--epochsync_startup_timeout_secs)", [self._chief_name])
    if not self._watched:
      return None
    try:
      self._liveness.check(self._watched, f"for {self._chief_name} to initialise the model")
    except TaskDiedError as died:
      return died
    return None

  def _get_session_manager(self):
    if self._session_manager is None:
      self._session_manager = PollingSessionManager(
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
    worker_names: the training tasks by worker id; with `liveness`, the chief's heartbeat row
      says "restoring" once a second while it creates the session (restores), so that the
      workers' start-up waits count no time against it (`hooks.faults.restore_beat`).
    Other args as `tf.compat.v1.train.ChiefSessionCreator`.

  Raises:
    StartupTimeoutError: a ps task never came up, naming it.
    TaskDiedError / EpochSyncError: on a second call (see FastWorkerSessionCreator).
  """

  def __init__(self, scaffold=None, master: str = "", config=None,
               checkpoint_dir: Optional[str] = None, checkpoint_filename_with_path=None,
               liveness: Optional[LivenessMonitor] = None,
               startup_timeout_secs: float = 600.0, task_name: str = "the chief",
               worker_names: Optional[Sequence[str]] = None):
    super().__init__(scaffold=scaffold, master=master, config=config,
                     checkpoint_dir=checkpoint_dir,
                     checkpoint_filename_with_path=checkpoint_filename_with_path)
    needed = [n for n in sorted(liveness.addresses) if n.startswith("ps:")] if liveness else []
    self._setup_liveness(liveness, needed, task_name, startup_timeout_secs)
    self._beat_target, self._num_workers = self._ps0_target(worker_names), len(worker_names or ())

  def create_session(self):
    self._before_create()
    with restoring_beat(self._beat_target, self._num_workers):
      return self._create_and_restore()

  def _create_and_restore(self):
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
        startup_timeout_secs=startup_timeout_secs, task_name=config.task_name,
        worker_names=config.worker_names)
  return FastWorkerSessionCreator(
      scaffold=scaffold, master=master, config=config.session_config(),
      max_wait_secs=startup_timeout_secs, poll_secs=poll_secs, task_name=config.task_name,
      chief_name=config.worker_names[0], liveness=monitor, worker_names=config.worker_names)
