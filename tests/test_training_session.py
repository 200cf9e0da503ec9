"""Tests for hooks/session/training_session.py: the drop-in for MonitoredTrainingSession.

Argument checks and the hook wiring run without a session (MonitoredSession is replaced by a
recorder); one test trains for real on an in-process cluster (a ps and a worker server).
"""

import glob
import inspect
import os

import numpy as np
import portpicker
import pytest
import tensorflow as tf

from hooks.session import training_session as ts_lib
from hooks.epoch.barrier import EpochBarrierHook
from hooks.epoch.audit import read_audit
from hooks.checkpoint.epoch_save import ChiefSaveAfterBarrierHook
from hooks.config.cluster import ClusterConfig
from hooks.sync.done_counter import WorkerDoneHook
from hooks.data.epoch_input import EpochInput
from hooks.epoch.summaries import EpochSummaryHook, read_epoch_summaries
from hooks.errors import ConfigError
from hooks.epoch.progress import EpochProgressHook
from hooks.faults import liveness
from hooks.checkpoint.mid_epoch import MidEpochSaveHook
from hooks.checkpoint.mid_epoch_restore import MidEpochRestoreHook
from hooks.checkpoint.state_saver import StateSaverHook
from hooks.checkpoint.mid_epoch_resume import MidEpochResume
from hooks.faults.recovery_guard import RecoveryGuardHook
from hooks.epoch.run_start import RunStartHook
from hooks.session.creators import EpochSyncChiefSessionCreator, FastWorkerSessionCreator
from hooks.config.settings import EpochSyncSettings
from hooks.sync.optimizer import WorkerDoneSyncReplicasOptimizer
from hooks.sync.step_counter import SyncStepCounterHook
from hooks.sync.tokens import SafeSyncTokensHook
from hooks.session.training_session import USE_DEFAULT, monitored_training_session
from tf_unit import graph, user_loop, v1  # noqa: F401  (graph: a fresh graph per test)

CLUSTER = {"chief": ["localhost:1"], "worker": ["localhost:2", "localhost:3"],
           "ps": ["localhost:4"]}
CHIEF = ClusterConfig(CLUSTER, "chief", 0)
WORKER = ClusterConfig(CLUSTER, "worker", 1)
SETTINGS = EpochSyncSettings(num_epochs=2, startup_timeout_secs=42, step_timeout_secs=30,
                             warn_after_secs=20)


class _User(v1.train.SessionRunHook):
  """A user's own hook."""


class _Recorder:
  """Stands in for tf.compat.v1.train.MonitoredSession: records its arguments."""

  def __init__(self, session_creator, hooks, stop_grace_period_secs):
    self.session_creator, self.hooks = session_creator, hooks
    self.stop_grace_period_secs = stop_grace_period_secs


@pytest.fixture
def recorded(monkeypatch):
  monkeypatch.setattr(v1.train, "MonitoredSession", _Recorder)


def _input(num_epochs=2):
  return EpochInput(tf.data.Dataset.range(6).batch(2), num_epochs=num_epochs, task_name="x")


def _opt(config):
  return WorkerDoneSyncReplicasOptimizer(v1.train.GradientDescentOptimizer(0.1),
                                         config.num_workers, config.worker_id,
                                         worker_names=config.worker_names)


def _session(task=CHIEF, **kwargs):
  args = dict(master="grpc://localhost:1", is_chief=task.is_chief, checkpoint_dir="/tmp/m",
              epoch_input=_input(), settings=SETTINGS, cluster=task)
  args.update(kwargs)
  return monitored_training_session(**args)


def test_exports():
  assert sorted(ts_lib.__all__) == ["USE_DEFAULT", "monitored_training_session"]
  import hooks
  assert hooks.monitored_training_session is monitored_training_session


