"""Retries a step that TensorFlow rejected as a duplicate RunGraph request.

TensorFlow gives every RunGraph request of a step an id from a thread-local random generator
seeded with 32 random bits, and the master runs each step on a new thread, so the ids of a
step repeat those of an earlier step once in ~10^5 runs (a birthday collision of the seeds);
each task rejects a request id it saw among its last 100,000 with ABORTED "The same RunGraph
(Worker) request was received twice", before running anything of that partition. A step is
run again when every task that rejected it is this task (its own partition: nothing of the
step ran here, and the ps partitions wait for its gradients) or a task of
`graph_keys.GATED_TASKS` (EpochInput made every stateful op of the step wait for that task's
partition: hooks.data.step_gate). Any other rejection is left to the recovery guard, which
names it. A step whose rejection TensorFlow never reported (its run lost, found by the
StuckStepWatchdog: LostRunError) runs again too.

Typical usage (RecoveryGuardHook.after_create_session does it):
  retry_duplicate_steps(session, "worker:1")
"""

import contextlib
import re
import sys
from typing import Any, Callable, Iterable, Optional, Set

import tensorflow as tf

from hooks import graph_keys
from hooks import log as logging
from hooks.errors import FENCED_MARK, WorkerFencedError
from hooks.faults import step_runner
from hooks.faults.stuck_step import LostRunError, StuckStepWatchdog

__all__ = ["retry_duplicate_steps", "run_retrying", "run_rerunnable", "rejecting_tasks",
           "rejected_by_own_task", "step_retryable", "run_retryable", "MAX_RETRIES"]

MAX_RETRIES = 3
# The step's error: ABORTED, or CANCELLED when another partition's cancellation is reported first.
_REPORTED_AS = (tf.errors.AbortedError, tf.errors.CancelledError)
_REJECTED = re.compile(r"From /job:([\w-]+)/replica:\d+/task:(\d+):\s*The same RunGraph "
                       r"\(Worker\) request was received twice")
_MONITORED = "monitored_session.py"  # a step: session.run called by MonitoredSession itself


def rejecting_tasks(error: Exception) -> Set[str]:
  """The tasks ("ps:0", "worker:1") that `error` says rejected a RunGraph as a duplicate."""
  if not isinstance(error, _REPORTED_AS):
    return set()
  return {f"{job}:{index}" for job, index in _REJECTED.findall(
      getattr(error, "message", str(error)))}


def rejected_by_own_task(error: Exception, task_name: str) -> bool:
  """Whether `error` says `task_name`'s own partition rejected its RunGraph as a duplicate."""
  return task_name in rejecting_tasks(error)


def step_retryable(error: Exception, task_name: str, gated: Iterable[str]) -> bool:
  """Whether a training step that failed with `error` ran none of its stateful ops: only this
  task (its input read never ran; the ps ops wait for it) or gated tasks (the input read waits
  for each: hooks.data.step_gate) rejected it."""
  tasks = rejecting_tasks(error)
  return bool(tasks) and tasks <= {task_name, *gated}


def run_retryable(error: Exception, task_name: str) -> bool:
  """Whether a hook's run (or the aggregation) that failed with `error` ran none of its
  stateful ops: a ps rejected it. Such runs keep their stateful ops on the ps and, on several
  ps tasks, either set what they set again (a save, a reset) or wait for every ps (the
  aggregation's markers); rejected by this task alone, the ps part ran and only the result
  was lost."""
  return bool(rejecting_tasks(error) - {task_name})


def run_retrying(fn: Callable[[], Any], what: str, task_name: str,
                 retryable: Callable[[Exception], bool]) -> Any:
  """fn(), run again (up to MAX_RETRIES times, each with a WARNING naming `what` and the
  rejecting tasks) while it fails `retryable`; other errors pass through.

    grads = run_retrying(aggregate, "the aggregation run", "worker:0",
                         lambda e: run_retryable(e, "worker:0"))
  """
  for attempt in range(MAX_RETRIES + 1):
    try:
      return fn()
    except _REPORTED_AS as e:
      if attempt == MAX_RETRIES or not retryable(e):
        raise
      if isinstance(e, LostRunError):
        continue  # the watchdog that left the run behind said so at WARNING
      logging.warning(
          "%s: %s was rejected by %s as a duplicate RunGraph request (TensorFlow drew the "
          "request ids of an earlier run); none of its stateful ops ran, so it runs again "
          "(retry %d of %d). The error: %s", task_name, what,
          ", ".join(sorted(rejecting_tasks(e))), attempt + 1, MAX_RETRIES,
          getattr(e, "message", e))
  raise AssertionError("unreachable")


