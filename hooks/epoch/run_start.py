"""Starts every run from clean coordination state, also on ps tasks that outlived an earlier run.

Parameter servers often outlive the job (Kubernetes restarts a failed chief or worker pod, not
the ps pods), so their queues and accumulators may still hold an earlier run's arrivals,
releases, markers, tokens and half-summed gradients. At the start of each run the chief runs
every op in `graph_keys.RESET_OPS`, which drains them, and then writes its own process
incarnation into `epochsync/run_id` on ps:0; every worker waits until it reads the current
chief's incarnation there before it touches a queue or reads a model variable.

A run's workers are fixed at its start: each worker writes its own incarnation into its slot of
`epochsync/run_workers` (zeroed by the chief) when it joins. A worker whose slot already holds
another incarnation is a restarted process (Kubernetes' OnFailure restarts a killed pod at
once) that would otherwise join the running epoch unnoticed and train its shard a second time;
it waits instead, without touching the run, until the chief (which names the restart at its
next wait) ends that run, and then exits so that it is relaunched into the next one. In an
elastic job (hooks.elastic) the run goes on without the earlier process, and the restarted one
rejoins it instead (`rejoin`), at an epoch's start, without the start barrier; so does a spare
worker (`spare`), from its start, once a worker is lost.

Typical usage (epoch_sync_hooks() puts it first):
  start = RunStartHook(config.is_chief, config.worker_names[0], monitor_for(config))
  hooks = [start, sync_hook, done, barrier, epoch_input.hook]
"""

import random
import time
import weakref
from typing import Any, Callable, List, Optional

import tensorflow as tf

from hooks import graph_keys
from hooks import log as logging
from hooks.errors import ConfigError, StartupTimeoutError
from hooks.faults import heartbeat
from hooks.faults.liveness import LivenessMonitor
from hooks.faults.waiting import run_options

__all__ = ["RunStartHook", "check_started", "rejoined_run"]

_v1 = tf.compat.v1
_POLL_SECS = 0.1
# Each graph's RunStartHooks, for check_started(). Not a graph collection: every checkpoint
# save exports the meta graph, which cannot serialize a Python object (TensorFlow warns).
_HOOKS: "weakref.WeakKeyDictionary[tf.Graph, List[RunStartHook]]" = weakref.WeakKeyDictionary()
_RPC_TIMEOUT_SECS = 60.0
# This process in `epochsync/run_workers`: a relaunched task has another one.
_PROCESS_ID = random.SystemRandom().getrandbits(62) + 1


