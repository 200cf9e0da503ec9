"""The chief's watch for lost workers (elastic training): the job goes on without them.

Only the chief acts on a worker's death; the other workers never wait for one another. A thread
of the chief probes the other workers (hooks.faults.liveness: 0.2-0.3 ms of CPU each) every
0.1 s, or less often in a job of more than 25 workers (once a second at 250: `probe_period_secs`),
and never more often than keeps its CPU under 5 % of a core (measured each round: about every
1.5 s at 256 workers on this project's machine). A
worker whose server is gone or restarted is lost, and so is one that answered no probe for
`stalled_after_secs` (frozen: SIGSTOP, a long pause, a partition). The chief, in this order:
  1. reclaims its unit: it fences the worker's admission word (its later steps are refused),
     waits until its steps admitted before are done (they wait only for the ps tasks), then, in
     the work queue's critical section, fences its claims (they answer FENCED) and puts its unit
     in flight back at the head of the queue after the batches of it the worker's count holds
     (counted with each apply, or at the batch gate of a plain optimizer:
     hooks.workqueue.elastic_graph); the next claim, by any worker, resumes the unit there. Run
     twice, the second run changes nothing;
  2. arrives for it at every barrier from now on (the barrier's stand_ins) until it rejoins: a
     relaunched process with its task index joins at an epoch whose barrier the chief has not
     arrived at for it (hooks.epoch.run_start; the queue's MembershipOps decide, inside its
     lock); the chief then probes the new process as it did the old;
  3. records the unit's part the lost worker trained, for the audit line (UnitPasses.taken_back).
A WARNING names the worker, why it is lost, its unit and what the model holds of it.

Typical usage (hooks.session.wiring does it on the chief with --epochsync_elastic):
  watch = LostWorkerWatch(queue, barrier, monitor, worker_names=config.worker_names,
                          stalled_after_secs=settings.step_timeout_secs)
  hooks.append(watch)
"""

import threading
import time
from typing import Any, Callable, Optional, Sequence

import tensorflow as tf

from hooks import log as logging
from hooks.faults import step_retry
from hooks.faults.liveness import PERIOD_SECS, LivenessMonitor
from hooks.faults.waiting import run_uncancelled
from hooks.workqueue import elastic_graph
from hooks.workqueue.queue_graph import FENCE_MARK
from hooks.workqueue.unit_passes import UnitPasses

__all__ = ["LostWorkerWatch", "probe_period_secs"]

_v1 = tf.compat.v1
_RUN_TIMEOUT_SECS = 60.0  # the reclaim and the reads wait for nothing but ps:0
_ADMITTED_WAIT_SECS = 5.0  # a fenced worker's admitted steps end within ms (ps tasks only)
_ADMITTED_POLL_SECS = 0.005
_FASTEST_PERIOD_SECS = 0.1
_PROBE_SECS = 0.0002  # one GetStatus RPC on a local network
_PROBE_SHARE = 0.05  # of a core: the watch's CPU at most


def probe_period_secs(num_workers: int) -> float:
  """How often the chief probes `num_workers` workers: 0.1 s, slower past 25 workers, at
  most once a second (liveness's PERIOD_SECS)."""
  return min(PERIOD_SECS, max(_FASTEST_PERIOD_SECS, num_workers * _PROBE_SECS / _PROBE_SHARE))


