"""One precedence on every path: argument > parsed flag > EPOCHSYNC_* variable > default.

The paths: hooks.flags.settings_from_flags, epoch_sync_hooks (hand-wired hooks), the drop-in
monitored_training_session, estimator_ext.EpochSyncRunConfig; with and without absl parsing,
and in a program that parses its own arguments with argparse.
"""

import json
import logging as py_logging
import os
import subprocess
import sys
import textwrap

from absl import flags
from absl.testing import flagsaver
import pytest
import tensorflow as tf

from hooks.config import flags as flags_lib
from hooks import log as log_lib
from hooks.config import setting_sources
from hooks.epoch.barrier import EpochBarrierHook
from hooks.config.cluster import ClusterConfig
from hooks.data.epoch_input import EpochInput
from hooks.session.wiring import epoch_sync_hooks
from hooks.errors import ConfigError
from hooks.epoch.progress import EpochProgressHook
from hooks.config.settings import EpochSyncSettings
from hooks.session.training_session import monitored_training_session
from tf_unit import graph, v1  # noqa: F401  (graph: a fresh graph per test)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FLAGS = flags.FLAGS
CLUSTER = {"chief": ["localhost:1"], "worker": ["localhost:2"], "ps": ["localhost:4"]}
CHIEF = ClusterConfig(CLUSTER, "chief", 0)


@pytest.fixture
def unparsed(monkeypatch):
  """absl's FLAGS never parsed (a job that does not use absl), no EPOCHSYNC_* nor TF_CONFIG."""
  for name in list(os.environ):
    if name.startswith("EPOCHSYNC_") or name == "TF_CONFIG":
      monkeypatch.delenv(name)
  was_parsed = FLAGS.is_parsed()
  with flagsaver.flagsaver():
    if was_parsed:
      FLAGS.unparse_flags()
    yield monkeypatch
    FLAGS.unparse_flags()
  if was_parsed:
    FLAGS(["prog"])


@pytest.fixture
def parsed(monkeypatch):
  """Parses argv into FLAGS (no EPOCHSYNC_* nor TF_CONFIG); the flags are restored after."""
  for name in list(os.environ):
    if name.startswith("EPOCHSYNC_") or name == "TF_CONFIG":
      monkeypatch.delenv(name)
  was_parsed = FLAGS.is_parsed()
  with flagsaver.flagsaver():
    yield lambda *argv: FLAGS(["prog", *argv])
  if not was_parsed:
    FLAGS.unparse_flags()


def _input():
  return EpochInput(tf.data.Dataset.range(6).batch(2), num_epochs=1, task_name="chief:0")


def _estimator_config(**kwargs):
  import estimator_ext  # pylint: disable=g-import-not-at-top; the Estimator half is optional
  return estimator_ext.EpochSyncRunConfig(**kwargs)


