"""Tests for hooks/config/flags.py: flag definitions, validators, and conversion to config objects."""

import json

from absl import flags
from absl.testing import flagsaver
import pytest

from hooks.config import flags as flags_lib
from hooks.config.settings import EpochSyncSettings
from hooks.errors import ConfigError

FLAGS = flags.FLAGS
SECS_FLAGS = ["epochsync_barrier_timeout_secs", "epochsync_startup_timeout_secs",
              "epochsync_step_timeout_secs", "epochsync_warn_after_secs",
              "epochsync_log_every_secs", "epochsync_progress_secs"]
CLUSTER_FLAGS = ["job_name", "task_index", "ps_hosts", "worker_hosts", "chief_hosts",
                 "evaluator_hosts"]
CLUSTER_ARGV = ["--job_name=worker", "--task_index=1", "--ps_hosts=p0:1,p1:1",
                "--worker_hosts=w0:1,w1:1", "--chief_hosts=c:1"]


def test_exports():
  assert set(flags_lib.__all__) == {
      "NUM_WORKERS", "NUM_EPOCHS", "BARRIER_TIMEOUT_SECS", "STARTUP_TIMEOUT_SECS",
      "STEP_TIMEOUT_SECS", "WARN_AFTER_SECS", "LOG_EVERY_SECS", "PROGRESS_SECS", "SYNC",
      "SAVE_CHECKPOINT_SECS", "SAVE_CHECKPOINT_STEPS", "UNIT_SEED", "UNIT_SHUFFLE",
      "CLAIM_TIMEOUT_SECS", "ELASTIC", "SPARE_WORKERS", "OPTIONAL_WORKERS",
      "MAX_WORKERS", "DIVIDE_BY_INITIAL_WORKERS", "define_cluster_flags", "cluster_from_flags",
      "settings_from_flags", "ENV_PREFIX", "EPOCHSYNC_FLAGS", "env_var", "apply_env"}


