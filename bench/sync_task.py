"""One task of the step-overhead benchmark: a ~1M-parameter MLP, synchronous SGD.

--variant=stock: tf.compat.v1.train.SyncReplicasOptimizer (num_tokens=0), plain iterator.
--variant=ours:  WorkerDoneSyncReplicasOptimizer with EpochInput and the epoch-sync hooks.
Every worker has the same number of batches (stock would hang on uneven shards). Each
task writes the wall time of every `sess.run(train_op)` to <output_dir>/<task>.json.
"""

import json
import os
import time

from absl import app
from absl import flags
import numpy as np
import tensorflow as tf

from hooks import flags as epochsync_flags
from hooks import session as session_lib
from hooks.epoch_input import EpochInput
from hooks.epoch_sync import epoch_sync_hooks
from hooks.sync_optimizer import WorkerDoneSyncReplicasOptimizer

_VARIANT = flags.DEFINE_enum("variant", "ours", ["ours", "ours-bare", "stock"],
                             "stock SyncReplicasOptimizer; ours with the epoch hooks; ours-bare: "
                             "our optimizer on a plain iterator, no epoch hooks.")
_STEPS = flags.DEFINE_integer("steps", 60, "Batches per worker (= synchronous steps).")
_BATCH = flags.DEFINE_integer("batch_size", 64, "Examples per batch.")
_WIDTH = flags.DEFINE_integer("width", 512, "Input and output width of the MLP.")
_HIDDEN = flags.DEFINE_integer("hidden", 1024, "Hidden width: 2*width*hidden ~ 1M params.")
_OUTPUT_DIR = flags.DEFINE_string("output_dir", None, "Where each task writes its timings.")

_v1 = tf.compat.v1


def _dataset(worker_id):
  rng = np.random.default_rng(worker_id)
  x = rng.normal(size=(_STEPS.value * _BATCH.value, _WIDTH.value)).astype(np.float32)
  return tf.data.Dataset.from_tensor_slices((x, x)).batch(_BATCH.value)


def _mlp_loss(x, y):
  h = _v1.layers.dense(x, _HIDDEN.value, activation=tf.nn.relu, name="hidden")
  out = _v1.layers.dense(h, _WIDTH.value, name="out")
  return tf.reduce_mean(tf.square(out - y))


def main(argv):
  del argv
  _v1.disable_v2_behavior()
  config = epochsync_flags.cluster_from_flags()
  settings = epochsync_flags.settings_from_flags()
  server = tf.distribute.Server(config.cluster_spec(), job_name=config.task_type,
                                task_index=config.task_index, config=config.session_config())
  sgd = _v1.train.GradientDescentOptimizer(0.01)
  n = config.num_workers
  with _v1.device(_v1.train.replica_device_setter(
      worker_device=config.job_device, cluster=config.cluster_spec())):
    global_step = _v1.train.get_or_create_global_step()
    if _VARIANT.value == "ours":
      epoch_input = EpochInput(_dataset(config.worker_id), 1, config.task_name)
      x, y = epoch_input.get_next()
      opt = WorkerDoneSyncReplicasOptimizer(sgd, n, config.worker_id,
                                            worker_names=config.worker_names)
    else:
      x, y = _v1.data.make_one_shot_iterator(_dataset(config.worker_id)).get_next()
      opt = (_v1.train.SyncReplicasOptimizer(sgd, replicas_to_aggregate=n, total_num_replicas=n)
             if _VARIANT.value == "stock" else
             WorkerDoneSyncReplicasOptimizer(sgd, n, config.worker_id,
                                             worker_names=config.worker_names))
    train_op = opt.minimize(_mlp_loss(x, y), global_step=global_step)
  sync_hook = opt.make_session_run_hook(config.is_chief, num_tokens=0)
  if _VARIANT.value == "ours":
    hooks = epoch_sync_hooks(config, epoch_input, settings, sync_hook=sync_hook)
  else:
    hooks = [sync_hook]
  creator = session_lib.session_creator(config, master=server.target)
  times, token = [], None
  sess = _v1.train.MonitoredSession(session_creator=creator, hooks=hooks)
  for _ in range(_STEPS.value):
    start = time.perf_counter()
    token = sess.run(train_op)  # both variants' train_op returns the step's token
    times.append(time.perf_counter() - start)
  params = sum(int(np.prod(v.shape)) for v in _v1.trainable_variables())
  path = os.path.join(_OUTPUT_DIR.value, config.task_name.replace(":", "-") + ".json")
  with open(path, "w") as f:
    json.dump({"task": config.task_name, "variant": _VARIANT.value, "params": params,
               "last_token": int(token), "step_secs": times}, f)
  # Stock's chief queue runner stays blocked in take_grad after the last step, and its
  # MonitoredSession.close() would wait stop_grace_period_secs; the timings are written,
  # so both variants leave the same way.
  os._exit(0)


if __name__ == "__main__":
  app.run(main)
