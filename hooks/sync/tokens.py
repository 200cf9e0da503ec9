"""The session hook of WorkerDoneSyncReplicasOptimizer: aggregation, bounded steps, clean stop.

Typical usage:
  hook = opt.make_session_run_hook(config.is_chief, num_tokens=0, step_timeout_secs=600)
  with tf.compat.v1.train.MonitoredTrainingSession(master=target, is_chief=config.is_chief,
                                                   hooks=[hook]) as sess:
    while not sess.should_stop(): sess.run(train_op)
"""

import threading
import time
from typing import Any, Callable, List, Optional, Sequence, Tuple

import tensorflow as tf

from hooks.faults import heartbeat
from hooks import log as logging
from hooks.errors import ConfigError, StepTimeoutError, TaskDiedError
from hooks.epoch import run_start
from hooks.sync import arguments as sync_args
from hooks.sync import blocked_step
from hooks.sync.aggregation_loop import AggregationLoop
from hooks.faults.liveness import LivenessMonitor, explain_lost_session
from hooks.faults import step_watch
from hooks.faults.step_watch import StepWatch
from hooks.faults.stuck_step import LOST_AFTER_SECS
from hooks.faults.waiting import MAX_WAIT_SECS, run_options

__all__ = ["SafeSyncTokensHook"]

_v1 = tf.compat.v1
_PROGRESS_AFTER_SECS = 1.0  # A step that waited this long reads the others' heartbeats.
_READ_TIMEOUT_SECS = 2.0  # Bound of the watchdog's progress read and of closing the marker queue.
_JOIN_SECS = 10.0
_SEND_STOP = "send the STOP markers"  # what the chief's end does, for messages


