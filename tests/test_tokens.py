"""SafeSyncTokensHook: validation, bounded steps that name the missing workers, no hang on a death."""

import logging as std_logging
import os
import re
import sys

import numpy as np
import time

import pytest

from hooks.errors import ConfigError, StepTimeoutError
from hooks.testing.local_cluster import LocalCluster
from hooks.faults.waiting import MAX_WAIT_SECS

TASK = [sys.executable, os.path.join(os.path.dirname(__file__), "tasks", "sync_linear.py")]


class _Clock:
  def __init__(self, now: float = 100.0):
    self.now = now

  def __call__(self) -> float:
    return self.now


class _Coord:
  def __init__(self):
    self.requests = []

  def request_stop(self, ex=None):
    self.requests.append(ex)


class _Reader:
  """Stands in for the (global_step, progress) read on the ps; counts calls."""

  def __init__(self, step, progress, error=None):
    self.value, self.error, self.calls = (step, np.array(progress)), error, 0

  def __call__(self):
    self.calls += 1
    if self.error is not None:
      raise self.error
    return self.value


def _hook(clock=None, worker_id=1, build=True, **kwargs):
  """(hook, optimizer) for worker `worker_id` of 3, in a fresh graph; begin() already called."""
  import tensorflow as tf
  from hooks.sync.optimizer import WorkerDoneSyncReplicasOptimizer
  graph = tf.Graph()
  with graph.as_default():
    opt = WorkerDoneSyncReplicasOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1), 3,
                                          worker_id)
    if build:
      w = tf.compat.v1.get_variable("w", [2], initializer=tf.compat.v1.zeros_initializer())
      opt.minimize(tf.reduce_sum(w * w), tf.compat.v1.train.get_or_create_global_step())
    kwargs = dict(dict(num_tokens=0, step_timeout_secs=30, warn_after_secs=10, log_every_secs=5),
                  **kwargs)
    hook = opt.make_session_run_hook(False, clock=clock or _Clock(), **kwargs)
    if build:
      hook.begin()
  return hook, opt


class _AbortSession:
  """A session whose ABORT-token run succeeds or, as with a frozen ps, fails at its deadline."""

  def __init__(self, ps_answers: bool):
    self.ps_answers, self.runs = ps_answers, []

  def run(self, fetches, options=None):
    import tensorflow as tf
    self.runs.append(fetches)
    if not self.ps_answers:
      raise tf.errors.DeadlineExceededError(None, None, "Timed out waiting for notification")


@pytest.mark.parametrize("ps_answers", [True, False])
def test_a_stop_whose_abort_token_cannot_be_delivered_ends_the_process(monkeypatch, ps_answers):
  """A frozen ps cannot take the ABORT token that ends the blocked step (whose run has only a
  7-day backstop): the process then ends itself 10 s later instead of hanging."""
  from hooks.faults import process_exit
  exits = []
  monkeypatch.setattr(process_exit, "exit_after", exits.append)
  hook, opt = _hook()
  session, coord = _AbortSession(ps_answers), _Coord()
  error = StepTimeoutError("step 3 timed out after 30 s on worker:1: ...", ["worker:0"])
  hook._stop_now(session, coord, error)  # pylint: disable=protected-access
  assert session.runs == [opt.sync_ops.abort_step_op] and coord.requests[0][1] is error
  assert exits == ([] if ps_answers else [10.0])


