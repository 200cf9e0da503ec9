"""A worker's claims of its next unit: one run on ps:0 each, never cancelled, with safe retries.

A claim (hooks.workqueue.queue_graph) is answered once per claim number, so a claim whose answer
was lost (the ps rejected the request as a duplicate, a transient network error) is simply run
again with the same number: the queue answers the unit it handed out before, or hands one out
now, never both. A claim is never cancelled: TensorFlow's lock (tf.CriticalSection) lets two
runs in at once after a run waiting for it is cancelled (docs/reliability.md, "The work queue's
lock"). One without an answer after `attempt_secs` is waited on (ps:0's liveness checked, a
WARNING logged) in its thread. The waits and retries stop at `timeout_secs` with a
ClaimTimeoutError naming the epoch, the worker and ps:0. A claim the queue answers LOST_WRITE
(it holds fewer of the worker's claims than it answered) raises EpochSyncError.

An elastic queue answers WAIT when none is left to hand out while a unit is in flight (its
worker may be lost, and the unit come back): the worker claims again every 0.2 s until a unit
or the epoch's end comes, for up to `timeout_secs` in which no unit ends or comes back. FENCED
(the chief found this worker lost and gave its unit to another) raises WorkerFencedError.

Typical usage (hooks.workqueue.passes does it):
  claims = UnitClaims(ops, worker_id=1, task_name="worker:1", timeout_secs=600)
  unit, skip = claims.claim(session, epoch=0, at_batch=0)       # the epoch's first unit
  unit, skip = claims.claim(session, 0, at_batch=12, finished=(unit, 12, 96))  # next, or -1
(skip: the unit's batches a resumed mid-epoch checkpoint already holds, 0 otherwise)
"""

import random
import time
from typing import NamedTuple, Optional, Tuple

import tensorflow as tf

from hooks import log as logging
from hooks.errors import ClaimTimeoutError, EpochSyncError, WorkerFencedError
from hooks.faults.waiting import RunThread, run_options, run_uncancelled
from hooks.workqueue.elastic_graph import JOINED
from hooks.workqueue.queue_graph import ANY, FENCE_MARK, FENCED, LOST_WRITE, QueueOps, STALE, WAIT

__all__ = ["UnitClaims", "Claim", "fenced_error", "process_identity"]

_ATTEMPT_SECS = 30.0  # How long a claim waits before it checks ps:0 and logs (never cancelled).
_RETRY_PAUSE_SECS = 0.5
_WAIT_POLL_SECS = 0.2  # (elastic) a worker that got WAIT claims again this often
_TRANSIENT = (tf.errors.DeadlineExceededError, tf.errors.UnavailableError,
              tf.errors.AbortedError, tf.errors.CancelledError)


def fenced_error(task_name: str) -> WorkerFencedError:
  """What a worker the chief found lost (and fenced) while it ran raises once it runs again."""
  return WorkerFencedError(
      f"{task_name} was found lost by the chief (elastic training: it stopped answering, or "
      "stalled) and its unit went to another worker; this process ends without training "
      "more. The job goes on without it; relaunch this worker: a relaunched worker rejoins "
      "the running job", task_name)


class Claim(NamedTuple):
  """A claim's answer: the unit (-1: none left) and its batches already trained (a resume)."""
  unit: int
  skip: int


def process_identity() -> tf.Variable:
  """A worker-local int64 variable (0): who this process is in its slot of an elastic queue,
  for the admission of its steps (hooks.workqueue.elastic_graph)."""
  anchor = tf.no_op(name="epochsync_identity_anchor")  # on the worker, not a ps task
  with tf.compat.v1.get_default_graph().colocate_with(anchor):
    return tf.compat.v1.Variable(0, trainable=False, dtype=tf.int64,
                                 name="epochsync_process_identity",
                                 collections=[tf.compat.v1.GraphKeys.LOCAL_VARIABLES])