class RunStartHook(_v1.train.SessionRunHook):
  """The chief clears what earlier runs left on the ps; workers wait for that to be done.

  Put it before every other epoch-sync hook (its `after_create_session` must run first).

    start = RunStartHook(config.is_chief, "chief:0", monitor_for(config), task_name="worker:1")
    with tf.compat.v1.train.MonitoredSession(session_creator=creator,
                                             hooks=[start, barrier, epoch_input.hook]) as s:
      while not s.should_stop(): s.run(train_op)

  Args:
    is_chief: `bool`, whether this task is the chief (it resets; the others wait).
    chief_name: `str`, the chief's task name, e.g. "chief:0".
    liveness: the `LivenessMonitor` that tells the chief's incarnation (and if it died).
    task_name: `str`, this task, for messages.
    startup_timeout_secs: `float`, how long a worker waits for the chief's reset.
    ps_device: where `epochsync/run_id` lives.
    worker_id: `int`, this task's index among the chief and workers (0 is the chief); with
      `num_workers`, a restarted worker cannot join its earlier incarnation's run.
    num_workers: `int`, the number of chief and worker tasks.
    rejoin: (elastic) `(session) -> None` once this restarted worker joined the running job,
      or why not yet (it is tried again every 0.1 s while the chief makes progress).
    spare: (elastic, with `rejoin`) this worker is a spare: it joins the running job through
      `rejoin` from its start, in place of a lost worker, instead of starting with the run.
  """

  def __init__(self, is_chief: bool, chief_name: str, liveness: LivenessMonitor,
               task_name: str = "this task", startup_timeout_secs: float = 600.0,
               ps_device: str = "/job:ps/task:0", worker_id: Optional[int] = None,
               num_workers: Optional[int] = None,
               rejoin: Optional[Callable[[Any], Optional[str]]] = None, spare: bool = False):
    self._is_chief, self._chief = bool(is_chief), chief_name
    self._liveness, self._task = liveness, task_name
    self._timeout, self._ps_device = startup_timeout_secs, ps_device
    self._worker_id, self._num_workers = worker_id, num_workers
    self._rejoin = rejoin
    self._spare = bool(spare) and rejoin is not None

  def begin(self) -> None:
    self.started = False  # set once after_create_session has cleaned up (or waited)
    self._join = None  # a worker's (earlier incarnation, write) into its roster slot
    self._refused = False  # an earlier process of this task joined the current run
    self._rejoining = self._spare  # (elastic) it joins the running job (refused, or a spare)
    self.rejoined = False  # (elastic) it joined the running job: no start barrier
    _HOOKS.setdefault(_v1.get_default_graph(), []).append(self)
    with _v1.device(self._ps_device), tf.name_scope("epochsync_run_start"):
      # In no collection: not saved, not restored and not initialised by init_op, so that it
      # keeps the previous run's value until the new chief has cleaned up.
      self._run_id = _v1.Variable(0, dtype=tf.int64, trainable=False, collections=[],
                                  name="epochsync_run_id")
      self._new_run_id = _v1.placeholder(tf.int64, [], "new_run_id")
      self._set_run_id = self._run_id.assign(self._new_run_id)
      # -1 until a chief wrote it: reading it unset would fail the run, which TensorFlow 2.16+
      # logs at WARNING on the ps ("Local rendezvous is aborting ... uninitialized value").
      self._seen_run_id = tf.cond(_v1.is_variable_initialized(self._run_id),
                                  self._run_id.read_value,  # a read inside the branch
                                  lambda: tf.constant(-1, tf.int64))
      if self._num_workers:
        self._build_roster()
    if self._num_workers:  # The chief's row: it beats while it restores (restore_beat).
      self._rows = heartbeat.rows_op(self._num_workers, self._ps_device)

  def _build_roster(self) -> None:
    """`epochsync/run_workers`: each worker's incarnation once it joined the run, else 0."""
    roster = _v1.Variable(tf.zeros([self._num_workers], tf.int64), trainable=False,
                          collections=[], name="epochsync_run_workers")
    with tf.control_dependencies([roster.assign(tf.zeros_like(roster.initial_value))]):
      self._set_run_id = self._run_id.assign(self._new_run_id)  # the roster is clean first
    if self._worker_id is None or self._is_chief:
      return
    self._own_incarnation = _v1.placeholder(tf.int64, [], "own_incarnation")
    earlier = tf.gather(roster, self._worker_id)  # a copy, read before the write below
    with tf.control_dependencies([earlier]):  # an earlier incarnation's slot stays its own
      claim = tf.where(tf.equal(earlier, 0), self._own_incarnation, earlier)
      joined = _v1.scatter_update(roster, [self._worker_id], [claim])
    self._join = (earlier, joined)

  def after_create_session(self, session, coord) -> None:
    self._check_own_address(session)
    incarnation = self._chief_incarnation()
    if self._is_chief:
      start = time.monotonic()
      self._reset = _v1.get_collection(graph_keys.RESET_OPS)  # other hooks' begin() add theirs
      session.run(self._reset, options=run_options(_RPC_TIMEOUT_SECS))
      session.run(self._set_run_id, {self._new_run_id: incarnation},
                  options=run_options(_RPC_TIMEOUT_SECS))
      logging.info("%s started run %x: the ps-side queues and accumulators are clean "
                   "(%d reset ops in %.3f s)", self._task, incarnation, len(self._reset),
                   time.monotonic() - start)
    else:
      self._wait_for_run(session, incarnation)
    self.started = True

  def _check_own_address(self, session) -> None:
    """Refuses to start if another process answers at this task's address (a duplicate index)."""
    if self._task not in self._liveness.addresses:
      return
    job, index = self._task.split(":")
    prefix = f"/job:{job}/replica:0/task:{index}/"
    own = {d.incarnation % 2**64 for d in session.list_devices() if d.name.startswith(prefix)}
    answer = self._liveness.probe([self._task])[self._task]
    if own and answer.state == "up" and answer.incarnation not in own:
      raise ConfigError(
          f"another process answers at {self._liveness.addresses[self._task]}, the address of "
          f"{self._task}: two tasks claim {self._task}; give every task its own index "
          "(TF_CONFIG's task.index, or --task_index)")

  def _chief_incarnation(self) -> int:
    """The chief's incarnation; waits for its server to come up (a worker may start first)."""
    answer = self._liveness.wait_until_up([self._chief], time.monotonic() + self._timeout,
                                          "at the start of the run")[self._chief]
    return int(answer.incarnation) & (2**63 - 1)

  def _wait_for_run(self, session, incarnation: int) -> None:
    """Polls `epochsync/run_id` until the current chief wrote its incarnation there; gives up
    after the startup timeout without progress of the chief (elapsed, without its row)."""
    start, seen = time.monotonic(), None
    watch = self._chief_watch(session)
    while (watch.observe([0]) if watch else time.monotonic() - start) < self._timeout:
      seen = int(session.run(self._seen_run_id, options=run_options(_RPC_TIMEOUT_SECS)))
      seen = None if seen == -1 else seen  # a new ps: not written yet
      if seen == incarnation and self._rejoining:
        if self._rejoined(session):
          return
      elif seen == incarnation and not self._refused and self._joined(session, seen):
        return
      self._liveness.check([self._chief], "for it to start the run")
      logging.log_every_n_seconds(logging.INFO, "%s waiting for %s to start the run", 10,
                                  self._task, self._chief)
      time.sleep(_POLL_SECS)
    waited = f"{self._timeout:g} s" if watch is None else (
        f"{time.monotonic() - start:.0f} s, the last {self._timeout:g} s without progress "
        f"({watch.describe([0])}),")
    if self._refused:
      raise StartupTimeoutError(
          f"{self._task} waited {waited} for {self._chief} to end run {seen:x}, which an "
          f"earlier process of {self._task} had joined: restart the whole job (every task) "
          "from the same model_dir", [self._chief])
    raise StartupTimeoutError(
        f"{self._task} waited {waited} for {self._chief} to start the run (its "
        f"incarnation {incarnation:x} in epochsync/run_id on the ps; found "
        f"{'nothing' if seen is None else f'{seen:x}'}): check its log or raise "
        "--epochsync_startup_timeout_secs", [self._chief])

  def _chief_watch(self, session) -> Optional[heartbeat.ProgressWatch]:
    if not self._num_workers:
      return None
    return heartbeat.ProgressWatch(heartbeat.session_reader(session, self._rows),
                                   [self._chief] + [""] * (self._num_workers - 1))

  def _joined(self, session, run: int) -> bool:
    """Joins the run in the roster; False (logged) if an earlier incarnation joined it."""
    if self._join is None:
      return True
    earlier, _ = session.run(self._join, {self._own_incarnation: _PROCESS_ID},
                             options=run_options(_RPC_TIMEOUT_SECS))
    if earlier in (0, _PROCESS_ID):
      return True
    if self._rejoin is not None:
      self._rejoining = True
      logging.info("%s restarted while %s's run %x is going on: elastic, it rejoins the "
                   "running job", self._task, self._chief, run)
      return False
    self._refused = True  # for good: only the chief's end (a TaskDiedError) ends the wait
    logging.warning(
        "%s restarted while %s's run %x is going on (its earlier process joined that run): "
        "a run's workers are fixed at its start, so it does not join; it waits until %s ends "
        "the run (it names the restart at its next wait) and then exits, to be relaunched "
        "into the next run", self._task, self._chief, run, self._chief)
    return False


  def _rejoined(self, session) -> bool:
    """(Elastic) Tries to join the running job; True once it did."""
    why = self._rejoin(session)
    if why is None:
      self.rejoined = True
      if not getattr(self._rejoin, "finished", False):  # (else: nothing left to join)
        logging.info("%s rejoined the running job of %s", self._task, self._chief)
      return True
    logging.log_every_n_seconds(logging.INFO, "%s waits to rejoin the running job: %s", 10,
                                self._task, why)
    return False


def rejoined_run() -> bool:
  """Whether this graph's worker rejoined a running job (elastic) instead of starting with it."""
  return any(h.rejoined for h in _HOOKS.get(_v1.get_default_graph(), []))


def check_started(what: str) -> None:
  """Raises ConfigError if the graph has a RunStartHook whose after_create_session has not run.

  A hook that uses the ps-side queues calls it first in its own after_create_session:
  `what` (e.g. "SafeSyncTokensHook") must come after the RunStartHook in the hooks list.
  """
  late = [h for h in _HOOKS.get(_v1.get_default_graph(), []) if not h.started]
  if late:
    raise ConfigError(f"{what} runs before the RunStartHook: put the RunStartHook first in the "
                      "hooks list (epoch_sync_hooks() returns it first), or the chief's "
                      "clean-up of the ps-side queues would race with their use")
