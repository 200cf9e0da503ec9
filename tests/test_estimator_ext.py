"""estimator_ext: the run config, the optimizer switch, early stopping, the evaluator loop, the
errors raised before any session, local mode and the documented before/after jobs."""

import difflib
import json
import os
import re
import subprocess
import sys

from absl import flags
import numpy as np
import pytest
import tensorflow as tf

import estimator_ext
from estimator_ext import evaluator as evaluator_lib
from estimator_ext import optimizer as optimizer_lib
from estimator_ext.early_stopping import EarlyStopping, EarlyStoppingState
from hooks.config import flags as epochsync_flags  # pylint: disable=unused-import; defines --epochsync_*
from hooks.epoch.audit import AUDIT_FILENAME
from hooks.errors import ConfigError
from hooks.config.settings import EpochSyncSettings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FLAGS = flags.FLAGS
v1 = tf.compat.v1
# Ports nobody listens on: no test here starts a server or a session on the cluster.
CLUSTER = {"chief": ["localhost:1"], "worker": ["localhost:2", "localhost:3"],
           "ps": ["localhost:4"]}


@pytest.fixture(autouse=True)
def no_tf_config(monkeypatch):
  monkeypatch.delenv("TF_CONFIG", raising=False)


def set_tf_config(monkeypatch, task_type, index=0, cluster=None, **extra):
  monkeypatch.setenv("TF_CONFIG", json.dumps(
      {"cluster": cluster or CLUSTER, "task": {"type": task_type, "index": index}, **extra}))


def test_exports():
  assert sorted(estimator_ext.__all__) == [
      "EarlyStopping", "EpochResults", "EpochSyncOptimizer", "EpochSyncRunConfig",
      "EvaluatorTimeoutError", "read_eval_log", "shard", "sync_optimizer", "train_and_evaluate", "work_units"]


