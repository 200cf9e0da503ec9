"""A worker's side of the epoch barrier: its arrival, and its wait for the chief's release.

One run enqueues the worker's arrival (never blocks) and dequeues its own release, in a thread
of its own (`hooks.faults.waiting.BackgroundRun`) while the waiting task logs who is missing
and enforces the barrier's deadline (hooks.epoch.barrier_wait). An elastic worker that
rejoined passes over the releases of the barriers the chief arrived at for it while it was
lost (hooks.epoch.stand_ins), and counts its first epoch on from its earlier process's batches
(`rejoined_at`, hooks.elastic.rejoin).

Typical usage (EpochBarrierHook, on every worker but the chief):
  release = ReleaseWait("worker:1", "worker:0", waiter, liveness, wait_fn, missing_fn)
  release.arrive(session, wait, arrive_and_wait_op, feed_dict, next_release_op)
"""

from typing import Callable, List, Optional, Tuple

import tensorflow as tf

from hooks import log as logging
from hooks.epoch import arrivals as arrivals_lib
from hooks.epoch.barrier_wait import BarrierWaiter, Wait
from hooks.faults.liveness import LivenessMonitor, explain_lost_session
from hooks.faults.waiting import MAX_WAIT_SECS, BackgroundRun

__all__ = ["ReleaseWait", "ABORT", "result_of"]

ABORT = -1  # a release carrying this value means the chief gave up waiting


class ReleaseWait:
  """Worker `task_name`'s arrival and wait at a barrier gathered by `chief`.

  Args:
    task_name, chief: this worker's and the chief's task names, for messages.
    waiter: the barrier's `BarrierWaiter` (its logs, its deadline, its failure).
    liveness: the process's `LivenessMonitor`, or None.
    wait_fn: `(session, BackgroundRun, Wait) -> bool`, the barrier's wait (False: timed out).
    missing_fn: `(session, seq) -> names`, the workers that have not arrived yet.
  """

  def __init__(self, task_name: str, chief: str, waiter: BarrierWaiter,
               liveness: Optional[LivenessMonitor],
               wait_fn: Callable[[object, BackgroundRun, Wait], bool],
               missing_fn: Callable[[object, int], Optional[List[str]]]):
    self._task, self._chief, self._waiter, self._liveness = task_name, chief, waiter, liveness
    self._wait, self._missing = wait_fn, missing_fn
    self._rejoined: Optional[Tuple[int, int]] = None  # (the epoch it joined, the batches held)

  def rejoined_at(self, epoch: int, held: int) -> None:
    """(Elastic; a relaunched worker) It joined the running `epoch`: its count goes on from the
    `held` batches its earlier process trained, and its arrival's examples are unknown (-1),
    as a stand-in's."""
    self._rejoined = (epoch, held)

  def batches_before(self, epoch: int) -> Optional[int]:
    """The batches of `epoch` its earlier process trained, if it rejoined at `epoch`."""
    return self._rejoined[1] if self._rejoined and self._rejoined[0] == epoch else None

  def arrived_at_end(self, session, epoch: int) -> bool:
    """Whether this worker (an earlier process of it) arrived at `epoch`'s end (True if the ps
    did not answer: the caller asks again)."""
    missing = self._missing(session, 2 * epoch + 1)
    return missing is None or self._task not in missing

  def epoch_under_way(self, session, epoch: int) -> bool:
    """Whether `epoch` is under way: every worker arrived at its start barrier (the chief for
    those not up, this one included), or, past epoch 0, at the previous epoch's end (the run
    started earlier; each run's start resets the arrivals to -1). A worker that joined the
    run's first epoch before every arrival at its start would train it and arrive at its end
    while the chief still gathers the start. False if the ps did not answer."""
    at_start = self._missing(session, 2 * epoch)
    if not at_start or epoch == 0:
      return at_start is not None and not at_start
    before = self._missing(session, 2 * epoch - 1)
    return before is not None and not before

  def arrive(self, session, wait: Wait, arrive_and_wait, feed_dict, next_release) -> None:
    """One run enqueues the arrival and dequeues the release; returns once released."""
    got = self._released(session, wait, arrive_and_wait, feed_dict)
    while 0 <= got < wait.seq:  # Bounded: the releases queued before this arrival.
      logging.info("%s: passes over the release of barrier %d, which the chief arrived at for "
                   "this worker while it was lost", self._task, got)
      got = self._released(session, wait, next_release, None)
    if got == wait.seq:
      return
    if got == ABORT:
      if self._liveness:  # The chief may have given up because a task died: name it.
        self._liveness.raise_if_any_died(wait.where)
      self._waiter.fail(wait, self._missing(session, wait.seq), "the chief gave up: ")
    raise arrivals_lib.bad_release(got, wait, self._task, self._chief)

  def _released(self, session, wait: Wait, fetch, feed_dict) -> int:
    """The release value `fetch` dequeues, waited for up to the barrier's deadline."""
    # The chief aborts at its own deadline at the latest; its abort needs a moment to arrive.
    call = BackgroundRun(session, fetch, wait.deadline + self._waiter.abort_grace_secs,
                         feed_dict=feed_dict, name=f"epochsync-barrier-{wait.barrier}",
                         run_timeout_secs=MAX_WAIT_SECS)
    if not self._wait(session, call, wait):
      self._waiter.fail(wait, self._missing(session, wait.seq))
    return result_of(call, wait, self._liveness, self._task)


def result_of(call: BackgroundRun, wait: Wait, liveness: Optional[LivenessMonitor],
              task_name: str):
  """The call's value; a lost session (UNAVAILABLE, ABORTED) becomes an error of ours."""
  try:
    return call.result()
  except (tf.errors.UnavailableError, tf.errors.AbortedError) as e:
    raise explain_lost_session(e, liveness, task_name, wait.where) from e
