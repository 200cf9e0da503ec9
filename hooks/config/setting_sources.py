"""Combines each setting's sources (argument > flag > EPOCHSYNC_* variable > default) and logs them.

Every path that builds `EpochSyncSettings` for a job (`hooks.config.flags.settings_from_flags`, the
drop-in `monitored_training_session`, `epoch_sync_hooks`, `estimator_ext.EpochSyncRunConfig`)
resolves them here, so the precedence is the same everywhere, and the chief logs where each value
came from once.

Typical usage:
  settings = combine(from_flags, explicit={"num_epochs": 3}, sources={"sync": "EPOCHSYNC_SYNC"})
  log_sources_once(settings, "chief:0")
"""

import dataclasses
import threading
from typing import Any, Dict, Mapping, Optional

from hooks import log as logging
from hooks.errors import ConfigError
from hooks.config.settings import EpochSyncSettings

__all__ = ["ARGUMENT", "DEFAULT", "combine", "sources_of", "log_sources_once"]

ARGUMENT = "argument"  # The source of a value passed in code (an argument or an EpochSyncSettings).
DEFAULT = "default"
_FIELDS = tuple(f.name for f in dataclasses.fields(EpochSyncSettings))
_lock = threading.Lock()
_SOURCES: Dict[EpochSyncSettings, Dict[str, str]] = {}  # The last resolution of each value.
_LOGGED = set()  # Settings whose sources were logged.


def combine(resolved: EpochSyncSettings, explicit: Optional[Mapping[str, Any]] = None,
            sources: Optional[Mapping[str, str]] = None) -> EpochSyncSettings:
  """`resolved` (flags over variables over defaults) with the `explicit` arguments over it.

  Args:
    resolved: `EpochSyncSettings` from the flags, the EPOCHSYNC_* variables and the defaults.
    explicit: {field: value} passed in code; a None value is not given.
    sources: {field: "--epochsync_x" or "EPOCHSYNC_X='v'"} of `resolved`'s non-default fields.

  Returns:
    The `EpochSyncSettings`; `sources_of()` tells where each field came from.

  Raises:
    ConfigError: a field is unknown, or the combination breaks a rule of EpochSyncSettings
      (the message names each field's source, e.g. the variable and its value).
  """
  explicit = {k: v for k, v in (explicit or {}).items() if v is not None}
  unknown = sorted(set(explicit) - set(_FIELDS))
  if unknown:
    raise ConfigError(f"unknown setting(s) {', '.join(unknown)}; the settings are "
                      f"{', '.join(_FIELDS)}")
  origin = {f: (ARGUMENT if f in explicit else (sources or {}).get(f, DEFAULT)) for f in _FIELDS}
  try:
    settings = dataclasses.replace(resolved, **explicit)
  except ConfigError as e:
    given = [f"{f} from {origin[f]}" for f in _FIELDS if origin[f] != DEFAULT]
    raise ConfigError(f"{e} [sources: {', '.join(given) or 'all defaults'}; fix the argument, "
                      "flag or variable named]") from None
  with _lock:
    _SOURCES[settings] = origin
  return settings


def sources_of(settings: EpochSyncSettings) -> Dict[str, str]:
  """{field: source} of `settings` as last resolved; all `ARGUMENT` for one built in code."""
  with _lock:
    return dict(_SOURCES.get(settings, {f: ARGUMENT for f in _FIELDS}))


def log_sources_once(settings: EpochSyncSettings, task_name: str) -> None:
  """Logs (INFO) each setting's value and source, once per process for equal settings."""
  with _lock:
    if settings in _LOGGED:
      return
    _LOGGED.add(settings)
  origin = sources_of(settings)
  logging.info("%s: epoch-sync settings (value <- source): %s", task_name, ", ".join(
      f"{f}={getattr(settings, f)!r} <- {origin[f]}" for f in _FIELDS))