class TestEpochSyncRunConfig:

  @pytest.mark.estimator
  def test_the_variables_count_without_absl_parsing(self, unparsed, tmp_path):
    unparsed.setenv("EPOCHSYNC_NUM_EPOCHS", "2")
    unparsed.setenv("EPOCHSYNC_SYNC", "false")
    settings = _estimator_config(model_dir=str(tmp_path)).settings
    assert (settings.num_epochs, settings.sync) == (2, False)
    assert setting_sources.sources_of(settings)["num_epochs"] == "EPOCHSYNC_NUM_EPOCHS='2'"

  @pytest.mark.estimator
  def test_argument_over_flag_over_variable_over_default(self, parsed, monkeypatch, tmp_path):
    parsed("--epochsync_num_epochs=5", "--epochsync_barrier_timeout_secs=900")
    monkeypatch.setenv("EPOCHSYNC_NUM_EPOCHS", "2")
    monkeypatch.setenv("EPOCHSYNC_BARRIER_TIMEOUT_SECS", "300")
    monkeypatch.setenv("EPOCHSYNC_STEP_TIMEOUT_SECS", "45")
    settings = _estimator_config(model_dir=str(tmp_path), barrier_timeout_secs=700).settings
    assert (settings.barrier_timeout_secs, settings.num_epochs, settings.step_timeout_secs,
            settings.startup_timeout_secs) == (700, 5, 45, 600)
    assert {f: s for f, s in setting_sources.sources_of(settings).items()
            if f in ("barrier_timeout_secs", "num_epochs", "step_timeout_secs",
                     "startup_timeout_secs")} == {
        "barrier_timeout_secs": "argument", "num_epochs": "--epochsync_num_epochs",
        "step_timeout_secs": "EPOCHSYNC_STEP_TIMEOUT_SECS='45'",
        "startup_timeout_secs": "default"}

  @pytest.mark.estimator
  def test_a_settings_argument_wins_over_the_variables(self, unparsed, tmp_path):
    unparsed.setenv("EPOCHSYNC_NUM_EPOCHS", "2")
    config = _estimator_config(model_dir=str(tmp_path), settings=EpochSyncSettings(num_epochs=4),
                               sync=False)
    assert (config.settings.num_epochs, config.settings.sync) == (4, False)

  @pytest.mark.estimator
  def test_num_workers_from_the_variable_is_checked(self, unparsed):
    unparsed.setenv("EPOCHSYNC_NUM_WORKERS", "3")
    with pytest.raises(ConfigError, match=r"num_workers=3 but there is no TF_CONFIG cluster"):
      _estimator_config()

  @pytest.mark.estimator
  @pytest.mark.parametrize("env, match", [
      ({"EPOCHSYNC_SYNC": "nope"},
       r"EPOCHSYNC_SYNC='nope' is not a boolean: use true/false .*fix or unset the variable"),
      ({"EPOCHSYNC_NUM_EPOCHS": "0"},
       r"EPOCHSYNC_NUM_EPOCHS='0' is invalid: 0 is not a positive integer"),
      ({"EPOCHSYNC_WARN_AFTER_SECS": "100", "EPOCHSYNC_BARRIER_TIMEOUT_SECS": "50"},
       r"EPOCHSYNC_WARN_AFTER_SECS='100', EPOCHSYNC_BARRIER_TIMEOUT_SECS='50': "
       r"--epochsync_warn_after_secs=100.0 must be < --epochsync_barrier_timeout_secs=50.0")])
  def test_a_bad_variable_is_named_with_its_value_and_rule(self, unparsed, env, match):
    for name, value in env.items():
      unparsed.setenv(name, value)
    with pytest.raises(ConfigError, match=match):
      _estimator_config()

  @pytest.mark.estimator
  def test_an_argument_against_a_variable_names_both_sources(self, unparsed):
    unparsed.setenv("EPOCHSYNC_BARRIER_TIMEOUT_SECS", "80")
    with pytest.raises(ConfigError, match=r"warn_after_secs=100 must be < barrier_timeout_secs="
                                          r"80.0.*barrier_timeout_secs from "
                                          r"EPOCHSYNC_BARRIER_TIMEOUT_SECS='80', "
                                          r"warn_after_secs from argument"):
      _estimator_config(warn_after_secs=100)


class TestSettingsFromFlags:

  def test_arguments_win_over_flags_and_variables(self, parsed, monkeypatch):
    parsed("--epochsync_num_epochs=5")
    monkeypatch.setenv("EPOCHSYNC_SYNC", "false")
    settings = flags_lib.settings_from_flags(num_epochs=3, sync=None)
    assert (settings.num_epochs, settings.sync) == (3, False)

  def test_unknown_argument(self, parsed):
    parsed()
    with pytest.raises(ConfigError, match=r"unknown setting\(s\) num_epoch; the settings are"):
      flags_lib.settings_from_flags(num_epoch=3)

  def test_the_variables_count_without_absl_parsing(self, unparsed):
    unparsed.setenv("EPOCHSYNC_PROGRESS_SECS", "4")
    assert flags_lib.settings_from_flags().progress_secs == 4


class TestHandWiredHooks:

  def test_epoch_sync_hooks_default_to_the_variables(self, unparsed, graph):
    unparsed.setenv("EPOCHSYNC_BARRIER_TIMEOUT_SECS", "321")
    unparsed.setenv("EPOCHSYNC_PROGRESS_SECS", "7")
    built = epoch_sync_hooks(CHIEF, _input())
    barrier = next(h for h in built if isinstance(h, EpochBarrierHook))
    progress = next(h for h in built if isinstance(h, EpochProgressHook))
    assert barrier._timeout_secs == 321
    assert progress._every == 7

  def test_the_flag_wins_over_the_variable(self, parsed, monkeypatch, graph):
    parsed("--epochsync_barrier_timeout_secs=654")
    monkeypatch.setenv("EPOCHSYNC_BARRIER_TIMEOUT_SECS", "321")
    built = epoch_sync_hooks(CHIEF, _input())
    barrier = next(h for h in built if isinstance(h, EpochBarrierHook))
    assert barrier._timeout_secs == 654