class TestEpochSyncFlags:

  def test_names_and_defaults(self, parse):
    parse()
    holders = [getattr(flags_lib, name) for name in flags_lib.__all__ if name.isupper() and
               isinstance(getattr(flags_lib, name), flags.FlagHolder)]
    assert len(holders) == len(flags_lib.EPOCHSYNC_FLAGS)
    assert all(h.name.startswith("epochsync_") for h in holders)
    assert flags_lib.NUM_WORKERS.value is None
    assert flags_lib.settings_from_flags() == EpochSyncSettings()
    assert (flags_lib.BARRIER_TIMEOUT_SECS.value, flags_lib.SYNC.value) == (1800.0, True)

  def test_settings_from_flags(self, parse):
    parse("--epochsync_num_epochs=3", "--epochsync_barrier_timeout_secs=120",
          "--epochsync_startup_timeout_secs=30", "--epochsync_step_timeout_secs=20",
          "--epochsync_warn_after_secs=10", "--epochsync_log_every_secs=5",
          "--noepochsync_sync", "--epochsync_divide_by_initial_workers")
    assert flags_lib.settings_from_flags() == EpochSyncSettings(
        num_epochs=3, barrier_timeout_secs=120, startup_timeout_secs=30, step_timeout_secs=20,
        warn_after_secs=10, log_every_secs=5, sync=False, divide_by_initial_workers=True)

  @pytest.mark.parametrize("arg, match", [
      ("--epochsync_num_epochs=0", r"flag --epochsync_num_epochs=0: .*positive integer"),
      ("--epochsync_num_workers=0", r"flag --epochsync_num_workers=0: .*positive integer"),
      ("--epochsync_num_epochs=two", r"flag --epochsync_num_epochs=two: invalid literal"),
  ] + [(f"--{name}={value}", rf"flag --{name}={value}: must be a finite number of seconds "
        + (">= 0.001" if name == "epochsync_log_every_secs" else "> 0"))
       for name in SECS_FLAGS for value in ("0.0", "-1.0", "inf")] + [
      ("--epochsync_log_every_secs=0.0009",
       r"flag --epochsync_log_every_secs=0.0009: must be a finite number of seconds >= 0.001"),
      ("--epochsync_save_checkpoint_secs=-1",
       r"flag --epochsync_save_checkpoint_secs=-1.0: must be a finite number of seconds >= 0"),
      ("--epochsync_save_checkpoint_steps=-1",
       r"flag --epochsync_save_checkpoint_steps=-1: .*non-negative integer"),
      ("--epochsync_save_checkpoint_steps=100",
       r"--epochsync_save_checkpoint_secs=600.0 and --epochsync_save_checkpoint_steps=100 are "
       r"both set: set one, the other to 0")])
  def test_bad_value(self, parse, arg, match):
    with pytest.raises(flags.IllegalFlagValueError, match=match):
      parse(arg)

  def test_smallest_good_values(self, parse):
    parse("--epochsync_num_epochs=1", "--epochsync_num_workers=1",
          *(f"--{name}=0.001" for name in SECS_FLAGS if name != "epochsync_barrier_timeout_secs"))
    assert flags_lib.NUM_EPOCHS.value == 1 and flags_lib.LOG_EVERY_SECS.value == 0.001

  @pytest.mark.parametrize("warn", ["100", "50"])
  def test_warn_after_must_be_below_barrier_timeout(self, parse, warn):
    with pytest.raises(flags.IllegalFlagValueError,
                       match=rf"--epochsync_warn_after_secs={warn}.0 must be < "
                             r"--epochsync_barrier_timeout_secs=50.0.*lower the first or raise "
                             r"the second"):
      parse(f"--epochsync_warn_after_secs={warn}", "--epochsync_barrier_timeout_secs=50")

  def test_warn_after_just_below_barrier_timeout(self, parse):
    parse("--epochsync_warn_after_secs=49.9", "--epochsync_barrier_timeout_secs=50")
    assert flags_lib.settings_from_flags().warn_after_secs == 49.9


