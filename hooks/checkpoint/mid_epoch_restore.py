"""The chief's mid-epoch restore under any session creator, TensorFlow's own included.

TensorFlow's ChiefSessionCreator (what `tf.compat.v1.train.MonitoredTrainingSession` uses)
restores the newest checkpoint of `checkpoint_dir`: an epoch checkpoint, never one of
`<model_dir>/mid_epoch/`. Right after the session is created, before the chief starts the run
(RunStartHook: no worker reads the position or a model variable before that), this hook
restores the newest mid-epoch checkpoint over it when that one is newer
(`hooks.checkpoint.mid_epoch.checkpoint_to_restore`), so hand-wired hooks resume inside the epoch as the
drop-in does. When the session already holds that checkpoint (tf-epochsync's own creator
restored it) it does nothing.

Typical usage (hooks.epoch_sync_hooks puts it on the chief, before the RunStartHook):
  restore = MidEpochRestoreHook(model_dir, num_workers)
  hooks = [guard, restore, run_start, ...]
"""

import time

import numpy as np
import tensorflow as tf

from hooks import log as logging
from hooks.checkpoint import mid_epoch
from hooks.faults.waiting import run_options

__all__ = ["MidEpochRestoreHook"]

_v1 = tf.compat.v1
_READ_TIMEOUT_SECS = 60.0


class MidEpochRestoreHook(_v1.train.SessionRunHook):
  """The chief: restores the newest mid-epoch checkpoint if the session does not hold it yet.

    restore = MidEpochRestoreHook("/tmp/model", num_workers=3)
    with tf.compat.v1.train.MonitoredTrainingSession(
        is_chief=True, checkpoint_dir="/tmp/model", hooks=[guard, restore, start, ...]) as s:
      ...

  Args:
    checkpoint_dir: `str`, the model_dir (its `mid_epoch/` holds the mid-epoch checkpoints).
    num_workers: `int`, the training tasks (the position variables' shape).
    ps_device: where the position variables live.
  """

  def __init__(self, checkpoint_dir: str, num_workers: int,
               ps_device: str = "/job:ps/task:0"):
    self._dir, self._num_workers, self._ps = checkpoint_dir, num_workers, ps_device
    self.restored = None  # The path this hook restored, if any.

  def begin(self):
    self._graph = _v1.get_default_graph()
    position = mid_epoch.state(self._num_workers, self._ps)["position"]
    with tf.name_scope("epochsync_mid_epoch/restore"):
      self._read_position = position.read_value()

  def after_create_session(self, session, coord):
    path = mid_epoch.checkpoint_to_restore(self._dir, log=False)  # it logs what it restores
    if not path:
      return
    held = session.run(self._read_position, options=run_options(_READ_TIMEOUT_SECS))
    if np.array_equal(held, tf.train.load_variable(path, mid_epoch.POSITION_NAME)):
      return  # The session creator restored it (tf-epochsync's own).
    start = time.monotonic()
    # The Scaffold's saver (no new ops: the graph is final), as the mid-epoch save used it.
    base = self._graph.get_collection(_v1.GraphKeys.SAVERS)[0]
    _v1.train.Saver(saver_def=base.saver_def).restore(session, path)
    self.restored = path
    logging.info("restored the mid-epoch checkpoint %s over what the session creator restored "
                 "(position %s) in %.2f s: every worker resumes its shard after the batches it "
                 "holds", path, [int(v) for v in held], time.monotonic() - start)
