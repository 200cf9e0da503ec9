"""One task of the per-epoch overhead benchmark: short epochs of a model of V small variables.

Every task runs the user's full stack (EpochInput, epoch_sync_hooks with a model_dir, so the
chief saves a checkpoint per epoch, WorkerDoneSyncReplicasOptimizer). Each shard has
--batches batches per epoch. Listeners record, per epoch and task, when its last step ended,
when its done signal was sent, when it arrived at and left the epoch barrier, how long the
chief's save took (a CheckpointSaverListener) and when its next epoch's first step began.

Typical usage (what bench.growth starts on every task of a LocalCluster):
  python -m bench.growth_task --variables=100 --epochs=6 --output_dir=/tmp/o
"""

import json
import os
import time

from absl import app
from absl import flags
import tensorflow as tf

from bench import task_common
from bench.common import generated_batches
from hooks.session import creators as session_lib
from hooks.data.epoch_input import EpochInput, EpochListener
from hooks.session.wiring import epoch_sync_hooks
from hooks.sync.optimizer import WorkerDoneSyncReplicasOptimizer

__all__ = []

_VARIABLES = flags.DEFINE_integer("variables", 100, "Model variables (each [16] floats).")
_BATCHES = flags.DEFINE_integer("batches", 3, "Batches per shard per epoch.")
_EPOCHS = flags.DEFINE_integer("epochs", 6, "Epochs.")
_OUTPUT_DIR = flags.DEFINE_string("output_dir", None, "Where each task writes its record.")

_v1 = tf.compat.v1
_WIDTH = 16


class _Marks(EpochListener):
  """Stamps time.time() at this listener's place among the epoch listeners."""

  def __init__(self, order: int, name: str, marks: dict):
    self.order, self._name, self._marks = order, name, marks

  def epoch_ended(self, session, stats):
    self._marks.setdefault(stats.epoch, {})[self._name] = time.time()


class _SaveTimes(_v1.train.CheckpointSaverListener):

  def __init__(self):
    self.saves = []

  def before_save(self, session, global_step_value):
    self._start = time.time()

  def after_save(self, session, global_step_value):
    self.saves.append([self._start, time.time()])



def main(argv):
  del argv
  config, settings, server = task_common.start_task()
  with _v1.device(_v1.train.replica_device_setter(
      worker_device=config.job_device, cluster=config.cluster_spec())):
    global_step = _v1.train.get_or_create_global_step()
    epoch_input = EpochInput(generated_batches(_BATCHES.value, 8, _WIDTH, config.worker_id),
                             _EPOCHS.value, config.task_name)
    x, y = epoch_input.get_next()
    weights = [_v1.get_variable(f"v{i}", [_WIDTH]) for i in range(_VARIABLES.value)]
    loss = tf.reduce_mean(tf.square(x * tf.add_n(weights) - y))
    opt = WorkerDoneSyncReplicasOptimizer(_v1.train.GradientDescentOptimizer(0.01),
                                          config.num_workers, config.worker_id,
                                          worker_names=config.worker_names)
    train_op = opt.minimize(loss, global_step=global_step)
  marks, saves, steps = {}, _SaveTimes(), task_common.StepTimes()
  for order, name in ((5, "last_step_done"), (15, "done_sent"), (25, "released")):
    epoch_input.add_listener(_Marks(order, name, marks))
  model_dir = os.path.join(_OUTPUT_DIR.value, "model")
  hooks = epoch_sync_hooks(config, epoch_input, settings, model_dir=model_dir, listeners=[saves],
                           sync_hook=opt.make_session_run_hook(config.is_chief, num_tokens=0))
  creator = session_lib.session_creator(config, master=server.target, checkpoint_dir=model_dir)
  with _v1.train.MonitoredSession(session_creator=creator, hooks=[steps] + hooks) as sess:
    while not sess.should_stop():
      sess.run(train_op)
  with open(os.path.join(_OUTPUT_DIR.value, config.task_name.replace(":", "-") + ".json"),
            "w") as f:
    json.dump({"task": config.task_name, "marks": marks, "saves": saves.saves,
               "steps": steps.steps, "variables": _VARIABLES.value}, f)


if __name__ == "__main__":
  app.run(main)
