"""Tests for hooks/config/preflight.py: bad set-ups are refused before the first training step.

In-process: a fresh graph per test, local sessions. Each refusal is checked through the real
path (MonitoredSession / MonitoredTrainingSession creating EpochInput.hook and the other
hooks), by the part of its message that says what to change, and with no step run.
"""

import os

import numpy as np
import pytest
import tensorflow as tf

from hooks.config import preflight
from hooks.epoch.barrier import EpochBarrierHook
from hooks.checkpoint.epoch_save import ChiefSaveAfterBarrierHook
from hooks.data.epoch_input import EpochInput, EpochListener
from hooks.errors import ConfigError
from hooks.sync.optimizer import WorkerDoneSyncReplicasOptimizer
from tf_unit import LOCAL, graph, v1  # noqa: F401  (graph: a fresh graph per test)
from tf_unit import train as _train, user_loop

pytestmark = pytest.mark.filterwarnings("ignore:To make it possible to preserve tf.data options")


def _model(dataset=None, num_epochs=2):
  """EpochInput over 10 examples in batches of 4 (3 steps per epoch); train_op counts steps."""
  if dataset is None:
    dataset = tf.data.Dataset.from_tensor_slices(np.arange(10, dtype=np.float32)).batch(4)
  epoch_input = EpochInput(dataset, num_epochs=num_epochs, task_name="worker:0")
  global_step = v1.train.get_or_create_global_step()
  total = v1.get_variable("total", [], tf.float32, v1.zeros_initializer(), use_resource=False)
  train_op = tf.group(v1.assign_add(total, tf.reduce_sum(epoch_input.get_next())),
                      v1.assign_add(global_step, 1))
  return epoch_input, train_op, global_step


def _sync_model(num_epochs=2):
  """The same input feeding a one-worker WorkerDoneSyncReplicasOptimizer."""
  epoch_input = EpochInput(tf.data.Dataset.from_tensor_slices(
      np.arange(10, dtype=np.float32)).batch(4), num_epochs=num_epochs, task_name="worker:0")
  return (epoch_input,) + _sync_train_op(epoch_input.get_next())


def _sync_train_op(x):
  """(optimizer, train_op, global_step) of a one-worker sync optimizer on the input `x`."""
  global_step = v1.train.get_or_create_global_step()
  w = v1.get_variable("w", [], initializer=v1.zeros_initializer())
  opt = WorkerDoneSyncReplicasOptimizer(v1.train.GradientDescentOptimizer(0.01), 1, 0)
  return opt, opt.minimize(tf.reduce_sum(x * w), global_step=global_step), global_step


class _Calls(EpochListener):
  """Records that the session reached the epoch listeners (i.e. was not refused)."""

  def __init__(self):
    self.calls = []

  def session_created(self, session, start_epoch):
    self.calls.append("session_created")

  def epoch_started(self, session, epoch):
    self.calls.append(f"epoch_started {epoch}")


class _Spy(v1.train.SessionRunHook):
  """Records, in begin(), the hooks list hooks_of_calling_session finds."""

  def __init__(self):
    self.found = "not called"

  def begin(self):
    self.found = preflight.hooks_of_calling_session(self)


def test_exports():
  assert sorted(preflight.__all__) == ["finite_dataset_problems", "hooks_of_calling_session",
                                       "session_hooks_problems", "writable_dir_problems"]


class TestHooksOfCallingSession:

  def test_finds_the_hooks_given_to_monitored_session(self):
    spy, other = _Spy(), v1.train.SessionRunHook()
    with v1.train.MonitoredSession(hooks=[other, spy]):
      pass
    assert spy.found == [other, spy]

  def test_finds_the_hooks_monitored_training_session_adds(self, tmp_path):
    v1.train.get_or_create_global_step()
    spy = _Spy()
    with v1.train.MonitoredTrainingSession(checkpoint_dir=str(tmp_path), hooks=[spy]):
      pass
    assert spy in spy.found
    assert any(isinstance(h, v1.train.CheckpointSaverHook) for h in spy.found)

  def test_none_when_no_calling_frame_holds_the_hook(self):
    assert _Spy().begin() is None and preflight.hooks_of_calling_session(object()) is None


