"""One task of the start-up benchmark: from process start to the first synchronous step.

--variant=ours:  hooks.session.creators.session_creator (workers re-check the chief every 0.5 s) and
                 the full stack (epoch_sync_hooks: run start, start barrier; our optimizer).
--variant=stock: tf.compat.v1.train.MonitoredTrainingSession (a worker that asks before the
                 chief initialised the model re-checks 30 s later) and stock
                 SyncReplicasOptimizer, num_tokens=0.

Records time.time() at the process's first line ("exec"), once TensorFlow is imported, the
graph built and the server up ("ready": the process's own start), when the session exists and
when the first step returned.

Typical usage (what bench.startup_scaling starts on every task of a LocalCluster):
  python -m bench.startup_scaling_task --variant=ours --output_dir=/tmp/o
"""

import time

_EXEC = time.time()

import json  # pylint: disable=g-import-not-at-top,wrong-import-position
import os  # pylint: disable=g-import-not-at-top,wrong-import-position

from absl import app  # pylint: disable=g-import-not-at-top,wrong-import-position
from absl import flags  # pylint: disable=g-import-not-at-top,wrong-import-position
import tensorflow as tf  # pylint: disable=g-import-not-at-top,wrong-import-position

from bench import task_common  # pylint: disable=wrong-import-position
from bench.common import generated_batches  # pylint: disable=wrong-import-position
from hooks.session import creators as session_lib  # pylint: disable=wrong-import-position
from hooks.data.epoch_input import EpochInput  # pylint: disable=wrong-import-position
from hooks.session.wiring import epoch_sync_hooks  # pylint: disable=wrong-import-position
from hooks.sync.optimizer import WorkerDoneSyncReplicasOptimizer  # pylint: disable=wrong-import-position

__all__ = []

_VARIANT = flags.DEFINE_enum("variant", "ours", ["ours", "stock"], "See the module doc.")
_OUTPUT_DIR = flags.DEFINE_string("output_dir", None, "Where each task writes its record.")

_v1 = tf.compat.v1


def main(argv):
  del argv
  config, settings, server = task_common.start_task()
  n, stock = config.num_workers, _VARIANT.value == "stock"
  sgd = _v1.train.GradientDescentOptimizer(0.01)
  with _v1.device(_v1.train.replica_device_setter(
      worker_device=config.job_device, cluster=config.cluster_spec())):
    global_step = _v1.train.get_or_create_global_step()
    dataset = generated_batches(3, 16, 64, config.worker_id)
    if stock:
      x, y = _v1.data.make_one_shot_iterator(dataset).get_next()
    else:
      epoch_input = EpochInput(dataset, 1, config.task_name)
      x, y = epoch_input.get_next()
    loss = tf.reduce_mean(tf.square(_v1.layers.dense(x, 64) - y))
    if stock:
      opt = _v1.train.SyncReplicasOptimizer(sgd, replicas_to_aggregate=n, total_num_replicas=n)
    else:
      opt = WorkerDoneSyncReplicasOptimizer(sgd, n, config.worker_id,
                                            worker_names=config.worker_names)
    train_op = opt.minimize(loss, global_step=global_step)
  sync_hook = opt.make_session_run_hook(config.is_chief, num_tokens=0)
  ready = time.time()
  if stock:
    sess = _v1.train.MonitoredTrainingSession(
        master=server.target, is_chief=config.is_chief, config=config.session_config(),
        hooks=[sync_hook], save_checkpoint_secs=None, save_summaries_steps=None,
        log_step_count_steps=None)
  else:
    hooks = epoch_sync_hooks(config, epoch_input, settings, sync_hook=sync_hook)
    sess = _v1.train.MonitoredSession(
        session_creator=session_lib.session_creator(config, master=server.target),
        hooks=hooks)
  session_at = time.time()
  sess.run(train_op)
  first_step = time.time()
  with open(os.path.join(_OUTPUT_DIR.value, config.task_name.replace(":", "-") + ".json"),
            "w") as f:
    json.dump({"task": config.task_name, "exec": _EXEC, "ready": ready, "session": session_at,
               "first_step": first_step}, f)
  os._exit(0)  # The timings are written; stock's queue runner would hold close() up.


if __name__ == "__main__":
  app.run(main)
