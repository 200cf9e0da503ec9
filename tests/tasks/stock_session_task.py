"""Cluster test task: examples.train's model with the epoch-sync hooks passed to TensorFlow's OWN
sessions (the design card's "pass hooks to MonitoredTrainingSession"), plus fault points.

  --session=mts         tf.compat.v1.train.MonitoredTrainingSession(hooks=epoch_sync_hooks(...))
  --session=creators    MonitoredSession + TensorFlow's ChiefSessionCreator / WorkerSessionCreator
  --save_sleep_secs=3   the chief's epoch save sleeps first (a kill lands "during a save")
  --wait_for_chief      a worker creates its session only once the chief has one, so it does not
                        lose TensorFlow's 30 s readiness poll (off: it waits in that poll)
  --unit_batches=9,1,4  examples.train's work queue instead of static shards
  epoch_task.py's --step_sleep_secs, --slowdown and --chief_init_delay_secs work here too.

It prints `point: <what>` lines a test can kill at: `point: begin` (the hooks' begin(), before
the session is created), `point: session` (it exists), `point: saving ...` (the chief, in a save).
"""

import faulthandler
import os
import signal
import time

from absl import app
from absl import flags
import tensorflow as tf

import epoch_task  # tests/tasks: the fault hooks and their flags
import stock_sessions  # tests/tasks: the two forms of TensorFlow's own session
from examples import train
from hooks.config import flags as epochsync_flags
from hooks.data.epoch_input import EpochInput
from hooks.session.wiring import epoch_sync_hooks
from hooks.sync.optimizer import WorkerDoneSyncReplicasOptimizer

_SESSION = flags.DEFINE_enum("session", "mts", list(stock_sessions.KINDS),
                             "TensorFlow's session (tests/tasks/stock_sessions.py).")
_SAVE_SLEEP = epoch_task._SAVE_SLEEP  # pylint: disable=protected-access; --save_sleep_secs
_WAIT_FOR_CHIEF = flags.DEFINE_bool("wait_for_chief", True, "Workers create their session "
                                    "after the chief has one.")
_v1 = tf.compat.v1
_WAIT_SECS = 60.0


class _SlowSave(_v1.train.CheckpointSaverListener):

  def before_save(self, session, global_step_value):
    print(f"point: saving epoch at step {global_step_value}", flush=True)
    time.sleep(_SAVE_SLEEP.value)


class _Created(_v1.train.SessionRunHook):
  """Prints `point: begin` and `point: session`; the chief leaves a file the workers wait for."""

  def __init__(self, path):
    self._path = path

  def begin(self):
    print("point: begin", flush=True)

  def after_create_session(self, session, coord):
    print("point: session", flush=True)
    if self._path:
      open(self._path, "w").close()


def _wait_for_chief(path):
  deadline = time.monotonic() + _WAIT_SECS
  while not os.path.exists(path) and time.monotonic() < deadline:
    time.sleep(0.05)


def main(argv):
  del argv
  faulthandler.register(signal.SIGTERM, chain=True)  # a task killed at a deadline shows where
  _v1.disable_v2_behavior()
  config = epochsync_flags.cluster_from_flags()
  settings = epochsync_flags.settings_from_flags()
  model_dir = flags.FLAGS.model_dir
  server = tf.distribute.Server(config.cluster_spec(), job_name=config.task_type,
                                task_index=config.task_index, config=config.session_config())
  shard = [int(n) for n in flags.FLAGS.shard_batches]
  model, features = flags.FLAGS.model, flags.FLAGS.features
  with _v1.device(_v1.train.replica_device_setter(worker_device=config.job_device,
                                                  cluster=config.cluster_spec())):
    global_step = _v1.train.get_or_create_global_step()
    if flags.FLAGS.unit_batches:  # examples.train's work queue
      epoch_input = train.unit_input(model, config, settings,
                                     [int(n) for n in flags.FLAGS.unit_batches])
    else:
      dataset = train.shard_dataset(model, config.worker_id, shard[config.worker_id], 8,
                                    features)
      epoch_input = EpochInput(dataset, settings.num_epochs, config.task_name)
    x, y = epoch_input.get_next()
    loss = train.model_loss(model, x, y, features, config.num_ps)
    opt = WorkerDoneSyncReplicasOptimizer(_v1.train.GradientDescentOptimizer(0.05),
                                          config.num_workers, config.worker_id,
                                          worker_names=config.worker_names)
    train_op = opt.minimize(loss, global_step=global_step)
  listeners = [_SlowSave()] if _SAVE_SLEEP.value > 0 else []
  hooks = epoch_sync_hooks(config, epoch_input, settings, model_dir=model_dir,
                           listeners=listeners,
                           sync_hook=opt.make_session_run_hook(config.is_chief, num_tokens=0))
  ready = os.path.join(model_dir, "chief-has-a-session")
  # First: the chief's file must come before its start barrier, which waits for the workers.
  hooks = [_Created(ready if config.is_chief else None)] + hooks
  hooks += epoch_task._extra_hooks(config, epoch_input)  # pylint: disable=protected-access
  if not config.is_chief and _WAIT_FOR_CHIEF.value:
    _wait_for_chief(ready)
  session = stock_sessions.monitored_session(_SESSION.value, config.is_chief, server.target,
                                             model_dir, config.session_config(), hooks)
  with session as sess:
    while not sess.should_stop():
      sess.run(train_op)
  print("point: done", flush=True)


if __name__ == "__main__":
  app.run(main)