class TestStepLimitAndMidEpochSaver:

  def test_a_stop_at_step_hook_is_refused_before_the_session_exists(self):
    epoch_input, train_op, _ = _model()
    calls = _Calls()
    epoch_input.add_listener(calls)
    with pytest.raises(ConfigError, match=r"worker:0 has a StopAtStepHook \(from max_steps, "
                                          r"num_steps or last_step\).*Remove it \(Estimator: "
                                          r"train\(steps=None, max_steps=None\)\)"):
      _train([v1.train.StopAtStepHook(last_step=4), epoch_input.hook], train_op)
    assert calls.calls == []

  def test_monitored_training_sessions_default_saver_is_refused(self, tmp_path):
    epoch_input, train_op, _ = _model()
    with pytest.raises(ConfigError, match=r"CheckpointSaverHook \(saving to '.*'\): it saves "
                                          r"in the middle of an epoch.*MonitoredTrainingSession\("
                                          r"save_checkpoint_secs=None, save_checkpoint_steps=None"
                                          r"\), Estimator RunConfig\(save_checkpoints_secs=None"):
      with v1.train.MonitoredTrainingSession(checkpoint_dir=str(tmp_path),
                                             hooks=[epoch_input.hook]):
        pass
    assert not [f for f in os.listdir(tmp_path) if f.startswith("model.ckpt")]

  def test_monitored_training_session_without_savers_is_accepted(self, tmp_path):
    epoch_input, train_op, global_step = _model()
    with v1.train.MonitoredTrainingSession(
        checkpoint_dir=str(tmp_path), save_checkpoint_secs=None, save_checkpoint_steps=None,
        hooks=[epoch_input.hook]) as sess:
      assert user_loop(sess, train_op) == 6

  def test_every_problem_is_reported_at_once(self, tmp_path):
    epoch_input, train_op, _ = _model()
    saver = v1.train.CheckpointSaverHook(str(tmp_path), save_steps=1)
    with pytest.raises(ConfigError, match=r"\(2 problem\(s\)\)(?s:.*)StopAtStepHook"
                                          r"(?s:.*)CheckpointSaverHook"):
      _train([v1.train.StopAtStepHook(num_steps=2), saver, epoch_input.hook], train_op)


class TestSyncOptimizerWithoutItsHook:

  def test_refused_before_the_session_exists(self):
    epoch_input, _, train_op, _ = _sync_model()
    with pytest.raises(ConfigError, match=r"train_op '.*' of a WorkerDoneSyncReplicasOptimizer "
                                          r"has no SafeSyncTokensHook.*wait for its token "
                                          r"forever. Pass opt.make_session_run_hook\("
                                          r"config.is_chief, num_tokens=0\)"):
      _train([epoch_input.hook], train_op)

  def test_with_its_hook_it_trains_every_epoch(self):
    epoch_input, opt, train_op, global_step = _sync_model()
    hook = opt.make_session_run_hook(True, num_tokens=0, step_timeout_secs=20,
                                     warn_after_secs=10)
    assert _train([hook, epoch_input.hook], train_op) == 6
    assert epoch_input.hook.history[-1].epoch == 1

  def test_without_any_epoch_hook_the_first_step_fails_at_once_instead_of_hanging(self):
    # A constant input: an EpochInput without its hook would fail too (its iterator is not
    # initialized), and which of the two errors comes first is up to the executor.
    opt, train_op, _ = _sync_train_op(tf.constant([1.0, 2.0]))
    with v1.Session() as sess:
      sess.run([v1.global_variables_initializer(), v1.local_variables_initializer()])
      # The local step only the hook sets names it (no op of its own in every step).
      with pytest.raises(tf.errors.FailedPreconditionError,
                         match=r"uninitialized value "
                               r"worker_done_sync_replicas_local_step_set_by_SafeSyncTokensHook"):
        sess.run(train_op, options=v1.RunOptions(timeout_in_ms=20_000))  # a hang: Deadline...
      step, progress = sess.run(opt.sync_ops.diagnostics)
    assert step == 0 and list(progress) == [-2]  # no gradient was applied, no marker was sent