def test_a_step_that_does_not_end_on_its_abort_token_ends_the_process(monkeypatch, caplog):
  """A run TensorFlow rejected on one partition and never cancelled on another waits forever."""
  import threading
  from hooks.faults import process_exit
  from hooks.sync import blocked_step
  monkeypatch.setattr(blocked_step, "EXIT_GRACE_SECS", 0.5)
  exits, release, started = [], threading.Event(), threading.Event()
  monkeypatch.setattr(process_exit, "exit_process", exits.append)
  hook, opt = _hook()

  def _call_tf_sessionrun():  # the name TensorFlow's blocked session.run has on the stack
    _start_step(hook, opt.sync_ops.train_op)  # in this thread: the step's thread
    started.set()
    release.wait(10)

  stuck = threading.Thread(target=_call_tf_sessionrun, daemon=True)
  stuck.start()
  started.wait(5)
  error = StepTimeoutError("step 3 timed out after 30 s on worker:1: ...", ["worker:1"])
  hook._stop_now(_AbortSession(True), _Coord(), error)  # pylint: disable=protected-access
  deadline = time.monotonic() + 5
  while not exits and time.monotonic() < deadline:
    time.sleep(0.05)
  release.set()
  assert exits == [1]
  assert "the step did not end on its ABORT token" in caplog.text
  # A step that ends in time (after_run) keeps the process.
  exits.clear()
  release.clear()
  stuck = threading.Thread(target=_call_tf_sessionrun, daemon=True)
  started.clear()
  stuck.start()
  started.wait(5)
  hook._stop_now(_AbortSession(True), _Coord(), error)  # pylint: disable=protected-access
  hook._step.finish()  # pylint: disable=protected-access
  time.sleep(1.0)
  release.set()
  assert not exits


def _start_step(hook, fetches):
  import tensorflow as tf
  v1 = tf.compat.v1
  return hook.before_run(v1.train.SessionRunContext(v1.train.SessionRunArgs(fetches), None))