class TestEpochSyncRunConfig:

  def test_turns_off_mid_epoch_saves_worker_delay_and_bounds_start_up(self, tmp_path):
    config = estimator_ext.EpochSyncRunConfig(str(tmp_path), num_epochs=3,
                                              startup_timeout_secs=120, keep_checkpoint_max=9)
    assert isinstance(config, tf.estimator.RunConfig)
    assert config.save_checkpoints_steps is None and config.save_checkpoints_secs is None
    assert config.experimental_max_worker_delay_secs == 0
    assert config.session_creation_timeout_secs == 120 and config.keep_checkpoint_max == 9
    assert config.settings == EpochSyncSettings(num_epochs=3, startup_timeout_secs=120)
    assert config.is_local and config.in_loop_eval and config.task_name == "worker:0"
    assert (config.num_workers, config.worker_id, config.worker_names) == (1, 0, ("worker:0",))

  def test_chief_job_is_worker_id_0_and_matches_estimators_global_id(self, monkeypatch):
    ids = {}
    for task_type, index in (("chief", 0), ("worker", 0), ("worker", 1)):
      set_tf_config(monkeypatch, task_type, index)
      config = estimator_ext.EpochSyncRunConfig("/shared/run")
      assert config.is_chief == (task_type == "chief")
      assert config.worker_id == config.global_id_in_cluster  # Stock sharding agrees.
      ids[config.task_name] = config.worker_id
      assert config.worker_names == ("chief:0", "worker:0", "worker:1")
      assert config.num_workers == config.num_worker_replicas == 3
      assert not config.in_loop_eval and not config.is_local
    assert ids == {"chief:0": 0, "worker:0": 1, "worker:1": 2}

  @pytest.mark.parametrize("listed", [False, True])
  def test_evaluator_outside_the_training_cluster_and_ps(self, monkeypatch, listed):
    # Estimator's convention lists no "evaluator" job; Kubeflow's TFJob lists it.
    set_tf_config(monkeypatch, "evaluator",
                  cluster=dict(CLUSTER, evaluator=["localhost:5"]) if listed else None)
    config = estimator_ext.EpochSyncRunConfig("/shared/run")
    assert config.task_name == "evaluator:0" and config.worker_id is None
    assert config.worker_names == ("chief:0", "worker:0", "worker:1")
    assert config.describe().startswith("evaluator:0 of cluster {chief: 1, worker: 2, ps: 1")
    set_tf_config(monkeypatch, "ps")
    assert estimator_ext.EpochSyncRunConfig("/shared/run").worker_id is None

  def test_defaults_come_from_the_parsed_epochsync_flags(self, parse):
    assert estimator_ext.EpochSyncRunConfig().settings == EpochSyncSettings()  # Unparsed.
    parse("--epochsync_num_epochs=4", "--noepochsync_sync", "--epochsync_step_timeout_secs=7")
    config = estimator_ext.EpochSyncRunConfig()
    assert (config.settings.num_epochs, config.settings.sync,
            config.settings.step_timeout_secs) == (4, False, 7)
    assert estimator_ext.EpochSyncRunConfig(num_epochs=2, sync=True).settings == dataclass_with(
        config.settings, num_epochs=2, sync=True)  # Arguments win over flags.
    spare = estimator_ext.EpochSyncRunConfig(elastic=True, spare_workers=1).settings
    assert (spare.elastic, spare.spare_workers) == (True, 1)  # docs/elastic.md's spares
    late = estimator_ext.EpochSyncRunConfig(elastic=True, optional_workers=1).settings
    assert (late.elastic, late.optional_workers) == (True, 1)  # ... and optional workers

  @pytest.mark.parametrize("kwargs, fix", [
      (dict(save_checkpoints_steps=100, save_checkpoints_secs=60),
       r"save_checkpoints_secs=60 and save_checkpoints_steps=100: `save_checkpoints_steps` and "
       r"`save_checkpoints_secs` cannot be both set \(as in RunConfig\); keep one"),
      (dict(save_checkpoints_secs=-1), r"save_checkpoints_secs=-1 should be >= 0 \(None or 0: "
       r"no mid-epoch checkpoint\)"),
      (dict(save_checkpoints_steps=-5), r"save_checkpoints_steps=-5 should be >= 0"),
      (dict(save_checkpoints_steps=2.5), r"save_checkpoints_steps=2.5 should be >= 0"),
      (dict(save_checkpoints_secs=float("inf")), r"save_checkpoints_secs=inf should be >= 0"),
      (dict(save_checkpoints_secs=True), r"save_checkpoints_secs=True should be >= 0"),
      (dict(experimental_max_worker_delay_secs=5), r"never staggered.*; remove it"),
      (dict(session_creation_timeout_secs=60), r"pass startup_timeout_secs= \(or "
       r"--epochsync_startup_timeout_secs\) instead"),
      (dict(num_epochs=0), r"num_epochs=0 must be an integer >= 1 \(flag --epochsync_num_epochs\)"),
      (dict(early_stopping=EarlyStopping(), in_loop_eval=False), r"drop in_loop_eval=False"),
      (dict(evaluator_timeout_secs=0), r"evaluator_timeout_secs=0 must be a finite number"),
      (dict(early_stopping="loss"), r"must be an estimator_ext.EarlyStopping\(metric=..."),
  ])
  def test_rejects_what_breaks_epoch_sync_with_the_fix(self, kwargs, fix):
    with pytest.raises(ConfigError, match=fix):
      estimator_ext.EpochSyncRunConfig("/tmp/x", **kwargs)

  def test_reports_every_problem_at_once(self):
    with pytest.raises(ConfigError, match=r"invalid EpochSyncRunConfig \(2 problem\(s\)\)"):
      estimator_ext.EpochSyncRunConfig("/tmp/x", save_checkpoints_steps=-1, num_epochs=0)

  def test_worker_count_must_agree_with_tf_config(self, monkeypatch, parse):
    set_tf_config(monkeypatch, "worker", 1)
    fix = (r"num_workers=4 but TF_CONFIG lists 3 chief\+worker tasks \(chief:0, worker:0, "
           r"worker:1\); set num_workers=3 \(EpochSyncRunConfig or --epochsync_num_workers\) or "
           r"fix TF_CONFIG")
    with pytest.raises(ConfigError, match=fix):
      estimator_ext.EpochSyncRunConfig("/shared/run", num_workers=4)
    parse("--epochsync_num_workers=4")
    with pytest.raises(ConfigError, match=fix):
      estimator_ext.EpochSyncRunConfig("/shared/run")
    assert estimator_ext.EpochSyncRunConfig("/shared/run", num_workers=3).num_workers == 3

  def test_a_job_that_may_grow_counts_its_slots_and_knows_a_worker_beyond_its_launch(
      self, monkeypatch, parse):
    set_tf_config(monkeypatch, "worker", 1)  # the chief and 2 workers listed
    config = estimator_ext.EpochSyncRunConfig("/shared/run", elastic=True, num_workers=2,
                                              max_workers=4)
    assert config.worker_names == ("chief:0", "worker:0", "worker:1", "worker:2")
    assert config.epochsync_cluster.beyond_launch and config.num_workers == 4
    parse("--epochsync_num_workers=3", "--epochsync_max_workers=4")
    assert not estimator_ext.EpochSyncRunConfig(
        "/shared/run", elastic=True).epochsync_cluster.beyond_launch
    with pytest.raises(ConfigError, match=r"max_workers=2 is below num_workers=3"):
      estimator_ext.EpochSyncRunConfig("/shared/run", elastic=True, max_workers=2)

  def test_local_mode_has_one_worker(self):
    with pytest.raises(ConfigError, match=r"num_workers=2 but there is no TF_CONFIG cluster "
                                          r"\(local mode: 1 task\); set num_workers=1"):
      estimator_ext.EpochSyncRunConfig("/tmp/x", num_workers=2)

  @pytest.mark.parametrize("cluster, fix", [
      ({"worker": ["localhost:2"], "ps": ["localhost:4"]},
       r'has no "chief" job; Estimator needs exactly one: add "chief": \["host:port"\]'),
      ({"master": ["localhost:1"], "worker": ["localhost:2"], "ps": ["localhost:4"]},
       r'has a "master" job: name it "chief"'),
      ({"chief": ["localhost:1"], "worker": ["localhost:2"]}, r"no ps task.*add a ps job"),
  ])
  def test_tf_config_needs_one_chief_and_a_ps(self, monkeypatch, cluster, fix):
    set_tf_config(monkeypatch, "worker", 0, cluster)
    with pytest.raises(ConfigError, match=fix):
      estimator_ext.EpochSyncRunConfig("/shared/run")

  def test_replace_keeps_the_settings_and_maps_checkpoint_periods(self):
    config = estimator_ext.EpochSyncRunConfig("/tmp/x", num_epochs=5, save_checkpoints_secs=90)
    copy = config.replace(keep_checkpoint_max=2)
    assert isinstance(copy, estimator_ext.EpochSyncRunConfig)
    assert copy.settings.num_epochs == 5 and copy.keep_checkpoint_max == 2
    assert (copy.settings.save_checkpoint_secs, copy.settings.save_checkpoint_steps) == (90, 0)
    steps = config.replace(save_checkpoints_steps=10)
    assert (steps.settings.save_checkpoint_secs, steps.settings.save_checkpoint_steps) == (0, 10)
    assert steps.settings.num_epochs == 5
    assert steps.save_checkpoints_steps is None and steps.save_checkpoints_secs is None
    assert config.settings.save_checkpoint_secs == 90  # The original is unchanged.
    with pytest.raises(ConfigError, match=r"cannot be both set"):
      config.replace(save_checkpoints_steps=10, save_checkpoints_secs=5)
    with pytest.raises(ConfigError, match=r"save_checkpoints_steps=-1 should be >= 0"):
      config.replace(save_checkpoints_steps=-1)

  @pytest.mark.parametrize("kwargs, secs, steps", [
      (dict(), 600, 0),  # RunConfig's default: every 600 s.
      (dict(save_checkpoints_secs=120), 120, 0),
      (dict(save_checkpoints_secs=0.5), 0.5, 0),
      (dict(save_checkpoints_steps=50), 0, 50),
      (dict(save_checkpoints_steps=50, save_checkpoints_secs=None), 0, 50),
      (dict(save_checkpoints_secs=120, save_checkpoints_steps=None), 120, 0),
      (dict(save_checkpoints_secs=None), 0, 0),  # None: no mid-epoch checkpoint.
      (dict(save_checkpoints_steps=None), 0, 0),
      (dict(save_checkpoints_secs=None, save_checkpoints_steps=None), 0, 0),
      (dict(save_checkpoints_secs=0), 0, 0),
  ])
  def test_save_checkpoints_map_to_the_mid_epoch_period(self, kwargs, secs, steps):
    config = estimator_ext.EpochSyncRunConfig("/tmp/x", **kwargs)
    assert (config.settings.save_checkpoint_secs, config.settings.save_checkpoint_steps) == (
        secs, steps)
    # RunConfig's own stay None: stock's CheckpointSaverHook must not save mid-epoch.
    assert config.save_checkpoints_secs is None and config.save_checkpoints_steps is None

  def test_save_checkpoints_override_the_flags_and_settings(self, parse):
    parse("--epochsync_save_checkpoint_secs=0", "--epochsync_save_checkpoint_steps=7")
    config = estimator_ext.EpochSyncRunConfig("/tmp/x")
    assert (config.settings.save_checkpoint_secs, config.settings.save_checkpoint_steps) == (0, 7)
    config = estimator_ext.EpochSyncRunConfig("/tmp/x", save_checkpoints_secs=30)
    assert (config.settings.save_checkpoint_secs, config.settings.save_checkpoint_steps) == (30, 0)
    given = EpochSyncSettings(save_checkpoint_secs=0, save_checkpoint_steps=3)
    config = estimator_ext.EpochSyncRunConfig("/tmp/x", settings=given)
    assert config.settings == given
    config = estimator_ext.EpochSyncRunConfig("/tmp/x", settings=given, save_checkpoints_secs=None)
    assert (config.settings.save_checkpoint_secs, config.settings.save_checkpoint_steps) == (0, 0)


