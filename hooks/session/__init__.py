"""Sessions: the session creators, the epoch-sync wiring and the MonitoredTrainingSession drop-in.

The top layer: it may import every other subpackage. `hooks.session` keeps the creators'
names (`hooks.session.session_creator(config, master, checkpoint_dir=model_dir)`).

Typical usage:
  creator = hooks.session.session_creator(config, server.target, checkpoint_dir=model_dir)
  hooks = hooks.epoch_sync_hooks(config, epoch_input, settings, model_dir=model_dir)
  with tf.compat.v1.train.MonitoredSession(session_creator=creator, hooks=hooks) as sess: ...
"""

from hooks.session.creators import (EpochSyncChiefSessionCreator, FastWorkerSessionCreator,
                                    session_creator)

__all__ = ["EpochSyncChiefSessionCreator", "FastWorkerSessionCreator", "session_creator"]