def test_mirrors_stock_arguments_and_defaults():
  stock = inspect.signature(v1.train.MonitoredTrainingSession).parameters
  ours = inspect.signature(monitored_training_session).parameters
  assert list(ours)[:len(stock)] == list(stock)  # same names, same order
  differ = {n for n in stock if stock[n].default is not ours[n].default and
            stock[n].default != ours[n].default}
  assert differ == {"max_wait_secs"}  # 7200 there; --epochsync_startup_timeout_secs here
  assert ours["save_checkpoint_secs"].default is USE_DEFAULT
  extra = [n for n in ours if n not in stock]
  assert all(ours[n].kind is inspect.Parameter.KEYWORD_ONLY for n in extra)


class TestRefusals:

  @pytest.mark.parametrize("secs, steps, period", [
      (USE_DEFAULT, USE_DEFAULT, (600, 0)), (30, USE_DEFAULT, (30, 0)),
      (USE_DEFAULT, 100, (0, 100)), (None, 100, (0, 100))])
  def test_save_checkpoint_args_set_the_mid_epoch_period(self, recorded, secs, steps, period):
    session = _session(save_checkpoint_secs=secs, save_checkpoint_steps=steps,
                       sync_optimizer=_opt(CHIEF))
    saves = [h for h in session.hooks if isinstance(h, MidEpochSaveHook)]
    assert [(h._secs, h._steps_period) for h in saves] == [period]

  def test_synchronous_settings_without_the_sync_hook_save_no_mid_epoch_checkpoint(self, recorded):
    session = _session(save_checkpoint_steps=100)  # no quiescent point to save at
    assert not [h for h in session.hooks if isinstance(h, MidEpochSaveHook)]
    assert [h._count_applied for h in session.hooks if isinstance(h, MidEpochResume)] == [False]

  def test_both_save_checkpoint_args_are_refused(self):
    with pytest.raises(ConfigError, match=r"save_checkpoint_steps=10 and save_checkpoint_secs=60 "
                                          r"are both set: set one"):
      _session(save_checkpoint_secs=60, save_checkpoint_steps=10)

  @pytest.mark.parametrize("value", [None, 0, -1])
  def test_disabled_checkpoints_are_fine(self, recorded, value):
    session = _session(save_checkpoint_secs=value, save_checkpoint_steps=value)
    assert not [h for h in session.hooks if isinstance(h, (v1.train.CheckpointSaverHook,
                                                            MidEpochSaveHook))]

  def test_step_limits_savers_and_stock_sync_hooks_in_hooks(self):
    global_step = v1.train.get_or_create_global_step()
    stock = v1.train.SyncReplicasOptimizer(v1.train.GradientDescentOptimizer(0.1), 3, 3)
    hooks = [v1.train.StopAtStepHook(last_step=10),
             v1.train.CheckpointSaverHook("/tmp/m", save_steps=10),
             stock.make_session_run_hook(True)]
    del global_step
    with pytest.raises(ConfigError) as info:
      _session(hooks=hooks)
    message = str(info.value)
    assert "(3 problem(s))" in message
    assert "a StopAtStepHook is in hooks: a global step would end training in the middle" in (
        message)
    assert "a CheckpointSaverHook is in hooks: it would save checkpoints in the middle" in message
    assert ("a stock SyncReplicasOptimizer hook is in hooks: it waits for replicas_to_aggregate "
            "gradients every step and hangs") in message

  def test_local_master_and_missing_epoch_input(self):
    with pytest.raises(ConfigError, match=r"(?s)epoch_input=None must be the EpochInput.*"
                                          r"master='' would run a local in-process session.*"
                                          r"pass master=server.target"):
      _session(master="", epoch_input=None)

  def test_is_chief_must_agree_with_the_cluster(self):
    with pytest.raises(ConfigError, match=r"is_chief=True but arguments makes chief:0 the chief "
                                          r"and this task is worker:1; pass "
                                          r"is_chief=config.is_chief"):
      _session(task=WORKER, is_chief=True)

  def test_ps_and_evaluator_tasks_do_not_train(self):
    with pytest.raises(ConfigError, match=r"this task is ps:0: only chief and worker tasks train"):
      _session(task=ClusterConfig(CLUSTER, "ps", 0), is_chief=False)

  def test_sync_optimizer_given_twice(self):
    opt = _opt(CHIEF)
    with pytest.raises(ConfigError, match=r"given more than once \(sync_optimizer, a "
                                          r"SafeSyncTokensHook in hooks\)"):
      _session(sync_optimizer=opt, hooks=[opt.make_session_run_hook(True)])

  def test_sync_optimizer_of_another_worker(self):
    with pytest.raises(ConfigError, match=r"built for worker_id=0 of num_workers=3, but this task "
                                          r"is worker:1, worker 2 of 3"):
      _session(task=WORKER, sync_optimizer=_opt(CHIEF))

  def test_sync_hook_with_the_wrong_is_chief(self):
    with pytest.raises(ConfigError, match=r"made with is_chief=False but this task is chief:0"):
      _session(sync_hook=_opt(CHIEF).make_session_run_hook(False))

  def test_a_stock_optimizer_is_not_a_sync_optimizer(self):
    stock = v1.train.SyncReplicasOptimizer(v1.train.GradientDescentOptimizer(0.1), 3, 3)
    with pytest.raises(ConfigError, match=r"sync_optimizer=SyncReplicasOptimizer must be a "
                                          r"WorkerDoneSyncReplicasOptimizer"):
      _session(sync_optimizer=stock)