class SafeSyncTokensHook(_v1.train.SessionRunHook):
  """Runs the chief's aggregation thread, bounds every step and stops without noise.

  Returned by WorkerDoneSyncReplicasOptimizer.make_session_run_hook(); give one to every task.
  A step (a run that fetches the optimizer's train_op) gets a run deadline; past
  `warn_after_secs` a WARNING every `log_every_secs` names the workers whose gradient is missing,
  and at `step_timeout_secs` the session stops with a StepTimeoutError naming them.

    hook = opt.make_session_run_hook(is_chief, num_tokens=0, step_timeout_secs=600)
    with tf.compat.v1.train.MonitoredSession(session_creator=creator, hooks=[hook]) as sess:
      sess.run(train_op)

  Args:
    sync_optimizer: `WorkerDoneSyncReplicasOptimizer` whose apply_gradients() was called.
    is_chief: `bool` run the aggregation thread (exactly one task must).
    num_tokens: `int` must be 0: no initial tokens.
    step_timeout_secs: `float` > 0, longest wait of one step for its token.
    warn_after_secs: `float` > 0, a step waiting longer logs who is missing.
    log_every_secs: `float` > 0, period of those WARNINGs.
    clock: `Callable[[], float]` monotonic clock (tests inject one).

  Raises:
    ConfigError: num_tokens != 0 or a non-positive duration; in begin(), if apply_gradients()
      was not called.
  """

  @property
  def optimizer(self) -> Any:
    """The WorkerDoneSyncReplicasOptimizer this hook serves."""
    return self._opt

  @property
  def sync_train_op(self):
    """The optimizer's train_op whose tokens this hook serves (None before minimize)."""
    return self._opt.sync_ops.train_op if self._opt.sync_ops else None

  def __init__(self, sync_optimizer: Any, is_chief: bool, num_tokens: int = 0,
               step_timeout_secs: float = 600.0, warn_after_secs: float = 60.0,
               log_every_secs: float = 30.0, clock: Callable[[], float] = time.monotonic):
    sync_args.raise_if_bad_hook_arguments(num_tokens, step_timeout_secs, warn_after_secs,
                                          log_every_secs)
    self._step = StepWatch(step_timeout_secs, warn_after_secs, log_every_secs, clock)
    self._opt, self._is_chief = sync_optimizer, bool(is_chief)
    self._names: Sequence[str] = sync_optimizer.worker_names
    self.task_name = self._names[sync_optimizer.worker_id]
    self._stopping = threading.Event()
    self._threads: List[threading.Thread] = []
    self._liveness: Optional[LivenessMonitor] = None
    self._ender = blocked_step.BlockedStepEnder(self.task_name, self._step)
    self._epoch_fn: Callable[[], Optional[int]] = lambda: None
    self._on_aggregated: List[Callable[[Any, int], None]] = []
    self._loop: Optional[AggregationLoop] = None

  def on_aggregated(self, fn: Callable[[Any, int], None]) -> None:
    """Chief: `fn(session, g)` after each aggregation run (g > 0 a step, 0 the epoch's end)."""
    self._on_aggregated.append(fn)

  @property
  def num_updates(self) -> int:
    """Chief: aggregation runs that applied gradients."""
    return self._loop.num_updates if self._loop else 0

  @property
  def num_aggregations(self) -> int:
    return self._loop.num_aggregations if self._loop else 0

  @property
  def aggregating(self) -> bool:
    """Chief: its aggregation thread runs (an AggregationGroup's waits end when it does not)."""
    return any(t.is_alive() for t in self._threads[1:])

  def use_liveness(self, monitor: LivenessMonitor,
                   epoch_fn: Callable[[], Optional[int]] = lambda: None) -> None:
    """Probes the chief, the other workers and the ps tasks once a second while a step waits.

    A dead one stops the session at once with TaskDiedError instead of at the step timeout.
    `epoch_fn()` gives the current epoch for the message (e.g. `lambda: epoch_input.hook.epoch`).
    """
    self._liveness, self._epoch_fn = monitor, epoch_fn

  def begin(self) -> None:
    self._ops = self._opt.sync_ops
    if self._ops is None:
      raise ConfigError("SafeSyncTokensHook needs the optimizer's train_op: call opt.minimize() or "
                        "opt.apply_gradients(..., global_step) before creating the session")
    self._train_names = {self._ops.train_op.name, self._ops.train_op.op.name}
    # The watchdog bounds a step (by the others' progress) and ends it with an ABORT token; the
    # run's own deadline only backs it up: a save of the chief's may stall a step for long.
    self._step_args = _v1.train.SessionRunArgs(None, options=run_options(MAX_WAIT_SECS))
    self._heartbeat_rows = heartbeat.rows_op(len(self._names), self._ops.diagnostics[0].device)
    self._loop = AggregationLoop(self.task_name, self._ops.aggregate_and_store_op,
                                 self._ops.last_aggregate, self._ops.count_epoch_op,
                                 listeners=self._on_aggregated,  # shared: added to until started
                                 begun=self._ops.aggregations_begun,
                                 lost_after_secs=min(LOST_AFTER_SECS,
                                                     self._step.timeout_secs / 4))

  def after_create_session(self, session, coord) -> None:
    run_start.check_started("SafeSyncTokensHook")
    self._stopping.clear()
    self._ender.error = None
    # The chief's init sets its local step too: one run on the way to the start barrier.
    session.run(self._ops.chief_init_op if self._is_chief else self._ops.local_step_init_op)
    watchdog = threading.Thread(target=self._watch, args=(session, coord), daemon=True,
                                name=f"epochsync-watchdog-{self.task_name}")
    coord.register_thread(watchdog)
    self._threads = [watchdog]
    if self._is_chief:
      self._threads.append(self._aggregation_thread(session, coord, self._loop.generation))
      logging.info("%s aggregating gradients of %d workers", self.task_name, len(self._names))
    for thread in self._threads:
      thread.start()

  def before_run(self, run_context):
    fetches = tf.nest.flatten(run_context.original_args.fetches)
    if not self._train_names.intersection(getattr(f, "name", f) for f in fetches):
      return None
    self._step.start()
    self._ender.step_started(threading.get_ident())
    return self._step_args

  def after_run(self, run_context, run_values) -> None:
    self._step.finish()
    if self._ender.error is not None:  # The step ended on an ABORT token.
      raise self._ender.error

  def end(self, session) -> None:
    """Stops the threads: STOP markers end the aggregation run cleanly.

    The marker queue stays open: the next run on these ps tasks drains what is left in it
    (RunStartHook), which a closed queue would forbid.
    """
    self._stopping.set()
    if self._is_chief:
      blocked_step.run_bounded(session, self._ops.stop_op, self.task_name, _SEND_STOP)
    for thread in self._threads[::-1]:
      thread.join(_JOIN_SECS)
      if thread.is_alive():
        logging.warning("%s: thread %s did not stop within %.0f s", self.task_name, thread.name,
                        _JOIN_SECS)

  def _aggregation_thread(self, session, coord, generation: int) -> threading.Thread:
    # Not registered with `coord`: on an error path its run may wait in a take_grad for a
    # gradient that never comes (its sender died mid-step), and a coordinator join would wait
    # stop_grace_period_secs (120 s) for it before the session could close.
    return threading.Thread(target=self._aggregate, args=(session, coord, generation),
                            daemon=True, name=f"epochsync-aggregation-{generation}")

  def _aggregate(self, session, coord, generation: int = 0) -> None:
    """Chief thread: the aggregation loop; an error stops the session (and this task's step)."""
    try:
      self._loop.run(session, coord.should_stop, generation)
    except Exception as e:  # pylint: disable=broad-except
      if isinstance(e, tf.errors.CancelledError) and (self._stopping.is_set() or
                                                      coord.should_stop()):
        return  # The session was closed under a stopping thread.
      logging.error("%s: the gradient aggregation failed: %s", self.task_name, e)
      if isinstance(e, (tf.errors.UnavailableError, tf.errors.AbortedError)):
        error = explain_lost_session(e, self._liveness, self.task_name,
                                     self._where("while aggregating the gradients"))
      else:
        error = e
      self._stop_now(session, coord, error)  # This task's own step waits for a token.

  def _watch(self, session, coord) -> None:
    """Every task's watchdog thread; it ends with the session (end() or a coordinator stop)."""
    tick = min(0.5, self._step.warn_after_secs / 2, self._step.timeout_secs / 4,
               self._liveness.period_secs / 2 if self._liveness else 0.5)
    read = lambda: session.run(self._ops.diagnostics, options=run_options(_READ_TIMEOUT_SECS))
    rows = lambda: session.run(self._heartbeat_rows, options=run_options(_READ_TIMEOUT_SECS))
    watch: Optional[heartbeat.ProgressWatch] = None
    while not self._stopping.is_set() and not coord.wait_for_stop(tick):
      watch = step_watch.follow_progress(self._step, watch, rows, self._names,
                                         _PROGRESS_AFTER_SECS)
      error = self.check(coord, read)
      if error is not None:  # Ends the step blocked on its token (its run has no deadline).
        self._stop_now(session, coord, error)
      self._check_liveness(session, coord)
      if self._is_chief and self._loop.check_lost(session):  # left behind: go on in another
        self._threads[1] = self._aggregation_thread(session, coord, self._loop.generation)
        self._threads[1].start()
    if not self._stopping.is_set():  # A stop without end(): an error path.
      self._ender.end_if_blocked(session, self._ops.abort_step_op)
      if self._is_chief and blocked_step.run_bounded(session, self._ops.stop_op,
                                                     self.task_name, _SEND_STOP):
        # The session's close joins this thread: the aggregation ends (and says so) first.
        self._threads[1].join(_READ_TIMEOUT_SECS)

  def _check_liveness(self, session, coord) -> None:
    """Once a step has waited a second: probe the tasks it depends on, stop if one died."""
    waited = self._step.waited()
    if self._liveness is None or waited is None or waited < self._liveness.period_secs:
      return
    peers = [n for n in self._names if n != self.task_name]
    peers += [n for n in sorted(self._liveness.addresses) if n.startswith("ps:")]
    try:
      self._liveness.check([n for n in peers if n in self._liveness.addresses],
                           self._where("for its running synchronous step"))
    except TaskDiedError as error:
      self._stop_now(session, coord, error)

  def _where(self, what: str) -> str:
    epoch = self._epoch_fn()
    return what + ("" if epoch is None else f" in epoch {epoch}")

  def _stop_now(self, session, coord, error: Exception) -> None:
    """Stops the session with `error` and ends this task's step (hooks.sync.blocked_step)."""
    self._ender.stop(session, coord, error, self._ops.abort_step_op)

  def check(self, coord, read: Callable[[], Tuple[int, Sequence[int]]]
            ) -> Optional[StepTimeoutError]:
    """Warns about or times out the running step (`hooks.faults.step_watch.warn_or_time_out`)."""
    return step_watch.warn_or_time_out(self._step, coord, read, self._names, self.task_name)
