"""Epoch-exact synchronous training hooks for TensorFlow's parameter-server runtime.

Typical usage:
  import hooks
  epoch_input = hooks.EpochInput(shard_dataset, num_epochs=3, task_name=config.task_name)
  opt = hooks.WorkerDoneSyncReplicasOptimizer(sgd, config.num_workers, config.worker_id)
  train_op = opt.minimize(build_loss(*epoch_input.get_next()), global_step=global_step)
  with hooks.monitored_training_session(master=server.target, is_chief=config.is_chief,
      checkpoint_dir=model_dir, epoch_input=epoch_input, sync_optimizer=opt) as sess:
    while not sess.should_stop(): sess.run(train_op)
Names are imported lazily, so `import hooks` (and the local cluster launcher) does not
import TensorFlow until a hook is used; it checks the installed TensorFlow's version (2.15 to
2.21) from its metadata and raises hooks.errors.UnsupportedTensorFlowError (an ImportError)
naming what to install.
"""

import importlib
import importlib.abc
import importlib.util
import sys

from hooks.config import tf_version as _tf_version

_tf_version.check_tensorflow()

_EXPORTS = {
    "ClusterConfig": "hooks.config.cluster",
    "EpochSyncSettings": "hooks.config.settings",
    "EpochInput": "hooks.data.epoch_input",
    "EpochListener": "hooks.data.epoch_input",
    "EpochStats": "hooks.data.epoch_input",
    "EpochBarrierHook": "hooks.epoch.barrier",
    "WorkerDoneHook": "hooks.sync.done_counter",
    "ChiefSaveAfterBarrierHook": "hooks.checkpoint.epoch_save",
    "MidEpochSaveHook": "hooks.checkpoint.mid_epoch",
    "MidEpochResume": "hooks.checkpoint.mid_epoch_resume",
    "MidEpochRestoreHook": "hooks.checkpoint.mid_epoch_restore",
    "WorkerDoneSyncReplicasOptimizer": "hooks.sync.optimizer",
    "ElasticOptimizer": "hooks.sync.elastic_apply",
    "SafeSyncTokensHook": "hooks.sync.tokens",
    "AggregationGroup": "hooks.sync.aggregation_group",
    "epoch_sync_hooks": "hooks.session.wiring",
    "session_creator": "hooks.session.creators",
    "monitored_training_session": "hooks.session.training_session",
    "EpochSummaryHook": "hooks.epoch.summaries",
    "EpochProgressHook": "hooks.epoch.progress",
    "read_audit": "hooks.epoch.audit",
    "errors": "hooks.errors",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
  if name not in _EXPORTS:
    raise AttributeError(f"module 'hooks' has no attribute {name!r}")
  module = importlib.import_module(_EXPORTS[name])
  return module if module.__name__.endswith("." + name) else getattr(module, name)

# Module paths the docs showed before hooks/ was laid out by concern: `import hooks.barrier`
# still gives the module, now hooks.epoch.barrier (docs/architecture.md has the layout).
_MOVED = {
    "audit": "epoch.audit", "cluster": "config.cluster", "determinism": "data.determinism",
    "epoch_input": "data.epoch_input", "epoch_summaries": "epoch.summaries",
    "epoch_sync": "session.wiring", "flags": "config.flags", "flags_doc": "config.flags_doc",
    "liveness": "faults.liveness", "preflight": "config.preflight",
    "recovery_guard": "faults.recovery_guard", "run_start": "epoch.run_start",
    "step_counter": "sync.step_counter", "sync_optimizer": "sync.optimizer",
    "training_session": "session.training_session", "waiting": "faults.waiting",
}


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
  """Imports `hooks.<old name>` of `_MOVED` as the same module object as its new path."""

  def find_spec(self, fullname, path=None, target=None):
    del path, target  # unused
    if fullname.startswith("hooks.") and fullname[len("hooks."):] in _MOVED:
      return importlib.util.spec_from_loader(fullname, self)
    return None

  def create_module(self, spec):
    return importlib.import_module("hooks." + _MOVED[spec.name[len("hooks."):]])

  def exec_module(self, module):
    del module  # already executed under its new name


if not any(isinstance(f, _MovedModules) for f in sys.meta_path):
  sys.meta_path.insert(0, _MovedModules())
