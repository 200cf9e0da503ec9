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

from hooks import _tf_version

_tf_version.check_tensorflow()

_EXPORTS = {
    "ClusterConfig": "hooks.cluster",
    "EpochSyncSettings": "hooks.settings",
    "EpochInput": "hooks.epoch_input",
    "EpochListener": "hooks.epoch_input",
    "EpochStats": "hooks.epoch_input",
    "EpochBarrierHook": "hooks.barrier",
    "WorkerDoneHook": "hooks.done_counter",
    "ChiefSaveAfterBarrierHook": "hooks.checkpointing",
    "MidEpochSaveHook": "hooks.mid_epoch",
    "MidEpochResume": "hooks.mid_epoch_resume",
    "MidEpochRestoreHook": "hooks.mid_epoch_restore",
    "WorkerDoneSyncReplicasOptimizer": "hooks.sync_optimizer",
    "SafeSyncTokensHook": "hooks.tokens",
    "AggregationGroup": "hooks.aggregation_group",
    "epoch_sync_hooks": "hooks.epoch_sync",
    "session_creator": "hooks.session",
    "monitored_training_session": "hooks.training_session",
    "EpochSummaryHook": "hooks.epoch_summaries",
    "EpochProgressHook": "hooks.progress",
    "read_audit": "hooks.audit",
    "errors": "hooks.errors",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
  if name not in _EXPORTS:
    raise AttributeError(f"module 'hooks' has no attribute {name!r}")
  module = importlib.import_module(_EXPORTS[name])
  return module if module.__name__.endswith("." + name) else getattr(module, name)