def dataclass_with(settings, **changes):
  import dataclasses
  return dataclasses.replace(settings, **changes)


class TestEarlyStopping:

  @pytest.mark.parametrize("kwargs, rule", [
      (dict(patience=0), r"patience=0 must be an integer >= 1"),
      (dict(mode="avg"), r"mode='avg' must be 'min' \(lower is better\) or 'max'"),
      (dict(min_delta=-1.0), r"min_delta=-1.0 must be a finite number >= 0"),
      (dict(metric=""), r"metric='' must be the name of an eval metric"),
  ])
  def test_rejects_bad_rules(self, kwargs, rule):
    with pytest.raises(ConfigError, match=rule):
      EarlyStopping(**kwargs)

  def test_min_delta_and_patience_boundaries(self):
    state = EarlyStoppingState(EarlyStopping("loss", patience=2, min_delta=0.1))
    assert state.update(0, {"loss": 1.0}) is None            # first: best
    assert state.update(1, {"loss": 0.90000001}) is None     # 0.09999999 <= 0.1: 1 without
    assert state.update(2, {"loss": 0.85}) is None           # 0.15 > 0.1: new best, reset
    assert state.update(3, {"loss": 0.76}) is None           # 0.09: 1 without improvement
    reason = state.update(4, {"loss": 0.751})                # 0.099: 2 = patience
    assert reason and reason.startswith("early stopping: loss=0.751 in epoch 4; no epoch since "
                                        "epoch 2 (loss=0.85) was lower by more than")
    assert (state.best_epoch, state.epochs_without_improvement) == (2, 2)

  def test_max_mode_and_a_missing_metric(self):
    state = EarlyStoppingState(EarlyStopping("auc", mode="max"))
    assert state.update(0, {"auc": 0.7}) is None and state.update(1, {"auc": 0.71}) is None
    assert "was higher by more than" in state.update(2, {"auc": 0.70})
    with pytest.raises(ConfigError, match=r"metric 'auc' is not among the eval metrics "
                                          r"\['loss'\]; set EarlyStopping\(metric=...\)"):
      state.update(3, {"loss": 1.0})


class TestSyncOptimizer:

  def _minimize(self, opt, **kwargs):
    w = v1.get_variable("w", [2], initializer=v1.zeros_initializer())
    return opt.minimize(tf.reduce_sum(w * w), **kwargs)

  def test_synchronous_only_in_a_training_graph_with_sync_on(self):
    sgd = v1.train.GradientDescentOptimizer(0.1)
    opt = estimator_ext.sync_optimizer(sgd)
    assert isinstance(opt, v1.train.Optimizer)
    with tf.Graph().as_default() as g:  # Not train_and_evaluate's: sgd applies as it is.
      self._minimize(opt, global_step=v1.train.get_or_create_global_step())
      assert optimizer_lib.sync_optimizers(g) == []
    with tf.Graph().as_default() as g:
      optimizer_lib.mark_training_graph(g, sync=False, num_workers=3, worker_id=1,
                                        worker_names=("chief:0", "worker:0", "worker:1"))
      self._minimize(opt)
      assert optimizer_lib.sync_optimizers(g) == []

  def test_each_optimizer_of_a_graph_gets_its_own_name_and_step(self):
    with tf.Graph().as_default() as g:
      v1.train.get_or_create_global_step()
      optimizer_lib.mark_training_graph(g, sync=True, num_workers=3, worker_id=2,
                                        worker_names=("chief:0", "worker:0", "worker:1"),
                                        divide_by_initial_workers=True)
      a = v1.get_variable("a", [2], initializer=v1.zeros_initializer())
      b = v1.get_variable("b", [2], initializer=v1.zeros_initializer())
      loss = tf.reduce_sum(a * b)
      opt = estimator_ext.sync_optimizer(v1.train.AdagradOptimizer(0.1))
      with tf.name_scope("head"):  # Like a canned head: no global_step for either.
        opt.minimize(loss, var_list=[a])
        opt.minimize(loss, var_list=[b])
      built = optimizer_lib.sync_optimizers(g)
      assert [o.get_name() for o in built] == ["epochsync_sync_0", "epochsync_sync_1"]
      assert [o.sync_ops.step.op.name for o in built] == ["epochsync_sync_0/sync_step",
                                                         "epochsync_sync_1/sync_step"]
      # The saved state, as docs/migration.md names it: not under the head's scope.
      saved = sorted(v.op.name for v in v1.global_variables() if "epochsync" in v.op.name)
      assert saved == [f"epochsync_sync_{k}/{n}" for k in (0, 1)
                       for n in ("completed_epochs", "progress", "sync_step")]
      assert [(o.num_workers, o.worker_id) for o in built] == [(3, 2), (3, 2)]
      assert built[0]._divide_by_initial  # pylint: disable=protected-access

  def test_two_with_the_same_name_and_a_keras_optimizer_are_rejected(self):
    with tf.Graph().as_default() as g:
      optimizer_lib.mark_training_graph(g, sync=True, num_workers=1, worker_id=0,
                                        worker_names=("chief:0",))
      w = v1.get_variable("w", [2], initializer=v1.zeros_initializer())
      estimator_ext.sync_optimizer(v1.train.AdamOptimizer(), name="same").minimize(w[0] ** 2)
      with pytest.raises(ConfigError, match=r"two synchronous optimizers are named 'same'.*give "
                                            r"each sync_optimizer\(opt, name=...\) its own name"):
        estimator_ext.sync_optimizer(v1.train.AdamOptimizer(), name="same").minimize(w[1] ** 2)
    with pytest.raises(ConfigError, match=r"is not a tf.compat.v1.train.Optimizer; pass a "
                                          r"tf.compat.v1.train optimizer"):
      estimator_ext.sync_optimizer(tf.keras.optimizers.SGD())