class _Recorder:
  """Stands in for MonitoredSession: keeps the session creator."""

  def __init__(self, session_creator, hooks, stop_grace_period_secs):
    self.session_creator, self.hooks = session_creator, hooks


class TestDropIn:

  def test_argument_over_variable(self, unparsed, graph):
    unparsed.setattr(v1.train, "MonitoredSession", _Recorder)
    unparsed.setenv("EPOCHSYNC_STARTUP_TIMEOUT_SECS", "17")
    unparsed.setenv("EPOCHSYNC_SAVE_CHECKPOINT_SECS", "0")
    session = monitored_training_session(master="grpc://localhost:1", is_chief=True,
                                         epoch_input=_input(), cluster=CHIEF,
                                         checkpoint_dir=None)
    assert session.session_creator._startup_timeout == 17
    session = monitored_training_session(master="grpc://localhost:1", is_chief=True,
                                         epoch_input=_input(), cluster=CHIEF, max_wait_secs=5)
    assert session.session_creator._startup_timeout == 5


class TestSourcesLog:

  def test_the_chief_logs_each_source_once(self, unparsed, graph, caplog):
    unparsed.setenv("EPOCHSYNC_BARRIER_TIMEOUT_SECS", "123")
    unparsed.setattr(log_lib, "threshold", lambda: py_logging.INFO)  # Whatever absl's verbosity.
    with caplog.at_level(py_logging.INFO):
      epoch_sync_hooks(CHIEF, _input())
      epoch_sync_hooks(CHIEF, _input())
      epoch_sync_hooks(ClusterConfig(CLUSTER, "worker", 0), _input())
    lines = [r.getMessage() for r in caplog.records if "epoch-sync settings" in r.getMessage()]
    assert len(lines) == 1, lines
    assert lines[0].startswith("chief:0: epoch-sync settings (value <- source): num_epochs=1 "
                               "<- default, barrier_timeout_secs=123.0 <- "
                               "EPOCHSYNC_BARRIER_TIMEOUT_SECS='123', ")
    assert not [r for r in caplog.records if r.levelno >= py_logging.WARNING]


_ARGPARSE_JOB = textwrap.dedent("""
    import argparse, json, sys
    sys.path.insert(0, {root!r})
    parser = argparse.ArgumentParser()
    parser.add_argument("--model_dir")
    parser.add_argument("--epochs", type=int)  # None: not given
    args = parser.parse_args()
    from hooks.config import flags as epochsync_flags
    import estimator_ext
    config = estimator_ext.EpochSyncRunConfig(model_dir=args.model_dir, num_epochs=args.epochs)
    hooks_settings = epochsync_flags.settings_from_flags()
    print(json.dumps([config.settings.num_epochs, config.settings.sync,
                      config.settings.step_timeout_secs, hooks_settings.num_epochs,
                      hooks_settings.sync]))
""")


@pytest.mark.estimator
def test_an_argparse_program_is_configured_by_the_variables(tmp_path):
  """EpochSyncRunConfig(num_epochs=args.epochs): 4 from --epochs, the rest from the variables."""
  env = {k: v for k, v in os.environ.items() if not k.startswith("EPOCHSYNC_")}
  env.pop("TF_CONFIG", None)
  env.update(EPOCHSYNC_NUM_EPOCHS="2", EPOCHSYNC_SYNC="false", EPOCHSYNC_STEP_TIMEOUT_SECS="33",
             TF_CPP_MIN_LOG_LEVEL="2")
  script = tmp_path / "job.py"
  script.write_text(_ARGPARSE_JOB.format(root=ROOT))
  done = subprocess.run([sys.executable, str(script), f"--model_dir={tmp_path}", "--epochs=4"],
                        env=env, capture_output=True, text=True, timeout=240, check=False)
  assert done.returncode == 0, done.stderr[-3000:]
  assert json.loads(done.stdout.strip().splitlines()[-1]) == [4, False, 33.0, 2, False]
  assert "num_epochs=" in done.stderr and "<- EPOCHSYNC_SYNC='false'" in done.stderr
