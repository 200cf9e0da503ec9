"""Cluster test task: the example's model trained by a stock job (no tf-epochsync at all).

The job a user has before switching tf-epochsync on (or after switching it off again):
plain MonitoredTrainingSession, asynchronous SGD, a fixed number of steps, a checkpoint at the
end. It writes what it restored and where it ended to <model_dir>/stock-<task>.json.

  --stock_steps=5   steps this task runs
"""

import json
import os

from absl import app
from absl import flags
import tensorflow as tf

from examples import train
from hooks.config import flags as epochsync_flags

_STEPS = flags.DEFINE_integer("stock_steps", 5, "Steps to train.")
_v1 = tf.compat.v1


def main(argv):
  del argv
  _v1.disable_v2_behavior()
  config = epochsync_flags.cluster_from_flags()
  server = tf.distribute.Server(config.cluster_spec(), job_name=config.task_type,
                                task_index=config.task_index, config=config.session_config())
  model_dir = flags.FLAGS.model_dir
  with _v1.device(_v1.train.replica_device_setter(worker_device=config.job_device,
                                                  cluster=config.cluster_spec())):
    global_step = _v1.train.get_or_create_global_step()
    shard = [int(n) for n in flags.FLAGS.shard_batches]
    dataset = train.shard_dataset("linear", config.worker_id, shard[config.worker_id], 8, 16)
    x, y = _v1.data.make_one_shot_iterator(dataset.repeat()).get_next()
    loss = train.model_loss("linear", x, y, 16, config.num_ps)
    train_op = _v1.train.GradientDescentOptimizer(0.05).minimize(loss, global_step=global_step)
  params = {name: _v1.get_default_graph().get_tensor_by_name(f"{name}:0") for name in ("w", "b")}
  with _v1.train.MonitoredTrainingSession(
      master=server.target, is_chief=config.is_chief, checkpoint_dir=model_dir,
      save_checkpoint_secs=None, save_checkpoint_steps=10**6, save_summaries_steps=None,
      config=config.session_config()) as sess:
    restored = {k: v.tolist() for k, v in sess.run(params).items()}
    start_step = int(sess.run(global_step))
    for _ in range(_STEPS.value):
      sess.run(train_op)
    end_step = int(sess.run(global_step))
  with open(os.path.join(model_dir, f"stock-{config.task_name.replace(':', '-')}.json"),
            "w") as f:
    json.dump({"restored": restored, "start_step": start_step, "end_step": end_step}, f)


if __name__ == "__main__":
  app.run(main)