# --- train_and_evaluate: errors before any session --------------------------------------

def _model_fn(features, labels, mode):
  w = v1.get_variable("w", [2], initializer=v1.zeros_initializer())
  loss = tf.reduce_mean(tf.square(tf.linalg.matvec(features, w) - labels))
  train_op = v1.train.GradientDescentOptimizer(0.1).minimize(
      loss, global_step=v1.train.get_global_step())  # Not wrapped: no sync_optimizer.
  return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def _input_fn(repeat=False):
  def input_fn():
    data = tf.data.Dataset.from_tensor_slices((np.ones((4, 2), np.float32),
                                               np.ones(4, np.float32))).batch(2)
    return data.repeat() if repeat else data
  return input_fn


def _train_and_evaluate(config, train_input_fn=None, model_dir=None, **train_spec):
  estimator = v1.estimator.Estimator(_model_fn, model_dir=model_dir, config=config)
  return estimator_ext.train_and_evaluate(
      estimator, tf.estimator.TrainSpec(train_input_fn or _input_fn(), **train_spec),
      tf.estimator.EvalSpec(_input_fn(), steps=None))


class TestTrainAndEvaluateErrors:

  def test_needs_an_epoch_sync_run_config_and_no_max_steps(self, tmp_path):
    with pytest.raises(ConfigError, match=r"(?s)2 problem.*the estimator's config is a RunConfig: "
                                          r"build the Estimator with config=estimator_ext."
                                          r"EpochSyncRunConfig.*remove max_steps"):
      _train_and_evaluate(tf.estimator.RunConfig(str(tmp_path)), max_steps=100)

  def test_a_repeated_dataset_is_rejected(self, tmp_path):
    with pytest.raises(ConfigError, match=r"returned an infinite \(repeated\) dataset on worker:0"
                                          r".*remove .repeat\(\), EpochSyncRunConfig\(num_epochs"):
      _train_and_evaluate(estimator_ext.EpochSyncRunConfig(str(tmp_path)), _input_fn(True))
    assert not tf.io.gfile.glob(str(tmp_path / "model.ckpt*"))

  def test_an_input_fn_returning_tensors_is_rejected(self, tmp_path):
    def tensors():
      return tf.ones([2, 2]), tf.ones([2])
    with pytest.raises(ConfigError, match=r"returned a tuple on worker:0: it must return a "
                                          r"tf.data.Dataset holding one pass"):
      _train_and_evaluate(estimator_ext.EpochSyncRunConfig(str(tmp_path)), tensors)

  def test_a_distributed_job_needs_a_model_dir(self, monkeypatch):
    set_tf_config(monkeypatch, "worker", 0)
    with pytest.raises(ConfigError, match=r"model_dir is missing in a distributed job: Estimator "
                                          r"fell back to its own temporary directory .*; pass "
                                          r"model_dir= \(storage every task sees\)"):
      _train_and_evaluate(estimator_ext.EpochSyncRunConfig())

  def test_sync_on_needs_a_wrapped_optimizer(self, monkeypatch, tmp_path):
    set_tf_config(monkeypatch, "worker", 0)  # Fails while building the graph: no server yet.
    with pytest.raises(ConfigError, match=r"sync is on but model_fn built no synchronous "
                                          r"optimizer: wrap its optimizer, optimizer = "
                                          r"estimator_ext.sync_optimizer\(optimizer\)"):
      _train_and_evaluate(estimator_ext.EpochSyncRunConfig(str(tmp_path)))

  def test_a_checkpoint_saver_hook_is_rejected(self, tmp_path):
    saver = v1.train.CheckpointSaverHook(str(tmp_path), save_steps=1)
    with pytest.raises(ConfigError, match=r"TrainSpec.hooks has a CheckpointSaverHook: it would "
                                          r"save mid-epoch.*remove it \(for periodic saves pass "
                                          r"EpochSyncRunConfig\(save_checkpoints_secs=..."):
      _train_and_evaluate(estimator_ext.EpochSyncRunConfig(str(tmp_path)), hooks=[saver])

  def test_evaluator_settings_that_disagree_with_the_chiefs(self, monkeypatch, tmp_path):
    set_tf_config(monkeypatch, "chief")
    evaluator_lib.write_run_record(str(tmp_path), estimator_ext.EpochSyncRunConfig(
        str(tmp_path), num_epochs=3))
    set_tf_config(monkeypatch, "evaluator")
    with pytest.raises(ConfigError, match=r"(?s)2 problem.*num_epochs=5 on evaluator:0 but 3 on "
                                          r"chief:0 \(from .*epochsync_run.json\); start every "
                                          r"task with the same --epochsync_num_epochs.*sync=False "
                                          r"on evaluator:0 but True on chief:0"):
      _train_and_evaluate(estimator_ext.EpochSyncRunConfig(str(tmp_path), num_epochs=5,
                                                           sync=False))


def _sync_model_fn(features, labels, mode):
  w = v1.get_variable("w", [2], initializer=v1.zeros_initializer())
  loss = tf.reduce_mean(tf.square(tf.linalg.matvec(features, w) - labels))
  optimizer = estimator_ext.sync_optimizer(v1.train.GradientDescentOptimizer(0.1))
  train_op = optimizer.minimize(loss, global_step=v1.train.get_global_step())
  return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


