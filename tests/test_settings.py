"""Tests for hooks/config/settings.py: EpochSyncSettings validates every field, all at once."""

import dataclasses
import re

import pytest

from hooks.config import settings as settings_lib
from hooks.errors import ConfigError
from hooks.config.settings import EpochSyncSettings


def test_exports():
  assert settings_lib.__all__ == ["EpochSyncSettings", "MIN_LOG_EVERY_SECS"]


class TestEpochSyncSettings:

  def test_defaults(self):
    assert dataclasses.asdict(EpochSyncSettings()) == dict(
        num_epochs=1, barrier_timeout_secs=1800, startup_timeout_secs=600, step_timeout_secs=600,
        warn_after_secs=60, log_every_secs=30, progress_secs=10, sync=True, divide_by_initial_workers=False,
        save_checkpoint_secs=600, save_checkpoint_steps=0, unit_seed=0, unit_shuffle=True,
        claim_timeout_secs=600, elastic=False, spare_workers=0, optional_workers=0)

  @pytest.mark.parametrize("field, value, rule", [
      ("num_epochs", 0, "must be an integer >= 1"),
      ("num_epochs", 1.5, "must be an integer >= 1"),
      ("num_epochs", True, "must be an integer >= 1"),
      ("barrier_timeout_secs", 0, "must be a finite number of seconds > 0"),
      ("startup_timeout_secs", -1.0, "must be a finite number of seconds > 0"),
      ("step_timeout_secs", float("inf"), "must be a finite number of seconds > 0"),
      ("warn_after_secs", float("nan"), "must be a finite number of seconds > 0"),
      ("log_every_secs", "30", "must be a finite number of seconds >= 0.001"),
      ("log_every_secs", 0.0009, "must be a finite number of seconds >= 0.001"),
      ("progress_secs", 0.0, "must be a finite number of seconds > 0"),
      ("sync", 1, "must be True or False"),
      ("divide_by_initial_workers", None, "must be True or False"),
      ("unit_seed", -1, "must be an integer >= 0"),
      ("unit_shuffle", "yes", "must be True or False"),
      ("elastic", 1, "must be True or False"),
      ("spare_workers", -1, "must be an integer >= 0"),
      ("spare_workers", 1, r"needs elastic=True \(--epochsync_elastic\): a spare joins in "
                           r"place of a lost worker, and only an elastic job goes on without one"),
      ("optional_workers", -1, "must be an integer >= 0"),
      ("optional_workers", 1, r"needs elastic=True \(--epochsync_elastic\): an optional worker "
                              r"joins the running job, and only an elastic job goes on without "
                              r"a worker"),
      ("claim_timeout_secs", 0, "must be a finite number of seconds > 0"),
      ("save_checkpoint_secs", -1, r"must be a finite number of seconds >= 0 \(0: no mid-epoch "
                                   r"checkpoint\)"),
      ("save_checkpoint_steps", 2.5, r"must be an integer >= 0 \(0: no mid-epoch checkpoint\)"),
      ("save_checkpoint_steps", 100, r"and save_checkpoint_secs=600.0 are both set: set one "
                                     r"\(the other to 0\)"),
  ])
  def test_bad_field(self, field, value, rule):
    pattern = rf"{field}={re.escape(repr(value))} {rule} \(flag --epochsync_{field}\)"
    with pytest.raises(ConfigError, match=pattern):
      EpochSyncSettings(**{field: value})

  def test_warn_after_must_be_below_barrier_timeout(self):
    settings = EpochSyncSettings(warn_after_secs=99.5, barrier_timeout_secs=100)
    assert settings.warn_after_secs == 99.5
    with pytest.raises(ConfigError, match=r"warn_after_secs=100 must be < barrier_timeout_secs="
                                          r"100; lower it or raise the timeout"):
      EpochSyncSettings(warn_after_secs=100, barrier_timeout_secs=100)

  def test_spare_workers_with_elastic(self):
    assert EpochSyncSettings(elastic=True, spare_workers=2).spare_workers == 2

  def test_optional_workers_with_elastic_and_without_spares(self):
    assert EpochSyncSettings(elastic=True, optional_workers=2).optional_workers == 2
    with pytest.raises(ConfigError, match=r"optional_workers=1 and spare_workers=1 are both set: "
                                          r"a job has spares or optional workers, not both"):
      EpochSyncSettings(elastic=True, spare_workers=1, optional_workers=1)

  def test_every_problem_is_reported_at_once(self):
    with pytest.raises(ConfigError, match=r"\(3 problem\(s\)\)") as info:
      EpochSyncSettings(num_epochs=0, log_every_secs=0, sync="yes")
    for name in ("num_epochs", "log_every_secs", "sync"):
      assert f"--epochsync_{name}" in str(info.value)

  def test_frozen(self):
    with pytest.raises(dataclasses.FrozenInstanceError):
      EpochSyncSettings().num_epochs = 2