class TestInfiniteDataset:

  def test_a_repeated_dataset_is_refused_when_the_session_is_created(self):
    dataset = tf.data.Dataset.from_tensor_slices(np.arange(10, dtype=np.float32)).batch(4)
    epoch_input, train_op, _ = _model(dataset.repeat())
    calls = _Calls()
    epoch_input.add_listener(calls)
    with pytest.raises(ConfigError, match=r"worker:0: the dataset handed to EpochInput is "
                                          r"infinite \(tf.data cardinality INFINITE, e.g. a "
                                          r"\.repeat\(\) without a count\).*remove the \.repeat"):
      _train([epoch_input.hook], train_op)
    assert calls.calls == []  # before the barriers and the first step

  def test_an_unknown_cardinality_is_accepted_and_trains_exactly(self):
    dataset = tf.data.Dataset.from_tensor_slices(np.arange(10, dtype=np.float32)).filter(
        lambda x: x >= 0).batch(4)
    epoch_input, train_op, _ = _model(dataset)
    assert _train([epoch_input.hook], train_op) == 6
    assert [(s.batches, s.examples) for s in epoch_input.hook.history] == [(3, 10), (3, 10)]

  @pytest.mark.parametrize("cardinality, refused", [(tf.data.INFINITE_CARDINALITY, True),
                                                    (tf.data.UNKNOWN_CARDINALITY, False),
                                                    (0, False), (7, False)])
  def test_only_infinite_is_a_problem(self, cardinality, refused):
    assert bool(preflight.finite_dataset_problems(cardinality, "worker:0")) == refused


class TestWritableDir:

  def test_an_existing_or_creatable_directory_is_fine_and_left_clean(self, tmp_path):
    assert preflight.writable_dir_problems(str(tmp_path), "chief:0") == []
    new = tmp_path / "a" / "b"
    assert preflight.writable_dir_problems(str(new), "chief:0") == []
    assert new.is_dir() and os.listdir(tmp_path) == ["a"] and os.listdir(new) == []

  def test_a_directory_under_a_file_cannot_be_created(self, tmp_path):
    (tmp_path / "file").write_text("x")
    path = str(tmp_path / "file" / "model")
    problems = preflight.writable_dir_problems(path, "chief:0")
    assert len(problems) == 1 and problems[0].startswith(f"model_dir={path!r} is not writable on "
                                                         "chief:0 (")
    assert "pass a model_dir that chief:0 can create and write (and every ps task" in problems[0]

  def test_a_file_is_not_a_directory(self, tmp_path):
    (tmp_path / "file").write_text("x")
    assert "is a file, not a directory" in preflight.writable_dir_problems(
        str(tmp_path / "file"), "chief:0")[0]

  @pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux /proc")
  def test_an_existing_directory_nobody_may_write(self):
    # /proc refuses new files even to root (these tests may run as root, where chmod is no bar).
    assert "is not writable on chief:0" in preflight.writable_dir_problems("/proc", "chief:0")[0]

  def test_the_chiefs_save_hook_refuses_before_the_session_exists(self, tmp_path):
    (tmp_path / "file").write_text("x")
    epoch_input, train_op, _ = _model()
    barrier = EpochBarrierHook(epoch_input, num_workers=1, worker_id=0,
                               worker_names=("chief:0",), ps_device=LOCAL)
    calls = _Calls()
    epoch_input.add_listener(calls)
    save = ChiefSaveAfterBarrierHook(barrier, str(tmp_path / "file" / "model"))
    with pytest.raises(ConfigError, match=r"checkpoint directory of chief:0 \(1 problem\(s\)\):"
                                          r"\n  - model_dir='.*/file/model' is not writable on "
                                          r"chief:0 .*; pass a model_dir that chief:0 can create"):
      _train([barrier, save, epoch_input.hook], train_op)
    assert calls.calls == []