class TestClusterFlags:

  def test_defines_all_cluster_flags(self):
    flag_values = flags.FlagValues()
    flags_lib.define_cluster_flags(flag_values)
    assert all(name in flag_values for name in CLUSTER_FLAGS)
    assert all(name in FLAGS for name in CLUSTER_FLAGS)

  def test_does_not_redefine_user_flags(self):
    flag_values = flags.FlagValues()
    flags.DEFINE_string("job_name", "ps", "the user's own", flag_values=flag_values)
    flags.DEFINE_integer("task_index", 0, "the user's own", flag_values=flag_values)
    flags_lib.define_cluster_flags(flag_values)
    flags_lib.define_cluster_flags(flag_values)  # Twice is harmless.
    assert flag_values["job_name"].help == "the user's own"
    assert flag_values["job_name"].default == "ps"
    assert flag_values["task_index"].help == "the user's own"
    assert "ignored when TF_CONFIG is set" in flag_values["worker_hosts"].help

  def test_cluster_from_flags(self, parse):
    parse(*CLUSTER_ARGV, "--epochsync_num_workers=3")
    config = flags_lib.cluster_from_flags()
    assert config.source == "flags" and config.task_name == "worker:1"
    assert config.worker_id == 2 and config.ps_names == ("ps:0", "ps:1")

  def test_num_workers_must_match(self, parse):
    parse(*CLUSTER_ARGV, "--epochsync_num_workers=4")
    with pytest.raises(ConfigError, match=r"num_workers=4 but --chief_hosts/--worker_hosts lists "
                                          r"3 chief\+worker tasks; set --epochsync_num_workers=3"):
      flags_lib.cluster_from_flags()

  def test_tf_config_takes_precedence(self, parse, monkeypatch):
    parse(*CLUSTER_ARGV)
    monkeypatch.setenv("TF_CONFIG", json.dumps(
        {"cluster": {"worker": ["a:1"], "ps": ["b:1"]}, "task": {"type": "ps", "index": 0}}))
    config = flags_lib.cluster_from_flags()
    assert config.source == "TF_CONFIG" and config.task_name == "ps:0"

  def test_bad_cluster_flags_name_the_flag(self, parse):
    parse("--job_name=worker", "--task_index=2", "--worker_hosts=w0:1,w1:1")
    with pytest.raises(ConfigError, match=r"(?s)add a ps job.*--task_index=2 is out of range"):
      flags_lib.cluster_from_flags()

  def test_fresh_flag_values_without_epochsync_flags(self, monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    flag_values = flags.FlagValues()
    flags_lib.define_cluster_flags(flag_values)
    with pytest.raises(ConfigError, match=r"TF_CONFIG is not set and the flags were not parsed.*"
                                          r"export TF_CONFIG .* or parse the flags"):
      flags_lib.cluster_from_flags(flag_values)
    flag_values(["prog", "--job_name=ps", "--task_index=0", "--ps_hosts=p:1", "--worker_hosts=w:1"])
    assert flags_lib.cluster_from_flags(flag_values).is_ps


# A valid non-default value per flag, as an environment variable would carry it.
ENV_VALUES = {
    "epochsync_num_epochs": ("4", 4), "epochsync_num_workers": ("3", 3),
    "epochsync_sync": ("false", False), "epochsync_divide_by_initial_workers": ("1", True),
    "epochsync_startup_timeout_secs": ("30", 30.0), "epochsync_barrier_timeout_secs": ("90", 90.0),
    "epochsync_step_timeout_secs": (" 20.5 ", 20.5), "epochsync_warn_after_secs": ("7", 7.0),
    "epochsync_log_every_secs": ("2", 2.0), "epochsync_progress_secs": ("3", 3.0),
    "epochsync_save_checkpoint_secs": ("0", 0.0), "epochsync_save_checkpoint_steps": ("50", 50),
    "epochsync_unit_seed": ("7", 7), "epochsync_unit_shuffle": ("0", False),
    "epochsync_claim_timeout_secs": ("45", 45.0), "epochsync_elastic": ("true", True),
    "epochsync_spare_workers": ("2", 2),
    "epochsync_optional_workers": ("0", 0),  # (not with spares: its own test below)
    "epochsync_max_workers": ("5", 5)}


class TestEnvironmentVariables:
  """EPOCHSYNC_* variables: flag over environment over default, bad values named."""

  def test_every_flag_has_a_variable(self, parse, monkeypatch):
    assert sorted(h.name for h in flags_lib.EPOCHSYNC_FLAGS) == sorted(ENV_VALUES)
    defined = [f.name for f in FLAGS.get_flags_for_module("hooks.config.flags")
               if f.name.startswith("epochsync_")]
    assert sorted(defined) == sorted(ENV_VALUES)  # No flag is missing from EPOCHSYNC_FLAGS.
    for name, (text, _) in ENV_VALUES.items():
      monkeypatch.setenv(flags_lib.env_var(name), text)
    parse()
    applied = flags_lib.apply_env()
    assert applied == {name: name.upper() for name in ENV_VALUES}
    for name, (_, value) in ENV_VALUES.items():
      assert getattr(FLAGS, name) == value, name
    assert flags_lib.settings_from_flags() == EpochSyncSettings(
        num_epochs=4, sync=False, divide_by_initial_workers=True, startup_timeout_secs=30,
        barrier_timeout_secs=90, step_timeout_secs=20.5, warn_after_secs=7, log_every_secs=2,
        progress_secs=3, save_checkpoint_secs=0, save_checkpoint_steps=50, unit_seed=7,
        unit_shuffle=False, claim_timeout_secs=45, elastic=True, spare_workers=2)

  def test_optional_workers_from_the_environment(self, parse, monkeypatch):
    monkeypatch.setenv("EPOCHSYNC_ELASTIC", "1")
    monkeypatch.setenv("EPOCHSYNC_OPTIONAL_WORKERS", "2")
    parse()
    flags_lib.apply_env()
    assert flags_lib.settings_from_flags().optional_workers == 2

  def test_flag_over_environment_over_default(self, parse, monkeypatch):
    parse("--epochsync_num_epochs=5", "--epochsync_sync")
    monkeypatch.setenv("EPOCHSYNC_NUM_EPOCHS", "3")
    monkeypatch.setenv("EPOCHSYNC_SYNC", "false")
    monkeypatch.setenv("EPOCHSYNC_LOG_EVERY_SECS", "4")
    settings = flags_lib.settings_from_flags()
    assert (settings.num_epochs, settings.sync) == (5, True)  # the flags win
    assert settings.log_every_secs == 4.0  # the variable wins over the default
    assert settings.barrier_timeout_secs == 1800.0  # neither: the default

  def test_a_value_assigned_in_code_wins_over_the_environment(self, parse, monkeypatch):
    parse()
    FLAGS.epochsync_num_epochs = 7
    monkeypatch.setenv("EPOCHSYNC_NUM_EPOCHS", "3")
    assert flags_lib.settings_from_flags().num_epochs == 7

  def test_a_removed_variable_gives_back_the_default(self, parse, monkeypatch):
    parse()
    monkeypatch.setenv("EPOCHSYNC_NUM_EPOCHS", "3")
    assert flags_lib.settings_from_flags().num_epochs == 3
    monkeypatch.delenv("EPOCHSYNC_NUM_EPOCHS")
    assert flags_lib.settings_from_flags().num_epochs == 1

  def test_works_without_parsed_flags(self, monkeypatch):
    """A job that never parses absl flags is configured by the variables alone."""
    flag_values = flags.FlagValues()
    flags.DEFINE_integer("epochsync_num_epochs", 1, "", lower_bound=1, flag_values=flag_values)
    assert not flag_values.is_parsed()
    applied = flags_lib.apply_env(flag_values, {"EPOCHSYNC_NUM_EPOCHS": "6"})
    assert applied == {"epochsync_num_epochs": "EPOCHSYNC_NUM_EPOCHS"}
    assert flag_values["epochsync_num_epochs"].value == 6
    monkeypatch.setenv("EPOCHSYNC_NUM_EPOCHS", "2")
    was_parsed = FLAGS.is_parsed()
    with flagsaver.flagsaver():
      if was_parsed:
        FLAGS.unparse_flags()
      assert flags_lib.settings_from_flags().num_epochs == 2
    if was_parsed:
      FLAGS(["prog"])

  def test_num_workers_from_the_environment_is_checked_against_tf_config(self, parse,
                                                                         monkeypatch):
    parse()
    monkeypatch.setenv("TF_CONFIG", json.dumps(
        {"cluster": {"worker": ["a:1", "c:1"], "ps": ["b:1"]}, "task": {"type": "worker",
                                                                        "index": 1}}))
    monkeypatch.setenv("EPOCHSYNC_NUM_WORKERS", "3")
    with pytest.raises(ConfigError, match=r"num_workers=3 but TF_CONFIG lists 2 chief\+worker"):
      flags_lib.cluster_from_flags()
    monkeypatch.setenv("EPOCHSYNC_NUM_WORKERS", "2")
    assert flags_lib.cluster_from_flags().worker_id == 1

  def test_a_worker_beyond_the_launch_is_told_by_the_two_worker_counts(self, parse, monkeypatch):
    """EPOCHSYNC_NUM_WORKERS is the launch's; EPOCHSYNC_MAX_WORKERS the most: a task listing
    more than the launch's, up to the most, is accepted, and the one past the launch knows it."""
    parse()
    cluster = {"chief": ["a:1"], "worker": ["c:1", "d:1"], "ps": ["b:1"]}
    monkeypatch.setenv("EPOCHSYNC_NUM_WORKERS", "2")
    monkeypatch.setenv("EPOCHSYNC_MAX_WORKERS", "4")
    for index, beyond in ((0, False), (1, True)):
      monkeypatch.setenv("TF_CONFIG", json.dumps(
          {"cluster": cluster, "task": {"type": "worker", "index": index}}))
      config = flags_lib.cluster_from_flags()
      assert config.beyond_launch == beyond, index
      assert config.worker_names == ("chief:0", "worker:0", "worker:1", "worker:2")
    monkeypatch.setenv("EPOCHSYNC_MAX_WORKERS", "2")
    with pytest.raises(ConfigError, match=r"lists 3 chief and worker tasks: a job launched with "
                       r"num_workers=2 that grows to at most max_workers=2"):
      flags_lib.cluster_from_flags()
    monkeypatch.delenv("EPOCHSYNC_NUM_WORKERS")
    monkeypatch.setenv("EPOCHSYNC_MAX_WORKERS", "4")
    with pytest.raises(ConfigError, match=r"max_workers=4 needs num_workers"):
      flags_lib.cluster_from_flags()

  @pytest.mark.parametrize("env, match", [
      ({"EPOCHSYNC_NUM_EPOCHS": "three"},
       r"EPOCHSYNC_NUM_EPOCHS='three' is invalid: invalid literal.*\(it sets "
       r"--epochsync_num_epochs; fix or unset the variable\)"),
      ({"EPOCHSYNC_NUM_EPOCHS": "0"}, r"EPOCHSYNC_NUM_EPOCHS='0' is invalid: 0 is not a positive"),
      ({"EPOCHSYNC_SYNC": "maybe"}, r"EPOCHSYNC_SYNC='maybe' is not a boolean: use true/false"),
      ({"EPOCHSYNC_STEP_TIMEOUT_SECS": "0"},
       r"EPOCHSYNC_STEP_TIMEOUT_SECS='0': must be a finite number of seconds > 0 \(set from "
       r"the environment; fix or unset the variable\)"),
      ({"EPOCHSYNC_LOG_EVERY_SECS": "inf"}, r"EPOCHSYNC_LOG_EVERY_SECS='inf': must be a finite"),
      ({"EPOCHSYNC_WARN_AFTER_SECS": "100", "EPOCHSYNC_BARRIER_TIMEOUT_SECS": "50"},
       r"EPOCHSYNC_WARN_AFTER_SECS='100', EPOCHSYNC_BARRIER_TIMEOUT_SECS='50': "
       r"--epochsync_warn_after_secs=100.0 must be < --epochsync_barrier_timeout_secs=50.0"),
  ])
  def test_bad_values_name_the_variable(self, parse, monkeypatch, env, match):
    parse()
    for name, value in env.items():
      monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=match):
      flags_lib.settings_from_flags()
    for name in env:  # The flags are left as they were.
      assert FLAGS[name.lower()].value == FLAGS[name.lower()].default

  def test_env_against_a_command_line_flag_is_named(self, parse, monkeypatch):
    parse("--epochsync_barrier_timeout_secs=80")
    monkeypatch.setenv("EPOCHSYNC_WARN_AFTER_SECS", "90")
    with pytest.raises(ConfigError, match=r"EPOCHSYNC_WARN_AFTER_SECS='90': "
                                          r"--epochsync_warn_after_secs=90.0 must be < "
                                          r"--epochsync_barrier_timeout_secs=80.0"):
      flags_lib.settings_from_flags()

  def test_all_problems_are_reported_together(self, parse, monkeypatch):
    parse()
    monkeypatch.setenv("EPOCHSYNC_NUM_EPOCHS", "x")
    monkeypatch.setenv("EPOCHSYNC_SYNC", "x")
    monkeypatch.setenv("EPOCHSYNC_STEP_TIMEOUT_SECS", "-1")
    with pytest.raises(ConfigError, match=r"\(3 problem\(s\)\)"):
      flags_lib.settings_from_flags()