class TestSafeSyncTokensHook:

  def test_exports(self):
    from hooks.sync import tokens
    assert tokens.__all__ == ["SafeSyncTokensHook"]

  @pytest.mark.parametrize("num_tokens", [-1, 2])
  def test_num_tokens_must_be_zero(self, num_tokens):
    with pytest.raises(ConfigError, match=rf"num_tokens={num_tokens} is not supported: it must be "
                                          r"0\..*issue 11753.*make_session_run_hook\(is_chief, "
                                          r"num_tokens=0\)"):
      _hook(num_tokens=num_tokens, build=False)

  @pytest.mark.parametrize("name, value", [("step_timeout_secs", 0), ("warn_after_secs", -1),
                                           ("log_every_secs", float("nan"))])
  def test_durations_must_be_positive(self, name, value):
    with pytest.raises(ConfigError, match=rf"{name}={value!r} must be a finite number of seconds"):
      _hook(build=False, **{name: value})

  def test_warning_after_the_timeout_is_itself_a_warning(self):
    with pytest.warns(UserWarning, match=r"warn_after_secs=30 >= step_timeout_secs=30") as record:
      _hook(build=False, warn_after_secs=30)
    assert len(record) == 1 and "a stuck step fails before any warning" in str(record[0].message)

  def test_begin_before_apply_gradients_says_what_to_call(self):
    hook, _ = _hook(build=False)
    with pytest.raises(ConfigError, match=r"call opt.minimize\(\) or opt.apply_gradients"):
      hook.begin()

  def test_only_train_steps_get_a_run_deadline(self):
    hook, opt = _hook()
    args = _start_step(hook, {"loss": "x:0", "train": [opt.sync_ops.train_op]})
    # The watchdog bounds the step (by progress) and ends it; the run's deadline backs it up.
    assert args.options.timeout_in_ms == MAX_WAIT_SECS * 1000
    assert _start_step(hook, opt.sync_ops.completed_epochs) is None

  def test_warns_after_warn_after_secs_then_every_log_every_secs(self, caplog):
    clock, coord, read = _Clock(), _Coord(), _Reader(41, [41, 41, 40])
    hook, opt = _hook(clock)
    _start_step(hook, opt.sync_ops.train_op)
    caplog.set_level(std_logging.WARNING)
    for now, reads in ((109.9, 0), (110, 1), (114.9, 1), (115, 2)):
      clock.now = now
      hook.check(coord, read)
      assert read.calls == reads, now
    warnings = [r.getMessage() for r in caplog.records if r.levelno == std_logging.WARNING]
    assert warnings == ["worker:1 has waited 10 s for step 41: 2/3 workers sent their gradient; "
                        "missing worker:2 (check its log or raise --epochsync_step_timeout_secs)",
                        "worker:1 has waited 15 s for step 41: 2/3 workers sent their gradient; "
                        "missing worker:2 (check its log or raise --epochsync_step_timeout_secs)"]
    assert not coord.requests

  def test_times_out_once_with_the_missing_workers_named(self):
    clock, coord, read = _Clock(), _Coord(), _Reader(41, [41, 40, 40])
    hook, opt = _hook(clock, worker_id=0)
    _start_step(hook, opt.sync_ops.train_op)
    clock.now = 129.9
    hook.check(coord, read)
    assert not coord.requests  # One side of the boundary...
    clock.now = 130
    hook.check(coord, read)  # ...and the other.
    clock.now = 200
    hook.check(coord, read)
    assert len(coord.requests) == 1
    error_type, error, _ = coord.requests[0]
    assert error_type is StepTimeoutError and error.missing == ("worker:1", "worker:2")
    assert str(error) == ("step 41 timed out after 30 s on worker:0: 1/3 workers sent their "
                          "gradient; missing worker:1, worker:2 (check their logs or raise "
                          "--epochsync_step_timeout_secs)")

  def test_done_workers_are_not_missing_and_a_silent_chief_is_named(self):
    clock, coord = _Clock(), _Coord()
    hook, opt = _hook(clock)
    _start_step(hook, opt.sync_ops.train_op)
    clock.now = 130
    hook.check(coord, _Reader(7, [7, 7, -1]))  # worker:2 is done for the epoch.
    error = coord.requests[0][1]
    assert error.missing == () and re.search(
        r"all 2 active workers sent their gradient but no token came; check the aggregation in "
        r"worker:0's log", str(error))

  def test_a_stale_sender_is_told_to_run_the_epoch_start_ops(self):
    clock, coord = _Clock(), _Coord()
    hook, opt = _hook(clock)
    _start_step(hook, opt.sync_ops.train_op)
    clock.now = 130
    hook.check(coord, _Reader(7, [7, 4, 6]))  # worker:1 sent step 4's; worker:2 is just late.
    assert str(coord.requests[0][1]) == (
        "step 7 timed out after 30 s on worker:1: 1/3 workers sent their gradient; missing "
        "worker:2 (check its log or raise --epochsync_step_timeout_secs); stale gradient from "
        "worker:1 (local_step 4 < 7: every worker must run EPOCH_START_OPS at each epoch start)")

  def test_unreadable_progress_still_times_out(self):
    import tensorflow as tf
    clock, coord = _Clock(), _Coord()
    hook, opt = _hook(clock)
    _start_step(hook, opt.sync_ops.train_op)
    clock.now = 131
    hook.check(coord, _Reader(0, [], tf.errors.UnavailableError(None, None, "ps:0 is gone")))
    assert re.fullmatch(r"step \? timed out after 31 s on worker:1: could not read the workers' "
                        r"progress from the ps \(ps:0 is gone\).*", str(coord.requests[0][1]))

  def test_a_finished_step_never_times_out(self):
    clock, coord, read = _Clock(), _Coord(), _Reader(41, [41, 41, 40])
    hook, opt = _hook(clock)
    _start_step(hook, opt.sync_ops.train_op)
    hook.after_run(None, None)
    clock.now = 1000
    hook.check(coord, read)
    assert not coord.requests and read.calls == 0

  def test_the_chief_logs_each_aggregated_epoch_with_its_number(self, caplog):
    """The epoch count is advanced and read in one run (count_epoch_op returns the new count):
    a read in a run of its own could see a count that another run advanced meanwhile."""
    import tensorflow as tf
    hook, opt = _hook(worker_id=0)
    session = _AggregationSession(opt.sync_ops, [3, 3, 0, 3, 0, 2, 0, -1])
    for logger in ("tensorflow", "absl", None):  # hooks.log's verbosity, whatever ran before
      caplog.set_level(std_logging.INFO, logger=logger)
    hook._aggregate(session, tf.compat.v1.train.Coordinator())  # pylint: disable=protected-access
    assert [r.getMessage() for r in caplog.records if "aggregat" in r.getMessage()] == [
        "worker:0: epoch 0 aggregated in 2 synchronous steps",
        "worker:0: epoch 1 aggregated in 1 synchronous steps",
        "worker:0: epoch 2 aggregated in 1 synchronous steps",
        "worker:0: aggregation stopped after 4 updates"]
    assert session.runs == 3  # One run per epoch end: the count is advanced and read at once.