class TestWiring:

  def test_chief_hook_order(self, recorded):
    chief_only, user = _User(), _User()
    opt = _opt(CHIEF)
    session = _session(hooks=[user, opt.make_session_run_hook(True)],
                       chief_only_hooks=[chief_only])
    kinds = [type(h) for h in session.hooks]
    assert kinds == [RecoveryGuardHook, StateSaverHook, MidEpochRestoreHook, RunStartHook,
                     SafeSyncTokensHook, WorkerDoneHook,
                     EpochBarrierHook, MidEpochResume, ChiefSaveAfterBarrierHook,
                     MidEpochSaveHook, EpochSummaryHook, EpochProgressHook, _User,
                     SyncStepCounterHook, v1.train.SummarySaverHook, _User,
                     type(session.hooks[-1])]
    assert session.hooks[12] is chief_only and session.hooks[15] is user
    assert session.hooks[-1].__class__.__name__ == "EpochDriverHook"  # always last
    assert isinstance(session.session_creator, EpochSyncChiefSessionCreator)
    assert session.session_creator._checkpoint_dir == "/tmp/m"
    assert session.session_creator._liveness is liveness.monitor_for(CHIEF)  # names dead tasks
    assert session.session_creator._startup_timeout == 42
    assert session.stop_grace_period_secs == 120

  def test_worker_gets_no_chief_hooks_and_a_fast_creator(self, recorded):
    session = _session(task=WORKER, sync_optimizer=_opt(WORKER),
                       chief_only_hooks=[_User()])
    kinds = [type(h).__name__ for h in session.hooks]
    assert kinds == ["RecoveryGuardHook", "RunStartHook", "SafeSyncTokensHook", "WorkerDoneHook",
                     "EpochBarrierHook", "MidEpochResume", "EpochProgressHook", "EpochDriverHook"]
    creator = session.session_creator
    assert isinstance(creator, FastWorkerSessionCreator)
    assert creator._poll_secs == 0.5  # TensorFlow's WorkerSessionCreator: 30 s
    assert creator._max_wait == 42  # settings.startup_timeout_secs
    assert creator._chief_name == "chief:0" and creator._task_name == "worker:1"
    assert list(creator._config.device_filters) == ["/job:ps", "/job:worker/task:1"]
    assert creator._liveness is liveness.monitor_for(WORKER)
    assert creator._needed == ["ps:0"]  # answers before the first readiness check
    assert sorted(creator._watched) == ["chief:0", "ps:0"]  # probed while the model is unready

  def test_the_sync_hook_is_made_from_the_settings(self, recorded):
    session = _session(sync_optimizer=_opt(CHIEF))
    hook = session.hooks[4]  # after the RecoveryGuard, StateSaver, MidEpochRestore, RunStart
    assert isinstance(hook, SafeSyncTokensHook)
    assert (hook._step.timeout_secs, hook._step.warn_after_secs, hook._is_chief) == (30, 15, True)

  def test_stock_arguments_reach_the_stock_hooks(self, recorded):
    session = _session(save_summaries_secs=7, log_step_count_steps=0, max_wait_secs=5,
                       summary_dir="/tmp/s", stop_grace_period_secs=3)
    kinds = [type(h).__name__ for h in session.hooks]
    assert "StepCounterHook" not in kinds  # log_step_count_steps=0 turns it off, as in stock
    saver = [h for h in session.hooks if isinstance(h, v1.train.SummarySaverHook)][0]
    assert saver._output_dir == "/tmp/s" and saver._timer._every_secs == 7
    summaries = [h for h in session.hooks if isinstance(h, EpochSummaryHook)][0]
    assert summaries.logdir == "/tmp/s/epochsync"
    assert session.stop_grace_period_secs == 3

  def test_max_wait_secs_given_wins(self, recorded):
    assert _session(task=WORKER, max_wait_secs=5).session_creator._max_wait == 5

  def test_config_keeps_its_fields_and_gains_device_filters(self, recorded):
    config = v1.ConfigProto(inter_op_parallelism_threads=2)
    creator = _session(task=WORKER, config=config).session_creator
    assert list(creator._config.device_filters) == ["/job:ps", "/job:worker/task:1"]
    assert creator._config.inter_op_parallelism_threads == 2
    assert not config.device_filters  # the caller's proto is not changed
    own = v1.ConfigProto(device_filters=["/job:ps"])
    assert _session(task=WORKER, config=own).session_creator._config is own

  def test_a_worker_beyond_the_launch_brings_its_cluster_in_the_given_config_too(self, recorded):
    beyond = ClusterConfig(WORKER.cluster, "worker", 1, launch_workers=2, max_workers=3)
    own = v1.ConfigProto(device_filters=["/job:ps"], inter_op_parallelism_threads=2)
    config = ts_lib._with_device_filters(own, beyond)  # (the session needs an elastic job)
    assert config.experimental.share_session_state_in_clusterspec_propagation
    assert [job.name for job in config.cluster_def.job] == ["ps", "worker"]
    assert list(config.device_filters) == ["/job:ps"]
    assert config.inter_op_parallelism_threads == 2 and not own.HasField("cluster_def")

  def test_settings_and_cluster_default_to_the_flags_and_tf_config(self, recorded, monkeypatch):
    monkeypatch.setenv("TF_CONFIG", WORKER.to_tf_config())
    monkeypatch.setenv("EPOCHSYNC_STARTUP_TIMEOUT_SECS", "17")
    session = monitored_training_session(master="grpc://localhost:3", is_chief=False,
                                         epoch_input=_input())
    assert session.session_creator._max_wait == 17
    assert session.session_creator._task_name == "worker:1"