class TestTrainingHooks:

  @pytest.mark.parametrize("task_type", ["chief", "worker"])
  def test_the_run_start_comes_before_the_sync_optimizers_hook(self, monkeypatch, tmp_path,
                                                                task_type):
    """The chief's reset of the ps-side accumulators must not follow the sync hook's chief init:
    it advances their step, and the first step's gradients were dropped (the job hung)."""
    from estimator_ext import task_hooks, training_graph
    set_tf_config(monkeypatch, task_type)  # Builds the graph and hooks only: no server.
    config = estimator_ext.EpochSyncRunConfig(str(tmp_path), save_checkpoints_steps=7)
    estimator = v1.estimator.Estimator(_sync_model_fn, config=config)
    train_spec = tf.estimator.TrainSpec(_input_fn())
    given = []
    real_epoch_sync_hooks = task_hooks.epoch_sync_hooks
    monkeypatch.setattr(task_hooks, "epoch_sync_hooks", lambda *args, **kwargs: (
        given.append((args, kwargs)) or real_epoch_sync_hooks(*args, **kwargs)))
    with tf.Graph().as_default() as g, g.device(estimator._device_fn):
      epoch_input, spec, sync_opts = training_graph.build_graph(estimator, train_spec, config, g,
                                                           sync=True)
      hooks, _, _ = task_hooks.session_hooks(estimator, train_spec,
                                            tf.estimator.EvalSpec(_input_fn()), config,
                                            epoch_input, spec, sync_opts)
    kinds = [type(h).__name__ for h in hooks]
    restore = ["MidEpochRestoreHook"] if config.is_chief else []  # before the run starts
    first = ["RecoveryGuardHook"] + restore + ["RunStartHook", "SafeSyncTokensHook"]
    assert kinds[:len(first)] == first, kinds
    # The epoch hooks get the settings' mid-epoch period and the sync hook (the mid-epoch save
    # goes between its aggregations), and the sync hook is listed once.
    (args, kwargs), = given
    assert args[2].save_checkpoint_steps == 7 and args[2].save_checkpoint_secs == 0
    assert kwargs["sync_hook"] is hooks[len(first) - 1]
    assert kinds.count("SafeSyncTokensHook") == 1
    assert kinds.count("RunStartHook") == 1 and kinds[-1] == "EpochDriverHook"
    assert kinds.index("WorkerDoneHook") < kinds.index("EpochBarrierHook")
    # The chief's step counter must not take a read that raced the sync update for a stuck step.
    assert "StepCounterHook" not in kinds
    assert kinds.count("SyncStepCounterHook") == (task_type == "chief"), kinds


  @pytest.mark.parametrize("tf_random_seed, flagged", [(None, 1), (3, 0)])
  def test_run_config_tf_random_seed_seeds_the_input_fns_shuffle(self, tmp_path,
                                                                 tf_random_seed, flagged):
    """What hooks.data.determinism's warning tells Estimator users: RunConfig(tf_random_seed=N)
    makes an input_fn's unseeded shuffle repeat its order on a rerun."""
    from estimator_ext import training_graph
    from hooks.data import determinism
    built = []

    def input_fn():
      built.append(tf.data.Dataset.from_tensor_slices((np.ones((4, 2), np.float32),
                                                       np.ones(4, np.float32))).shuffle(4))
      return built[-1].batch(2)

    config = estimator_ext.EpochSyncRunConfig(str(tmp_path), tf_random_seed=tf_random_seed)
    estimator = v1.estimator.Estimator(_model_fn, config=config)
    with tf.Graph().as_default() as g:
      training_graph.build_graph(estimator, tf.estimator.TrainSpec(input_fn), config, g, sync=False)
      assert len(determinism.nondeterministic_stages(built[-1])) == flagged


# --- the evaluator loop, with a fake Estimator and an injected clock ----------------------