class _AggregationSession:
  """The chief's session as its aggregation thread uses it: each aggregation returns the next
  scripted number of GRAD markers (0: the epoch is over, < 0: stopped). count_epoch_op advances
  the epoch count and returns the new count; any other fetch (a separate read of the count,
  which another run could see half-advanced) but the count of aggregations begun is refused."""

  def __init__(self, sync_ops, grads):
    self.ops, self.grads, self.completed, self.runs = sync_ops, iter(grads), 0, 0
    self.last = None

  def make_callable(self, fetch):
    if fetch is self.ops.aggregate_and_store_op:  # a run on the ps: stores, returns nothing
      return lambda: setattr(self, "last", next(self.grads))
    assert fetch is self.ops.last_aggregate, fetch
    return lambda: self.last

  def run(self, fetches, options=None):
    if fetches is self.ops.aggregations_begun:  # read once: the base to find a lost run by
      return 0
    self.runs += 1
    assert fetches is self.ops.count_epoch_op, fetches
    self.completed += 1
    return self.completed


@pytest.mark.cluster
@pytest.mark.slow
class TestSafeSyncTokensHookCluster:

  TIMEOUT_SECS = 5

  def _job_where_worker_2_dies(self, tmp_path, how: str):
    """3 workers, shards of 7; worker:2 exits (code 7) as `how` says. Returns the result and,
    for each survivor, that it failed by itself in time, without a stray thread error."""
    args = ["--shard_batches=7,7,7", f"--output_dir={tmp_path}",
            f"--epochsync_step_timeout_secs={self.TIMEOUT_SECS}", "--epochsync_warn_after_secs=2",
            "--epochsync_log_every_secs=1"]
    with LocalCluster(num_workers=3, timeout_secs=60, fail_fast_secs=None,
                      log_dir=str(tmp_path / "logs")) as cluster:
      cluster.start(TASK + args, per_task_args={"worker:2": [how]})
      result = cluster.wait()
    dead = result.tasks["worker:2"]
    assert dead.returncode == 7, dead.log
    for name in ("worker:0", "worker:1"):
      task = result.tasks[name]
      assert task.returncode not in (0, None) and not task.timed_out, name
      # Not stop_grace_period_secs (120 s) later: nothing waits for a blocked aggregation.
      assert task.elapsed_secs - dead.elapsed_secs < self.TIMEOUT_SECS + 10, name
      assert "Exception in thread" not in task.log, name
    return result

  def _step_timeout_line(self, name: str, step: int) -> str:
    return (f"hooks.errors.StepTimeoutError: step {step} timed out after {self.TIMEOUT_SECS} s on "
            f"{name}: 2/3 workers sent their gradient; missing worker:2 (check its log or raise "
            "--epochsync_step_timeout_secs)")

  @pytest.mark.timeout(90)
  def test_a_dead_worker_is_named_and_nothing_hangs(self, tmp_path):
    result = self._job_where_worker_2_dies(tmp_path, "--die_after_steps=3")
    assert "exits on purpose after 3 steps" in result.tasks["worker:2"].log
    for name in ("worker:0", "worker:1"):
      log = result.tasks[name].log
      assert re.search(rf"{name} has waited \d s for step 3: 2/3 workers sent their gradient; "
                       r"missing worker:2", log), name
      assert self._step_timeout_line(name, 3) in log, name
    assert "aggregation stopped" in result.tasks["worker:0"].log

  @pytest.mark.timeout(90)
  def test_a_worker_dying_mid_step_is_named_and_nothing_hangs(self, tmp_path):
    """worker:2 dies after its step-3 GRAD marker, before its gradient: the chief's take_grad
    waits for a gradient that never comes, and closing the session must cancel it at once."""
    result = self._job_where_worker_2_dies(tmp_path, "--die_in_step=3")
    assert "exits on purpose in the middle of step 3" in result.tasks["worker:2"].log
    for name in ("worker:0", "worker:1"):
      assert self._step_timeout_line(name, 2) in result.tasks[name].log, name
