"""Flags set from environment variables: --epochsync_num_epochs from EPOCHSYNC_NUM_EPOCHS.

A flag given on the command line (or assigned in code) wins over its variable; a variable's
value goes through the flag's own parser and validators, and a bad one is a ConfigError naming
the variable, its value and the rule.

Typical usage (hooks.config.flags.apply_env does it for the --epochsync_* flags):
  applied = apply_env(EPOCHSYNC_FLAGS, absl.flags.FLAGS)   # {"epochsync_num_epochs": "EPOCHSYNC_NUM_EPOCHS"}
"""

import os
from typing import Any, Dict, Mapping, Optional, Sequence

from absl import flags

from hooks.errors import raise_if_problems

__all__ = ["apply_env", "env_var"]

_FROM_ENV = "_epochsync_from_env"  # Attribute on a Flag: the variable its value came from.


def env_var(flag_name: str) -> str:
  """The environment variable of a flag: "epochsync_num_epochs" -> "EPOCHSYNC_NUM_EPOCHS"."""
  return flag_name.upper()


def apply_env(holders: Sequence[Any], flag_values: flags.FlagValues,
              env: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
  """Sets every flag of `holders` not given on the command line from its variable.

  Each value is parsed and checked by the flag's own parser and validators. Calling it again is
  harmless (the variables are applied again); a flag set on the command line or assigned in code
  is never overridden.

  Args:
    holders: the FlagHolders (e.g. hooks.config.flags.EPOCHSYNC_FLAGS).
    flag_values: `absl.flags.FlagValues` holding the flags, parsed or not.
    env: `Mapping` of environment variables; default os.environ.

  Returns:
    {flag name: variable name} of the flags that took their value from the environment.

  Raises:
    ConfigError: naming every variable with a bad value, the value and the rule (the flags are
      left as they were).
  """
  env = os.environ if env is None else env
  applied, previous, problems = {}, {}, []
  for holder in holders:
    name, var = holder.name, env_var(holder.name)
    if name not in flag_values:
      continue
    flag = flag_values[name]
    if flag.present or not flag.using_default_value:
      continue  # The command line (or code) wins over the environment.
    if var not in env:
      if getattr(flag, _FROM_ENV, None):  # Applied earlier from a variable that is now gone.
        flag.value = flag.default
        setattr(flag, _FROM_ENV, None)
      continue
    text = env[var]
    try:
      value = flag.parser.parse(text.strip())
    except (ValueError, TypeError) as e:
      why = ("is not a boolean: use true/false (or 1/0)" if isinstance(flag, flags.BooleanFlag)
             else f"is invalid: {e}")
      problems.append(f"{var}={text!r} {why} (it sets --{name}; fix or unset the variable)")
      continue
    previous[name], flag.value, applied[name] = flag.value, value, var
    setattr(flag, _FROM_ENV, var)
  validators = {id(v): v for name in applied for v in flag_values[name].validators}
  for validator in sorted(validators.values(), key=lambda v: v.insertion_index):
    try:
      validator.verify(flag_values)
    except flags.ValidationError as e:
      from_env = [f"{applied[n]}={env[applied[n]]!r}" for n in validator.get_flags_names()
                  if n in applied]
      problems.append(f"{', '.join(from_env)}: {e} (set from the environment; fix or unset "
                      "the variable)")
  if problems:
    for name, value in previous.items():
      flag_values[name].value = value
      setattr(flag_values[name], _FROM_ENV, None)
    raise_if_problems(problems, "EPOCHSYNC_* environment variables")
  return applied