class UnitClaims:
  """This worker's claims in the current epoch (numbered from 0 per epoch)."""

  def __init__(self, ops: QueueOps, worker_id: int, task_name: str, timeout_secs: float,
               attempt_secs: float = _ATTEMPT_SECS, identity: Optional[tf.Variable] = None,
               take_slot: Optional[tf.Operation] = None):
    self.ops = ops
    self._worker, self.task_name = worker_id, task_name
    self._timeout, self._attempt = timeout_secs, min(attempt_secs, timeout_secs)
    self._epoch, self._seq = None, 0
    self._token = random.SystemRandom().getrandbits(62) + 1  # this process's joins (elastic)
    # (Elastic, asynchronous) who this process is in its slot (`process_identity`): 0, the
    # run's own process, until it joins the running job; its token then. `take_slot` lifts the
    # slot's admission fence once it joined (hooks.workqueue.elastic_graph.take_slot).
    self.identity = identity
    self._set_identity = None if identity is None else identity.assign(self._token)
    self._take_slot = take_slot
    self.liveness = None  # A LivenessMonitor (wiring sets it): a dead ps:0 is named at once.
    self._runs = RunThread(f"epochsync-claims-{worker_id}")  # claims run there, never cancelled
    self.state = ops.state  # The chief's read of the whole queue (hooks.workqueue.audit).
    # (Elastic, synchronous) `(session) -> None` between two claims that answered WAIT: the
    # worker's step without a batch, which keeps the others' steps going (it paces the claims).
    self.while_waiting = None

  @property
  def worker_id(self) -> int:
    return self._worker

  def fenced(self, session) -> bool:
    """(Elastic) Whether the chief found this worker lost and fenced it in the queue."""
    claims = session.run(self.ops.state["claims"], options=run_options(self._attempt))
    return bool(claims[self._worker] <= FENCE_MARK)

  def raise_if_fenced(self, session) -> None:
    """WorkerFencedError if the chief found this worker lost (elastic) and this process did not
    rejoin (hooks.elastic.rejoin): its earlier process had not joined the run yet."""
    if self.fenced(session):
      raise WorkerFencedError(
          f"{self.task_name} was found lost by the chief of this elastic job and its unit went "
          "to another worker, before this process joined the run. The job goes on without it; "
          "relaunch this worker once more: a relaunched worker rejoins the running job",
          self.task_name)

  def join(self, session, epoch: int, spares: int = 0) -> Tuple[int, int]:
    """(Elastic) This relaunched worker's (or spare's) join of the running job at `epoch`, in a
    job of `spares` spare workers: (JOINED, or NOT_FENCED / CLOSED / FULL: try again later; the
    batches of `epoch` its earlier process trained)
    (hooks.workqueue.elastic_graph.MembershipOps)."""
    ops = self.ops.membership
    answer, held = run_uncancelled(session, ops.join, {
        ops.epoch: epoch, ops.worker: self._worker, ops.token: self._token,
        ops.spares: spares}, self._attempt)
    if int(answer) == JOINED and self._set_identity is not None:  # Its steps are the slot's:
      # the join made it the member; now its word admits steps, then this process's.
      session.run(self._take_slot, options=run_options(self._attempt))
      session.run(self._set_identity, options=run_options(self._attempt))
    return int(answer), int(held)

  def claim(self, session, epoch: int, at_batch: int,
            finished: Optional[Tuple[int, int, int]] = None, wanted: int = ANY) -> Claim:
    """Records `finished` (unit, batches, examples) and returns the next unit (-1 if none)
    with its skip; `wanted`: that unit instead of the next (a replay), or NONE."""
    if epoch != self._epoch:
      self._epoch, self._seq = epoch, 0
    answer = self._claim_once(session, epoch, at_batch, finished, wanted)
    progress, since = None, time.monotonic()
    while answer.unit == WAIT:  # Bounded: timeout_secs without progress ends it.
      if answer.skip != progress:
        if progress is None:
          logging.info("%s: no unit left to hand out in epoch %d while units are in flight; "
                       "waiting for them to end (or come back from a lost worker)",
                       self.task_name, epoch)
        progress, since = answer.skip, time.monotonic()
      elif time.monotonic() - since >= self._timeout:
        raise ClaimTimeoutError(
            f"{self.task_name} waited {self._timeout:.0f} s in epoch {epoch} for the units in "
            "flight on other workers to end or come back, and none did: check the other "
            "workers' logs (a stuck worker?), or raise --epochsync_claim_timeout_secs if a "
            "unit takes longer", ["ps:0"])
      if self.while_waiting is None:
        time.sleep(_WAIT_POLL_SECS)
      else:
        self.while_waiting(session)
      answer = self._claim_once(session, epoch, at_batch, None, wanted)
    return answer

  def _claim_once(self, session, epoch: int, at_batch: int,
                  finished: Optional[Tuple[int, int, int]], wanted: int) -> Claim:
    unit, batches, examples = finished if finished else (-1, 0, 0)
    ops = self.ops
    feeds = {ops.epoch: epoch, ops.worker: self._worker, ops.seq: self._seq,
             ops.at_batch: at_batch, ops.finished: unit, ops.finished_batches: batches,
             ops.finished_examples: examples, ops.wanted: wanted}
    answer = self._run(session, feeds, epoch)
    if answer.unit == STALE:
      raise EpochSyncError(
          f"{self.task_name} claimed a unit of epoch {epoch} but the work queue on ps:0 is in a "
          "later epoch: this worker is behind the others (a process from an earlier run?); "
          "restart the whole job")
    if answer.unit == LOST_WRITE:
      raise EpochSyncError(
          f"{self.task_name}'s claim {self._seq} of epoch {epoch}: the work queue on ps:0 holds "
          "fewer of its claims than it answered, so a write to the queue's state was lost. "
          "TensorFlow's lock (tf.CriticalSection) let two runs in at once after a run waiting "
          "for it was cancelled (a task killed while its run waited for the lock): see "
          "docs/reliability.md, \"The work queue's lock\". Units of this epoch may have gone "
          "to two workers: stop the job and relaunch it from the last epoch checkpoint")
    if answer.unit == FENCED:
      raise fenced_error(self.task_name)
    self._seq += 1
    return answer

  def _run(self, session, feeds, epoch: int) -> Claim:
    """The claim's answer. A run is never cancelled (TensorFlow's lock lets two runs in at once
    after a run waiting for it is cancelled): one not answered in `attempt_secs` is waited on
    further, one that failed is claimed again, until `timeout_secs`."""
    started, attempt, call = time.monotonic(), 0, None
    while True:  # Bounded: the waits and the retries stop at timeout_secs.
      if call is None:
        attempt += 1
        call = self._runs.submit(session, self.ops.claim, feeds)
      error = None
      if call.wait(self._attempt):
        try:
          unit, skip = call.result()
          return Claim(int(unit), int(skip))
        except _TRANSIENT as e:
          call, error = None, e
      waited = time.monotonic() - started
      if self.liveness is not None:
        self.liveness.check(["ps:0"], f"for its claim of a unit in epoch {epoch}", force=True)
      last = f"{type(error).__name__}: {error.message}" if error else "no answer yet"
      if waited + _RETRY_PAUSE_SECS >= self._timeout:
        raise ClaimTimeoutError(
            f"{self.task_name} could not claim its next unit of epoch {epoch} from the work "
            f"queue on ps:0 for {waited:.0f} s ({attempt} attempts; the last: {last}); check "
            "ps:0's log and its load", ["ps:0"]) from error
      if error is None:
        logging.warning("%s: claim %d of epoch %d has had no answer from ps:0 for %.1f s; "
                        "waiting on (a claim is never cancelled)", self.task_name,
                        feeds[self.ops.seq], epoch, waited)
        continue
      logging.warning("%s: claim %d of epoch %d got no answer (%s); claiming again (a claim is "
                      "answered once: a retry cannot take a second unit)", self.task_name,
                      feeds[self.ops.seq], epoch, last.splitlines()[0])
      time.sleep(_RETRY_PAUSE_SECS)