class _FakeEstimator:
  """Records which checkpoints were evaluated; `loss` is 1 / (epoch + 1)."""

  def __init__(self, model_dir):
    self.model_dir, self.evaluated = model_dir, []

  def eval_dir(self, name=None):
    return os.path.join(self.model_dir, "eval" if not name else "eval_" + name)

  def evaluate(self, input_fn, steps, hooks, checkpoint_path, name):
    del input_fn, steps, hooks, name
    self.evaluated.append(os.path.basename(checkpoint_path))
    step = int(checkpoint_path.rsplit("-", 1)[1])
    return {"loss": np.float32(1.0 / (1 + step // 10)), "global_step": np.int64(step)}


class _Clock:
  def __init__(self):
    self.now = 100.0

  def __call__(self):
    return self.now

  def sleep(self, secs):
    self.now += secs


def _chief_wrote(model_dir, epochs, early_stop_at=None, delete=()):
  """The chief's run record, audit lines and (empty) checkpoint index files for `epochs`."""
  lines = []
  for e in epochs:
    ckpt = os.path.join(model_dir, f"model.ckpt-epoch{e:04d}-{10 * (e + 1)}")
    if e not in delete:
      open(ckpt + ".index", "w").close()
    line = {"epoch": e, "global_step": 10 * (e + 1), "checkpoint": ckpt, "workers": {}}
    if e == early_stop_at:
      line["early_stop"] = "early stopping: test"
    lines.append(json.dumps(line))
  with open(os.path.join(model_dir, AUDIT_FILENAME), "w") as f:
    f.write("".join(l + "\n" for l in lines))


class _Exporter(tf.estimator.Exporter):
  """Records (checkpoint, is_the_final_export) of every export."""

  def __init__(self):
    self.calls = []

  @property
  def name(self):
    return "recorder"

  def export(self, estimator, export_path, checkpoint_path, eval_result, is_the_final_export):
    self.calls.append((os.path.basename(checkpoint_path), is_the_final_export))
    return export_path.encode()


@pytest.fixture
def evaluator(monkeypatch, tmp_path):
  """(run(num_epochs) -> eval lines, fake estimator, clock) of an evaluator task on tmp_path."""
  model_dir, clock = str(tmp_path), _Clock()
  estimator = _FakeEstimator(model_dir)
  estimator.exporter = _Exporter()
  spec = tf.estimator.EvalSpec(lambda: None, steps=None, exporters=[estimator.exporter])

  def run(num_epochs, write_record=True, liveness=None, progress=None, **kwargs):
    set_tf_config(monkeypatch, "chief")
    chief = estimator_ext.EpochSyncRunConfig(model_dir, num_epochs=num_epochs)
    if write_record:
      evaluator_lib.write_run_record(model_dir, chief)
    set_tf_config(monkeypatch, "evaluator")
    config = estimator_ext.EpochSyncRunConfig(model_dir, num_epochs=num_epochs, **kwargs)
    assert evaluator_lib.chief_monitor(config).addresses == {
        "chief:0": "localhost:1", "worker:0": "localhost:2", "worker:1": "localhost:3"}
    return evaluator_lib.run_evaluator(estimator, spec, config, liveness=liveness, clock=clock,
                                       sleep=clock.sleep, progress=progress)
  return run, estimator, clock


class TestEvaluatorLoop:

  def test_every_epoch_once_in_order_then_resumes_after_the_logged_ones(self, evaluator,
                                                                        tmp_path):
    run, estimator, _ = evaluator
    _chief_wrote(str(tmp_path), [0, 1, 2])
    lines = run(3)
    assert estimator.evaluated == ["model.ckpt-epoch0000-10", "model.ckpt-epoch0001-20",
                                   "model.ckpt-epoch0002-30"]
    assert [(l["epoch"], l["global_step"], l["metrics"]["loss"]) for l in lines] == [
        (0, 10, 0.5), (1, 20, pytest.approx(1 / 3)), (2, 30, 0.25)]
    assert [l["epoch"] for l in estimator_ext.read_eval_log(str(tmp_path))] == [0, 1, 2]
    assert estimator.exporter.calls == [(c, i == 2) for i, c in enumerate(estimator.evaluated)]
    assert lines[0]["exports"] == [os.path.join(str(tmp_path), "export", "recorder")]
    assert run(3) == [] and len(estimator.evaluated) == 3  # A restart re-evaluates nothing.

  def test_stops_after_the_epoch_the_chief_stopped_early_at(self, evaluator, tmp_path):
    run, estimator, clock = evaluator
    _chief_wrote(str(tmp_path), [0, 1], early_stop_at=1)
    lines = run(5)
    assert [l["epoch"] for l in lines] == [0, 1] and lines[1]["early_stop"]
    assert [final for _, final in estimator.exporter.calls] == [False, True]
    assert clock.now == 100.0  # It did not wait for epochs 2..4.

  def test_times_out_naming_the_chief_and_the_epoch(self, evaluator, tmp_path):
    run, estimator, clock = evaluator
    _chief_wrote(str(tmp_path), [0])
    with pytest.raises(estimator_ext.EvaluatorTimeoutError, match=(
        r"evaluator:0 timed out after 5 s \(limit 5 s\) waiting for epoch 1's checkpoint in "
        r".*: chief:0 saved epochs \[0\]; missing chief:0 \(check its log, that every task has "
        r"the same model_dir, or raise EpochSyncRunConfig\(evaluator_timeout_secs=...\)\)")) as e:
      run(2, evaluator_timeout_secs=5)
    assert e.value.missing == ("chief:0",) and estimator.evaluated == ["model.ckpt-epoch0000-10"]
    assert 105.0 <= clock.now <= 106.0

  @staticmethod
  def _training(clock, until, then=lambda: None):
    """A heartbeat reader: worker:1 takes a step every fake second until `until`, then `then()`."""
    def read():
      rows = np.zeros([3, 5], np.int64)
      rows[:, 0] = int(clock.now)  # beats
      rows[2, 2] = int(min(clock.now, until))  # worker:1's batch
      if clock.now >= until:
        then()
      return rows
    return read

  def test_waits_past_its_timeout_while_training_makes_progress(self, evaluator, tmp_path):
    run, estimator, clock = evaluator
    _chief_wrote(str(tmp_path), [0])
    # Epoch 1 lasts 40 s; its checkpoint comes at 140 s. The timeout is 5 s.
    lines = run(2, evaluator_timeout_secs=5, progress=self._training(
        clock, 140, lambda: _chief_wrote(str(tmp_path), [0, 1])))
    assert [l["epoch"] for l in lines] == [0, 1] and 140 <= clock.now < 142

  def test_times_out_once_training_makes_no_progress(self, evaluator, tmp_path):
    run, _, clock = evaluator
    _chief_wrote(str(tmp_path), [0])
    with pytest.raises(estimator_ext.EvaluatorTimeoutError, match=(
        r"evaluator:0 timed out after 2\d s, the last 5 s without progress of the training "
        r"tasks, \(limit 5 s\) waiting for epoch 1's checkpoint .*: chief:0 saved epochs \[0\]; "
        r"chief:0 epoch 0 batch 0, 0.0 batches/s; .*worker:1 epoch 0 batch 120, .*; missing "
        r"chief:0")):
      run(2, evaluator_timeout_secs=5, progress=self._training(clock, 120))
    assert 125 <= clock.now < 127

  def test_a_chief_that_dies_is_named_within_seconds(self, evaluator, tmp_path):
    from hooks.errors import TaskDiedError
    from hooks.faults.liveness import LivenessMonitor, Probe
    run, estimator, clock = evaluator
    _chief_wrote(str(tmp_path), [0])
    answers = iter([Probe("up", 7)] + [Probe("down", None, "UNAVAILABLE: refused")] * 10)
    monitor = LivenessMonitor({"chief:0": "localhost:1"}, "evaluator:0",
                              probe=lambda address, timeout: next(answers), clock=clock)
    with pytest.raises(TaskDiedError, match=r"chief:0 died while evaluator:0 waited for it for "
                                            r"epoch 1's checkpoint: its server at localhost:1 is "
                                            r"gone: UNAVAILABLE: refused"):
      run(3, liveness=monitor)
    assert estimator.evaluated == ["model.ckpt-epoch0000-10"] and clock.now < 103.0

  def test_times_out_when_the_chief_never_starts(self, evaluator):
    run, _, _ = evaluator
    with pytest.raises(estimator_ext.EvaluatorTimeoutError, match=(
        r"waiting for chief:0's run record in .*: chief:0 has not started training; missing "
        r"chief:0 .*raise --epochsync_startup_timeout_secs")):
      run(2, write_record=False, startup_timeout_secs=3)

  def test_training_tasks_that_failed_before_the_run_record_are_named_within_a_second(
      self, evaluator, tmp_path):
    """Every training task failed before its server was up: no probe ever saw it, yet the
    evaluator (startup timeout 600 s) gives up at its first poll, naming each and its error."""
    from estimator_ext import exit_record
    from hooks.errors import TaskDiedError
    from hooks.faults.liveness import LivenessMonitor, Probe
    run, _, clock = evaluator
    for task in ("chief:0", "worker:0", "worker:1"):
      exit_record.write(str(tmp_path), task, ValueError(f"bad input_fn on {task}"))
    probes = []
    monitor = LivenessMonitor(
        {"chief:0": "c", "worker:0": "w0", "worker:1": "w1"}, "evaluator:0", clock=clock,
        probe=lambda address, timeout: probes.append(address) or Probe("down", None, "refused"))
    with pytest.raises(TaskDiedError, match=(
        r"evaluator:0 stopped waiting for chief:0's run record in .*: training task\(s\) "
        r"chief:0, worker:0, worker:1 failed \(chief:0: ValueError: bad input_fn on chief:0; "
        r"worker:0: ValueError: .*; fix that and restart the whole job")) as e:
      run(2, write_record=False, liveness=monitor, startup_timeout_secs=600)
    assert e.value.task == "chief:0" and clock.now < 101.0 and set(probes) == {"c", "w0", "w1"}

  def test_a_failure_of_an_earlier_run_or_of_a_restarted_task_is_not_the_end(self, evaluator,
                                                                             tmp_path):
    """A record older than the evaluator and the run record, or of a task that answers again."""
    from estimator_ext import exit_record
    from hooks.faults.liveness import LivenessMonitor, Probe
    run, estimator, _ = evaluator
    exit_record.write(str(tmp_path), "worker:0", ValueError("old"))
    records = exit_record.read_all(str(tmp_path))
    with open(os.path.join(str(tmp_path), "epochsync_failed-worker-0.json"), "w") as f:
      json.dump(dict(records["worker:0"], written_at=1.0), f)  # long before this run
    exit_record.write(str(tmp_path), "worker:1", ValueError("restarted since"))
    _chief_wrote(str(tmp_path), [0])
    monitor = LivenessMonitor({"chief:0": "c", "worker:0": "w0", "worker:1": "w1"},
                              "evaluator:0", probe=lambda address, timeout: Probe("up", 7))
    with pytest.raises(estimator_ext.EvaluatorTimeoutError):  # It waited, as for a live job.
      run(2, liveness=monitor, evaluator_timeout_secs=3)
    assert estimator.evaluated == ["model.ckpt-epoch0000-10"]
    exit_record.clear(str(tmp_path), "worker:1")
    assert list(exit_record.read_all(str(tmp_path))) == ["worker:0"]

  @pytest.mark.parametrize("audit_names_checkpoints", [True, False])
  def test_never_evaluates_a_mid_epoch_checkpoint_even_a_newer_one(
      self, evaluator, tmp_path, audit_names_checkpoints):
    """Mid-epoch checkpoints live in <model_dir>/mid_epoch/ with their own state file; they are
    named like epoch checkpoints (model.ckpt-epoch0001-<step>: saved in epoch 1), so only their
    directory tells them apart. Without the audit's checkpoint path the evaluator looks them up."""
    run, estimator, _ = evaluator
    model_dir = str(tmp_path)
    _chief_wrote(model_dir, [0, 1])
    if not audit_names_checkpoints:  # The evaluator then finds each epoch's file itself.
      path = os.path.join(model_dir, AUDIT_FILENAME)
      with open(path) as f:
        lines = [dict(json.loads(l), checkpoint=None) for l in f]
      with open(path, "w") as f:
        f.write("".join(json.dumps(l) + "\n" for l in lines))
    mid_epoch = os.path.join(model_dir, "mid_epoch")
    os.makedirs(mid_epoch)
    newer = []
    for epoch, step in ((0, 15), (1, 25), (1, 28), (2, 35)):  # Each after its epoch's save.
      newer.append(os.path.join(mid_epoch, f"model.ckpt-epoch{epoch:04d}-{step}"))
      open(newer[-1] + ".index", "w").close()
    with open(os.path.join(mid_epoch, "checkpoint"), "w") as f:
      f.write(f'model_checkpoint_path: "{newer[-1]}"\n')
    for path in newer:
      os.utime(path + ".index", (4e9, 4e9))  # Newer than every epoch checkpoint.
    lines = run(2)
    assert estimator.evaluated == ["model.ckpt-epoch0000-10", "model.ckpt-epoch0001-20"]
    assert [(l["epoch"], l["global_step"]) for l in lines] == [(0, 10), (1, 20)]
    assert [c for c, _ in estimator.exporter.calls] == estimator.evaluated

  def test_a_deleted_checkpoint_says_raise_keep_checkpoint_max(self, evaluator, tmp_path):
    run, _, _ = evaluator
    _chief_wrote(str(tmp_path), [0, 1], delete=(0,))
    with pytest.raises(ConfigError, match=r"epoch 0's checkpoint .* was deleted before it was "
                                          r"evaluated.*raise keep_checkpoint_max"):
      run(2)


# --- the documented jobs ---------------------------------------------------------------------

def _code(path):
  """A module's text without its docstring (the only part the two examples may differ in)."""
  with open(os.path.join(ROOT, path)) as f:
    text = f.read()
  return text[text.index('"""', 3) + 3:].splitlines(keepends=True)


def test_docs_diff_is_the_real_diff_of_a_handful_of_lines():
  diff = list(difflib.unified_diff(_code("examples/estimator_before.py"),
                                   _code("examples/estimator_train.py"),
                                   "examples/estimator_before.py", "examples/estimator_train.py",
                                   n=1))
  changed = [l for l in diff[2:] if l[0] in "+-" and l.strip() not in "+-"]
  assert len(changed) <= 8, "".join(diff)
  with open(os.path.join(ROOT, "docs", "estimator.md")) as f:
    docs = f.read()
  block = re.search(r"```diff\n(.*?)```", docs, re.S)
  assert block and block.group(1) == "".join(diff), "update docs/estimator.md:\n" + "".join(diff)


def _run_local(args, tmp_path):
  env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
  env["PYTHONPATH"] = ROOT
  env["TF_CPP_MIN_LOG_LEVEL"] = "1"
  proc = subprocess.run([sys.executable] + args, cwd=ROOT, env=env, capture_output=True,
                        text=True, timeout=100)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  return proc


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_local_mode_returns_one_result_per_epoch(tmp_path):
  """No TF_CONFIG: one process trains 3 epochs of its 3 batches, saving and evaluating each."""
  from hooks.epoch.audit import read_audit
  from hooks.testing import oracle
  from examples import estimator_data as example
  model_dir = str(tmp_path / "model")
  _run_local([os.path.join("tests", "tasks", "estimator_task.py"), f"--model_dir={model_dir}",
              "--shard_batches=3", "--epochsync_num_epochs=3"], tmp_path)
  with open(os.path.join(model_dir, "summary-worker-0.json")) as f:
    summary = json.load(f)
  x, y = example.shard_arrays(0, 3)
  eval_x, eval_y = example.shard_arrays(example.EVAL_SHARD, example.EVAL_BATCHES)
  batches = [[(x[i:i + 8], y[i:i + 8]) for i in range(0, 24, 8)]]
  want = []
  for e in range(3):
    p, _ = oracle.lockstep_sgd({"w": np.zeros(16), "b": np.zeros(())}, batches,
                               oracle.linear_mse_gradients, 0.05, num_epochs=e + 1)
    want.append(float(np.mean((eval_x @ p["w"] + p["b"] - eval_y) ** 2)))
  per_epoch = summary["per_epoch"]
  assert sorted(per_epoch) == ["0", "1", "2"] and summary["epochs_trained"] == [0, 1, 2]
  assert [per_epoch[str(e)]["global_step"] for e in range(3)] == [3, 6, 9]
  np.testing.assert_allclose([per_epoch[str(e)]["loss"] for e in range(3)], want, rtol=1e-4)
  assert summary["metrics"] == per_epoch["2"]  # The stock return value: the last evaluation.
  assert [line["global_step"] for line in read_audit(model_dir)] == [3, 6, 9]
  assert len(tf.io.gfile.glob(os.path.join(model_dir, "model.ckpt-*.index"))) == 3


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_local_early_stop_then_a_relaunch_trains_nothing_more(tmp_path):
  """min_delta=100: epoch 1 cannot improve on epoch 0, so training stops after epoch 1 of 6."""
  from hooks.epoch.audit import read_audit
  model_dir = str(tmp_path / "model")
  args = [os.path.join("tests", "tasks", "estimator_task.py"), f"--model_dir={model_dir}",
          "--shard_batches=2", "--epochsync_num_epochs=6", "--early_stopping_patience=1",
          "--early_stopping_min_delta=100"]
  summaries = []
  for _ in range(2):
    _run_local(args, tmp_path)
    with open(os.path.join(model_dir, "summary-worker-0.json")) as f:
      summaries.append(json.load(f))
  assert [(s["epochs_trained"], s["stopped_after"]) for s in summaries] == [([0, 1], 1), ([], 1)]
  assert sorted(summaries[1]["per_epoch"]) == ["0", "1"]
  audit = read_audit(model_dir)
  assert [line["epoch"] for line in audit] == [0, 1] and "min_delta=100" in audit[1]["early_stop"]
  assert len(tf.io.gfile.glob(os.path.join(model_dir, "model.ckpt-*.index"))) == 2


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_the_before_job_runs_on_stock_tensorflow(tmp_path):
  """examples/estimator_before.py (the "before" of the docs) trains repeat(2) x 3 batches."""
  model_dir = str(tmp_path / "before")
  _run_local(["-m", "examples.estimator_before", f"--model_dir={model_dir}",
              "--shard_batches=3", "--num_epochs=2"], tmp_path)
  assert tf.train.load_variable(tf.train.latest_checkpoint(model_dir), "global_step") == 6
  assert tf.io.gfile.glob(os.path.join(model_dir, "eval", "events.out.tfevents.*"))


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_custom_model_fn_gets_sparse_features_and_trains_as_stock_estimator_train(tmp_path):
  """Issue 19: parsed tf.Example files (SparseTensors, an empty file, a short last batch) reach a
  custom model_fn unchanged (safe_embedding_lookup_sparse, shared embedding and crossed
  columns); local mode's 2 epochs equal stock Estimator.train called twice."""
  from examples import ctr_data
  paths = ctr_data.write_files(str(tmp_path / "data"), [7, 0, 5])  # batches of 3: 3,3,3,3
  spec = {"ad": tf.io.VarLenFeature(tf.int64), "ad_weight": tf.io.VarLenFeature(tf.float32),
          "query": tf.io.VarLenFeature(tf.string), "site": tf.io.VarLenFeature(tf.string),
          "price": tf.io.FixedLenFeature([1], tf.float32),
          ctr_data.LABEL: tf.io.FixedLenFeature([1], tf.int64)}
  seen = []

  def model_fn(features, labels, mode):
    seen.append({k: isinstance(v, tf.SparseTensor) for k, v in features.items()})
    emb = v1.get_variable("ad_embedding", [ctr_data.AD_IDS, 2],
                          initializer=v1.constant_initializer(0.1))
    table = v1.get_variable("query_embedding", [8, 2], initializer=v1.constant_initializer(-0.2))
    b = v1.get_variable("bias", [], initializer=v1.zeros_initializer())
    query = features["query"]
    query = tf.SparseTensor(query.indices, tf.strings.to_hash_bucket_fast(query.values, 8),
                            query.dense_shape)
    fc = v1.feature_column  # columns on the same SparseTensors: shared and crossed
    site, words = (fc.categorical_column_with_hash_bucket(k, 8) for k in ("site", "query"))
    columns = fc.shared_embedding_columns([site, words], 2, initializer=v1.ones_initializer())
    columns.append(fc.indicator_column(fc.crossed_column(["site", "query"], 16)))
    x = (v1.nn.safe_embedding_lookup_sparse(emb, features["ad"], features["ad_weight"],
                                            combiner="sum") +
         v1.nn.safe_embedding_lookup_sparse(table, query, combiner="mean") +
         tf.reduce_sum(fc.input_layer(features, columns), 1, keepdims=True) * 0.01)
    loss = tf.reduce_mean(tf.square(tf.reduce_sum(x, 1) + features["price"][:, 0] + b -
                                    tf.cast(labels[:, 0], tf.float32)))
    optimizer = estimator_ext.sync_optimizer(v1.train.GradientDescentOptimizer(0.1))
    train_op = optimizer.minimize(loss, global_step=v1.train.get_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)

  def input_fn():
    return ctr_data.parsed_dataset(paths, 3, spec)

  ours = v1.estimator.Estimator(model_fn, config=estimator_ext.EpochSyncRunConfig(
      str(tmp_path / "ours"), num_epochs=2))
  result = estimator_ext.train_and_evaluate(ours, tf.estimator.TrainSpec(input_fn),
                                            tf.estimator.EvalSpec(input_fn, steps=None))
  assert seen[0] == {"ad": True, "ad_weight": True, "query": True, "site": True, "price": False}
  assert {e: m["global_step"] for e, m in result.per_epoch.items()} == {0: 4, 1: 8}
  stock = v1.estimator.Estimator(model_fn, model_dir=str(tmp_path / "stock"))
  for _ in range(2):
    stock.train(input_fn)
  got, want = ours.latest_checkpoint(), stock.latest_checkpoint()
  assert {n for n, _ in tf.train.list_variables(want)} == {
      "ad_embedding", "query_embedding", "bias", "global_step",
      "input_layer/query_site_shared_embedding/embedding_weights"}
  for name, _ in tf.train.list_variables(want):
    np.testing.assert_allclose(tf.train.load_variable(got, name),
                               tf.train.load_variable(want, name), rtol=0, atol=1e-6,
                               err_msg=name)
  assert np.abs(tf.train.load_variable(want, "ad_embedding") - 0.1).max() > 1e-2  # it trained
