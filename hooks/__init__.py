"""Epoch-exact synchronous training hooks for TensorFlow's parameter-server runtime.

Typical usage:
  config = hooks.ClusterConfig.from_tf_config()
  ...
Names are imported lazily, so `import hooks` (and the local cluster launcher) does not
import TensorFlow until a hook is used.
"""

import importlib

_EXPORTS = {
    "ClusterConfig": "hooks.cluster",
    "EpochSyncSettings": "hooks.cluster",
    "errors": "hooks.errors",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
  if name not in _EXPORTS:
    raise AttributeError(f"module 'hooks' has no attribute {name!r}")
  module = importlib.import_module(_EXPORTS[name])
  return module if module.__name__.endswith("." + name) else getattr(module, name)