class LostWorkerWatch(_v1.train.SessionRunHook):
  """The chief's thread that finds lost workers and takes their units back.

  Args:
    queue: the chief's `UnitPasses` (its claims' ops, built with elastic=True).
    barrier: the chief's `EpochBarrierHook`.
    monitor: the process's `LivenessMonitor`.
    worker_names: task names by worker id; id 0, the chief, is never probed.
    stalled_after_secs: `float`, a worker that answers no probe for this long is lost too
      (frozen: SIGSTOP, a long pause, a partition); --epochsync_step_timeout_secs.
    period_secs: `float`, how often the workers are probed (default: `probe_period_secs`).
    on_lost: `(session, worker_id) -> None`, after the reclaim (synchronous: the chief sends
      the marker the lost worker owes; hooks.session.elastic_sync).
    spare_ids: the worker ids of the spares (--epochsync_spare_workers): fenced and arrived for
      from the run's start, as lost ones, until one joins in place of a lost worker. They are
      probed too while they stand by: one whose process is gone is named (WARNING) and not
      counted as standing by until a process answers at its address again.
    num_epochs: the job's epochs (--epochsync_num_epochs): once they are all trained, a worker
      or spare that ends is not lost, and the watch stops.
    optional: the `spare_ids` are optional workers (--epochsync_optional_workers): each joins as
      soon as its process comes up, not in place of a lost worker.
    membership: the queue's MembershipOps to ask at each gather (synchronous: the sync
      optimizer's, which cancels a guest's join no step took in yet); default: the queue's.
    addresses: a job that may grow (--epochsync_max_workers): the `WorkerAddresses` where a
      worker the cluster gives no address wrote its own before it joined; the watch probes it
      there from its join.
  """

  def __init__(self, queue: UnitPasses, barrier, monitor: LivenessMonitor,
               worker_names: Sequence[str], stalled_after_secs: float,
               period_secs: Optional[float] = None,
               on_lost: Optional[Callable[[Any, int], None]] = None, membership: Any = None,
               spare_ids: Sequence[int] = (), num_epochs: Optional[int] = None,
               optional: bool = False, addresses: Any = None):
    self._queue, self._barrier, self._monitor = queue, barrier, monitor
    self._names = list(worker_names)
    self._period = probe_period_secs(len(self._names)) if period_secs is None else period_secs
    self._stalled_after = stalled_after_secs
    self._on_lost, self._own_membership = on_lost, membership
    self._lost: set = set()
    self._spare_ids, self._optional = tuple(spare_ids), optional
    self._spares: set = set()  # of _lost: spares standing by, not lost
    self._gone_spares: set = set()  # of _spares: their process is gone (until one answers)
    self._num_epochs = num_epochs
    self._rejoined: set = set()  # probed as known up: a rejoined process that is down is lost
    self._addresses = addresses  # (a job that may grow) and the workers it gives no address:
    self._unaddressed = frozenset(self._names) - monitor.given
    self._stop = threading.Event()
    self._thread: Optional[threading.Thread] = None

  def begin(self):
    ops = self._queue.claims.ops
    self._reclaim, self._read_epoch = ops.reclaim, ops.state["epoch"]
    self._membership = self._own_membership or ops.membership
    self._read_claims = ops.state["claims"]
    with tf.name_scope("epochsync_lost_workers"):  # each worker's admission fence
      self._fences = [elastic_graph.fence_admissions(ops, i) for i in range(len(self._names))]
      self._in_flight = [elastic_graph.in_flight(ops, i) for i in range(len(self._names))]

  def after_create_session(self, session, coord):
    for worker_id in self._spare_ids:  # Before the start barrier: the chief arrives for them.
      self._lose(session, worker_id, spare=True)
    self._stop.clear()
    self._thread = threading.Thread(target=self._watch, args=(session, coord),
                                    name="epochsync-lost-workers", daemon=True)
    self._thread.start()

  def end(self, session):
    self._stop.set()
    if self._thread is not None:
      self._thread.join(timeout=2 * _RUN_TIMEOUT_SECS)

  def _watch(self, session, coord) -> None:
    """Probes every period until end(); a failed reclaim stops the session with its error.
    The wait after a round is at least its CPU over _PROBE_SHARE: the probes take at most 5 %
    of a core however many workers answer and whatever a probe costs on this machine."""
    wait = self._period
    while not self._stop.wait(wait):  # Bounded by end() (and the process's exit).
      cpu = time.thread_time()
      try:
        self._watch_once(session)
      except Exception as e:  # pylint: disable=broad-except
        logging.error("%s could not take back a lost worker's unit: %s", self._names[0], e)
        coord.request_stop(e)
        return
      wait = max(self._period, (time.thread_time() - cpu) / _PROBE_SHARE)

  def _watch_once(self, session) -> None:
    if self._lost:
      self._rearm_rejoined(session)
    names = [n for n in self._names[1:] if n not in self._lost]
    known_up = [n for n in names if n in self._rejoined]
    dead = self._monitor.dead(names, known_up, stalled_after_secs=self._stalled_after)
    if dead and self._all_epochs_trained(session):
      return
    for name, why in dead:
      self._lose(session, self._names.index(name), why)
    if self._spares:
      self._watch_spares(session)

  def _all_epochs_trained(self, session) -> bool:
    """True once the last epoch's barrier released the workers: they end then, and the watch
    stops (the chief's own end follows)."""
    if self._num_epochs is None or self._barrier.start_epoch(session) < self._num_epochs:
      return False
    if not self._stop.is_set():
      logging.info("%s: every epoch is trained; the workers end and it stops watching them",
                   self._names[0])
    self._stop.set()
    return True

  def _watch_spares(self, session) -> None:
    """A spare standing by whose process is gone (or replaced) stops counting as standing by,
    with a WARNING, until a process answers at its address again (its relaunch)."""
    gone = sorted(self._gone_spares)
    if gone:
      self._monitor.probe(gone)  # An answer records the new process's incarnation.
      for name in sorted(set(gone) - set(self._monitor.never_answered(gone))):
        self._gone_spares.discard(name)
        logging.info("%s: a new process of %s, %s, answers; it %s again", self._names[0],
                     name, *(("an optional worker", "joins") if self._optional else
                             ("a spare", "stands by")))
    standing = sorted(n for n in self._spares - self._gone_spares if n in self._monitor.addresses)
    dead = self._monitor.dead(standing)
    if dead and self._all_epochs_trained(session):
      return
    for name, why in dead:
      self._monitor.forget(name)  # Its next answer is a new process's.
      self._gone_spares.add(name)
      what, until = (("an optional worker not joined yet", "it joins when") if self._optional
                     else ("a spare standing by", "the job has no spare in its place until"))
      logging.warning("%s, %s, is gone (%s); %s a process of %s answers again (relaunch it)",
                      name, what, why, until, name)

  def _rearm_rejoined(self, session) -> None:
    """Lost workers whose fence a relaunched process lifted (it joined): probed again."""
    claims = self._run(session, self._read_claims, None, "the read of the queue")
    for name in sorted(self._lost):
      if claims[self._names.index(name)] > FENCE_MARK and self._learn_address(session, name):
        self._monitor.forget(name)
        self._lost.discard(name)
        self._rejoined.add(name)
        logging.info("%s: %s %s the job (%s); watching it", self._names[0], name,
                     *(("joined", "an optional worker, up after the job's start")
                       if name in self._spares and self._optional else
                       ("joined", "a spare, in place of a lost worker") if name in self._spares
                       else ("rejoined", "a relaunched process")))
        self._spares.discard(name)
        self._gone_spares.discard(name)

  def _learn_address(self, session, name: str) -> bool:
    """False while a joined worker the cluster gives no address has not written one (it
    writes it before its join: never, unless a process of an older tf-epochsync joined)."""
    if name not in self._unaddressed or self._addresses is None:
      return True
    address = self._addresses.read(session, self._names.index(name))
    if address:
      self._monitor.learn_address(name, address)
      logging.info("%s: %s, beyond the launch's cluster, listens at %s", self._names[0], name,
                   address)
    return bool(address)

  def _run(self, session, fetches, feeds, what: str):
    return step_retry.run_rerunnable(
        lambda: run_uncancelled(session, fetches, feeds, _RUN_TIMEOUT_SECS),
        what, self._names[0])

  def _still_lost(self, session, worker_id: int, epoch: int) -> Optional[int]:
    """Its batches of `epoch` in the model while the chief arrives for it, else None."""
    ops = self._membership
    lost, held = self._run(session, ops.still_lost, {ops.epoch: epoch, ops.worker: worker_id},
                           "the check of a lost worker")
    return int(held) if lost else None

  def _fence_admissions(self, session, worker_id: int, what: str) -> None:
    """Fences the worker's steps (an ElasticOptimizer's: none is admitted after this) and
    waits until those admitted before are done: they wait only for the ps tasks, so the count
    the reclaim reads then holds every batch applied, and nothing applied is handed out again.
    Bounded: a step the worker's death cancelled in its apply never gets done; after
    _ADMITTED_WAIT_SECS the reclaim goes on (that batch, in the model in part or not at all,
    is trained again)."""
    pending = int(self._run(session, self._fences[worker_id], None, what))
    deadline = time.monotonic() + _ADMITTED_WAIT_SECS
    while pending > 0 and time.monotonic() < deadline:
      time.sleep(_ADMITTED_POLL_SECS)
      pending = int(self._run(session, self._in_flight[worker_id], None, what))
    if pending > 0:
      logging.info("%s: %d step(s) of %s admitted before its fence never ended (cancelled by "
                   "its death inside the apply); its unit goes back after the batches counted",
                   self._names[0], pending, self._names[worker_id])

  def _lose(self, session, worker_id: int, why: str = "", spare: bool = False) -> None:
    """Fences the worker, takes its unit back and arrives for it from now on; `spare`: it is a
    spare standing by (at the run's start), not lost."""
    name = self._names[worker_id]
    self._lost.add(name)
    if spare:
      self._spares.add(name)
    self._rejoined.discard(name)
    what = f"the reclaim of {name}'s unit"
    epoch = int(self._run(session, self._read_epoch, None, what))
    ops = self._reclaim
    self._fence_admissions(session, worker_id, what)
    unit, skip, old_skip, held = (int(x) for x in self._run(
        session, ops.result, {ops.epoch: epoch, ops.worker: worker_id}, what))
    if unit >= 0:
      self._queue.take_back(epoch, unit, worker_id, skip - old_skip)
    if self._on_lost is not None:  # (synchronous) the marker the fenced worker owes
      self._on_lost(session, worker_id)
    self._barrier.stand_ins.lose(session, worker_id, epoch, held, self._still_lost, spare)
    if spare:
      logging.info("%s is %s; %s arrives for it at every barrier until then", name,
                   "optional: the job starts without it, and it joins the running job once its "
                   "process comes up" if self._optional else
                   "a spare: it stands by until a worker is lost", self._names[0])
      return
    left = len(self._names) - 1 - len(self._lost)
    standing_by = [] if self._optional else sorted(self._spares - self._gone_spares)
    what = (f"its unit {unit} ({self._queue.units[unit]}) goes back to the queue after the "
            f"{skip} batches of it the model holds" if unit >= 0 else "it held no unit")
    logging.warning("%s is lost in epoch %d (%s); elastic: %s, and the job goes on with %s and "
                    "%d other worker(s)%s", name, epoch, why, what, self._names[0], left,
                    f"; a spare standing by ({', '.join(standing_by)}) joins in its place"
                    if standing_by else "")