def test_trains_on_an_in_process_cluster_with_summaries(tmp_path):
  """One chief, one ps, both servers in this process: epochs, checkpoints, TensorBoard."""
  ps_addr, worker_addr = (f"localhost:{portpicker.pick_unused_port()}" for _ in range(2))
  config = ClusterConfig({"worker": [worker_addr], "ps": [ps_addr]}, "worker", 0)
  ps = tf.distribute.Server(config.cluster_spec(), "ps", 0)
  server = tf.distribute.Server(config.cluster_spec(), "worker", 0)
  del ps
  model_dir = str(tmp_path)
  with v1.device(v1.train.replica_device_setter(worker_device=config.job_device,
                                                cluster=config.cluster_spec())):
    global_step = v1.train.get_or_create_global_step()
    epoch_input = EpochInput(tf.data.Dataset.from_tensor_slices(
        np.arange(10, dtype=np.float32)).batch(4), num_epochs=2, task_name=config.task_name)
    w = v1.get_variable("w", [], initializer=v1.zeros_initializer())
    loss = tf.reduce_mean(tf.square(epoch_input.get_next() - w))
    v1.summary.scalar("loss", loss)
    opt = WorkerDoneSyncReplicasOptimizer(v1.train.GradientDescentOptimizer(0.1),
                                          replicas_to_aggregate=1, total_num_replicas=1,
                                          worker_id=0)
    train_op = opt.minimize(loss, global_step=global_step)
  settings = EpochSyncSettings(num_epochs=2, startup_timeout_secs=30, barrier_timeout_secs=30,
                               step_timeout_secs=30, warn_after_secs=10)
  with monitored_training_session(master=server.target, is_chief=True,
                                  checkpoint_dir=model_dir, save_summaries_steps=1,
                                  log_step_count_steps=1, epoch_input=epoch_input,
                                  settings=settings, cluster=config,
                                  sync_optimizer=opt) as sess:
    assert user_loop(sess, train_op, max_steps=20) == 6
  audit = read_audit(model_dir)
  assert [(line["epoch"], line["global_step"]) for line in audit] == [(0, 3), (1, 6)]
  assert sorted(os.path.basename(p) for p in glob.glob(f"{model_dir}/model.ckpt-*.index")) == [
      "model.ckpt-epoch0000-3.index", "model.ckpt-epoch0001-6.index"]
  assert os.path.exists(f"{model_dir}/graph.pbtxt")
  assert glob.glob(f"{model_dir}/model.ckpt-epoch0001-6.meta")
  assert read_epoch_summaries(model_dir)["epoch/steps"] == {0: 3, 1: 3}
  tags = set()
  for path in glob.glob(f"{model_dir}/events.out.tfevents.*"):
    for event in v1.train.summary_iterator(path):
      tags.update(v.tag for v in event.summary.value)
  assert {"loss", "global_step/sec"} <= tags  # the stock summary and step-counter hooks work