def run_rerunnable(fn: Callable[[], Any], what: str, task_name: str) -> Any:
  """fn(), a run whose stateful ops may run twice with the same effect (a checkpoint save to one
  path, an assign of fed values) or are all on this task: run again when any task rejected it
  as a duplicate request (the session's own retry takes only a ps's rejection).

    path = run_rerunnable(lambda: saver.save(session, prefix), "the epoch save", "worker:0")
  """
  return run_retrying(fn, what, task_name, lambda e: bool(rejecting_tasks(e)))


def retry_duplicate_steps(session, task_name: str, watchdog: Optional[StuckStepWatchdog] = None) -> None:
  """Wraps `session.run` (this session object only): a run TensorFlow rejected as a duplicate
  is logged at WARNING and run again (`run_retrying`) when nothing stateful of it ran: a
  MonitoredSession step by `step_retryable`, any other run by `run_retryable`. Every other
  error passes through unchanged. A `watchdog` (hooks.faults.stuck_step) watches each step's
  run, retries included: the step runs on its runner thread, and a run it leaves behind as
  lost runs again. `session.close` then leaves the session open: it would wait for ever for
  the runs left behind."""
  run = session.run
  if getattr(run, "_epochsync_retrying", False):
    return
  _close_unless_runs_left_behind(session, task_name)
  graph = getattr(session, "graph", None) or tf.compat.v1.get_default_graph()
  gated = tuple(graph.get_collection(graph_keys.GATED_TASKS))
  steps = [0]

  def run_step(*args, **kwargs):
    step = sys._getframe(1).f_code.co_filename.endswith(_MONITORED)  # pylint: disable=protected-access
    if not step:  # A hook's or its thread's run.
      return run_retrying(lambda: run(*args, **kwargs), "a run of a hook", task_name,
                          lambda e: run_retryable(e, task_name))
    steps[0] += 1
    call = ((lambda: watchdog.run(lambda: run(*args, **kwargs))) if watchdog else
            (lambda: run(*args, **kwargs)))
    with watchdog.step(_kind(args, kwargs)) if watchdog else contextlib.nullcontext():
      try:
        return run_retrying(call, f"step {steps[0]} of this task", task_name,
                            lambda e: isinstance(e, LostRunError) or
                            step_retryable(e, task_name, gated))
      except tf.errors.InvalidArgumentError as e:
        _raise_if_fenced(e, task_name)
        raise

  run_step._epochsync_retrying = True  # pylint: disable=protected-access
  session.run = run_step


def _raise_if_fenced(error: tf.errors.OpError, task_name: str) -> None:
  """WorkerFencedError if `error` is the elastic work queue's gate refusing this worker's step
  (hooks.workqueue.elastic_graph.gate): nothing of the step reached the model."""
  if FENCED_MARK in (error.message or ""):
    raise WorkerFencedError(
        f"{task_name} was found lost by the chief of this elastic job (it stopped answering, or "
        "stalled: SIGSTOP, a long pause, a partition) and its unit went to another worker; "
        "this step was refused before its batch reached the model, and the process ends "
        "without training more. The job goes on without it; relaunch this worker: a relaunched "
        "worker rejoins the running job", task_name) from error


def _close_unless_runs_left_behind(session, task_name: str) -> None:
  """Wraps `session.close`: with runs left behind as lost (step_runner.leave_behind), closing
  would wait for them."""
  close = getattr(session, "close", None)
  if close is None:
    return

  def close_unless_runs_left_behind():
    left = step_runner.runs_left_behind(session)
    if not left:
      return close()
    logging.info("%s leaves its session open: %d lost run(s) left behind are still blocked in "
                 "TensorFlow, and closing the session would wait for them for ever; the process "
                 "ends without it", task_name, left)
    return None

  session.close = close_unless_runs_left_behind


def _kind(args, kwargs) -> tuple:
  """The names of a run's fetches and feeds: runs of one kind share their registered graph."""
  fetches = args[0] if args else kwargs.get("fetches")
  feeds = (args[1] if len(args) > 1 else kwargs.get("feed_dict")) or {}
  return _names(fetches), _names(list(feeds))


def _names(fetches) -> tuple:
  """The tensor and op names in `fetches` (MonitoredSession's dict is keyed by hook objects)."""
  if isinstance(fetches, dict):
    return tuple(_names(v) for v in fetches.values())
  if isinstance(fetches, (list, tuple)):
    return tuple(_names(v) for v in fetches)
  if isinstance(fetches, tf.SparseTensor):
    return (fetches.indices.name,)
  return (getattr(fetches, "name", type(fetches).__name__),)
