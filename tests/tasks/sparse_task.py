"""Cluster test task: a custom CTR model on parsed tf.Example files through the MonitoredSession drop-in.

Each worker reads its files of --data_dir (sharded by file: file i goes to worker id
i % num_workers), batches and parses them (`ad` and `ad_weight` are SparseTensors), and trains
y = sum(safe_embedding_lookup_sparse(emb, ad, ad_weight, "sum")) + a * price + b by
synchronous SGD (WorkerDoneSyncReplicasOptimizer), `emb` partitioned over the ps tasks, with
`hooks.monitored_training_session`. Every training task writes <model_dir>/summary-<task>.json
as examples.train does.

Typical usage (what tests/test_sparse_cluster.py starts on every task of a LocalCluster):
  python tests/tasks/sparse_task.py --data_dir=/tmp/data --model_dir=/tmp/run --epochsync_num_epochs=2
"""

import glob
import os

from absl import app
from absl import flags
import tensorflow as tf

from examples import ctr_data
from hooks.config import flags as epochsync_flags
from hooks.data.epoch_input import EpochInput
from hooks.sync.optimizer import WorkerDoneSyncReplicasOptimizer
from hooks.session.training_session import monitored_training_session

_DATA_DIR = flags.DEFINE_string("data_dir", None, "The TFRecord files (part-*.tfrecord).")
_MODEL_DIR = flags.DEFINE_string("model_dir", None, "Checkpoints, audit, summaries.")
_BATCH_SIZE = flags.DEFINE_integer("batch_size", 4, "Examples per batch.")

_v1 = tf.compat.v1
LEARNING_RATE, EMBEDDING_DIM, PRICE_WEIGHT = 0.1, 3, 0.5
SPEC = {"ad": tf.io.VarLenFeature(tf.int64), "ad_weight": tf.io.VarLenFeature(tf.float32),
        "price": tf.io.FixedLenFeature([1], tf.float32),
        ctr_data.LABEL: tf.io.FixedLenFeature([1], tf.int64)}


def model_loss(features, label, num_ps: int):
  """Mean squared error of the weighted-sum embedding model; the table split over the ps."""
  emb = _v1.get_variable("ad_embedding", [ctr_data.AD_IDS, EMBEDDING_DIM],
                         initializer=_v1.zeros_initializer(),
                         partitioner=_v1.fixed_size_partitioner(num_ps))
  a = _v1.get_variable("price_weight", [], initializer=_v1.constant_initializer(PRICE_WEIGHT))
  b = _v1.get_variable("bias", [], initializer=_v1.zeros_initializer())
  looked_up = _v1.nn.safe_embedding_lookup_sparse(emb, features["ad"], features["ad_weight"],
                                                  combiner="sum")  # [batch, dim]; 0 if no ad
  prediction = tf.reduce_sum(looked_up, 1) + a * features["price"][:, 0] + b
  return tf.reduce_mean(tf.square(prediction - tf.cast(label[:, 0], tf.float32)))


def main(argv):
  del argv
  _v1.disable_v2_behavior()
  config = epochsync_flags.cluster_from_flags()
  settings = epochsync_flags.settings_from_flags()
  server = tf.distribute.Server(config.cluster_spec(), job_name=config.task_type,
                                task_index=config.task_index, config=config.session_config())
  if config.is_ps:
    server.join()
  paths = sorted(glob.glob(os.path.join(_DATA_DIR.value, "part-*.tfrecord")))
  files = ctr_data.shard_files(paths, config.worker_id, config.num_workers)
  with _v1.device(_v1.train.replica_device_setter(
      worker_device=config.job_device, cluster=config.cluster_spec())):
    global_step = _v1.train.get_or_create_global_step()
    dataset = ctr_data.parsed_dataset(files, _BATCH_SIZE.value, SPEC)
    epoch_input = EpochInput(dataset, settings.num_epochs, config.task_name)
    features, label = epoch_input.get_next()
    loss = model_loss(features, label, config.num_ps)
    optimizer = WorkerDoneSyncReplicasOptimizer(
        _v1.train.GradientDescentOptimizer(LEARNING_RATE), config.num_workers, config.worker_id,
        worker_names=config.worker_names)
    train_op = optimizer.minimize(loss, global_step=global_step)
  with monitored_training_session(
      master=server.target, is_chief=config.is_chief, checkpoint_dir=_MODEL_DIR.value,
      epoch_input=epoch_input, settings=settings, cluster=config,
      sync_optimizer=optimizer) as sess:
    while not sess.should_stop():
      sess.run(train_op)
  history = epoch_input.hook.history
  summary = {"task": config.task_name, "files": [os.path.basename(f) for f in files],
             "epochs": [s.epoch for s in history], "batches": [s.batches for s in history],
             "examples": [s.examples for s in history]}
  ctr_data.write_summary(_MODEL_DIR.value, config.task_name, summary)


if __name__ == "__main__":
  flags.mark_flags_as_required(["data_dir", "model_dir"])
  app.run(main)