@pytest.fixture(scope="module")
def servers():
  """One ps and one worker server in this process for every job that uses them: a long-lived
  ps, as on Kubernetes (each job's chief drains what the previous one left)."""
  ps_addr, worker_addr = (f"localhost:{portpicker.pick_unused_port()}" for _ in range(2))
  config = ClusterConfig({"worker": [worker_addr], "ps": [ps_addr]}, "worker", 0)
  started = [tf.distribute.Server(config.cluster_spec(), job, 0) for job in ("ps", "worker")]
  return config, started[1], started[0]  # the ps object too: it must outlive the jobs


class TestScaffoldInitFn:
  """A Scaffold(init_fn=...) warm start (the user's Saver of model variables, restoring another
  run's checkpoint) on an in-process cluster: init_fn runs when checkpoint_dir holds no
  checkpoint, and not when it holds one (a tf-epochsync or a stock one), as in stock."""

  DATA = np.arange(10, dtype=np.float32)  # batches of 4: [0..3], [4..7], [8, 9]
  LEARNING_RATE = 0.1

  def _oracle(self, w, num_epochs):
    """Lockstep SGD of mean((x - w)^2) over the batches, one worker."""
    for _ in range(num_epochs):
      for start in range(0, len(self.DATA), 4):
        w -= self.LEARNING_RATE * 2.0 * (w - float(np.mean(self.DATA[start:start + 4])))
    return w

  def _job(self, servers, model_dir, source, num_epochs):
    """One run of the user's job; returns (init_fn calls, final w, final global_step)."""
    config, server = servers[:2]
    calls = []
    with tf.Graph().as_default():
      with v1.device(v1.train.replica_device_setter(worker_device=config.job_device,
                                                    cluster=config.cluster_spec())):
        global_step = v1.train.get_or_create_global_step()
        epoch_input = EpochInput(tf.data.Dataset.from_tensor_slices(self.DATA).batch(4),
                                 num_epochs=num_epochs, task_name=config.task_name)
        w = v1.get_variable("w", [], initializer=v1.zeros_initializer(), use_resource=False)
        loss = tf.reduce_mean(tf.square(epoch_input.get_next() - w))
        opt = WorkerDoneSyncReplicasOptimizer(v1.train.GradientDescentOptimizer(
            self.LEARNING_RATE), replicas_to_aggregate=1, total_num_replicas=1, worker_id=0)
        train_op = opt.minimize(loss, global_step=global_step)
      warm = v1.train.Saver(var_list=[w])  # the model's variables, not the optimizer's state

      def init_fn(scaffold, session):
        del scaffold
        calls.append(source)
        warm.restore(session, source)

      settings = EpochSyncSettings(num_epochs=num_epochs, startup_timeout_secs=30,
                                   barrier_timeout_secs=30, step_timeout_secs=30,
                                   warn_after_secs=10)
      with monitored_training_session(
          master=server.target, is_chief=True, checkpoint_dir=model_dir,
          scaffold=v1.train.Scaffold(init_fn=init_fn), save_summaries_steps=None,
          log_step_count_steps=0, epoch_input=epoch_input, settings=settings, cluster=config,
          sync_optimizer=opt) as sess:
        user_loop(sess, train_op, max_steps=20)
      last = tf.train.latest_checkpoint(model_dir)
      return calls, tf.train.load_variable(last, "w"), tf.train.load_variable(last, "global_step")

  def _checkpoint(self, path, w_value, step=0):
    """A stock job's checkpoint of w and global_step (no tf-epochsync state)."""
    with tf.Graph().as_default():
      w = v1.get_variable("w", [], initializer=v1.constant_initializer(w_value),
                          use_resource=False)
      step_var = v1.train.get_or_create_global_step()
      with v1.Session() as sess:
        sess.run(v1.global_variables_initializer())
        sess.run(step_var.assign(step))
        return v1.train.Saver([w, step_var]).save(sess, path)

  def test_init_fn_warm_starts_a_fresh_model_dir_and_not_a_restart(self, servers, tmp_path):
    source = self._checkpoint(str(tmp_path / "pretrained" / "model.ckpt"), 5.0)
    model_dir = str(tmp_path / "model")
    calls, w, step = self._job(servers, model_dir, source, num_epochs=2)
    assert calls == [source]
    np.testing.assert_allclose(w, self._oracle(5.0, 2), atol=1e-5)  # from 5.0, not from 0
    assert step == 6
    after_two = w
    calls, w, step = self._job(servers, model_dir, source, num_epochs=3)  # a relaunch
    assert calls == []  # the epoch checkpoint is restored instead, as in stock
    np.testing.assert_allclose(w, self._oracle(after_two, 1), atol=1e-5)
    assert step == 9 and [line["epoch"] for line in read_audit(model_dir)] == [0, 1, 2]
    # What a tf-epochsync checkpoint holds beside the model (listed in docs/migration.md).
    names = set(tf.train.load_checkpoint(tf.train.latest_checkpoint(model_dir))
                .get_variable_to_shape_map())
    assert names == {"w", "global_step", "epochsync/completed_epochs", "epochsync/done_epochs",
                     "epochsync/arrived_barrier", "worker_done_sync_replicas/progress",
                     "worker_done_sync_replicas/completed_epochs", "epochsync/mid_epoch/position",
                     "epochsync/mid_epoch/shard_batches", "epochsync/mid_epoch/applied"}

  def test_a_stock_checkpoint_in_model_dir_wins_over_init_fn(self, servers, tmp_path):
    source = self._checkpoint(str(tmp_path / "pretrained" / "model.ckpt"), 5.0)
    model_dir = str(tmp_path / "model")
    self._checkpoint(os.path.join(model_dir, "model.ckpt-4"), 7.0, step=4)
    calls, w, step = self._job(servers, model_dir, source, num_epochs=1)
    assert calls == []  # stock: init_fn runs only without a checkpoint
    np.testing.assert_allclose(w, self._oracle(7.0, 1), atol=1e-5)  # the stock checkpoint's
    assert step == 4 + 3
