"""One task of the CTR example job: a canned wide & deep classifier on TFRecord files of tf.Example.

The job a CTR engineer already has, switched to tf-epochsync: the training files are sharded BY
FILE over the training tasks (`estimator_ext.shard` on the file list, so shards are uneven and
may be empty), batched and parsed with `tf.io.parse_example` and a spec from
`make_parse_example_spec` (the categorical features become SparseTensors, passed as they are),
and a `DNNLinearCombinedClassifier` trains on feature columns (a vocabulary list, a hashed and a
weighted categorical, a numeric feature; an embedding of each categorical, split over 2 ps
tasks) with Ftrl (wide) and Adagrad (deep), both synchronous. `loss_reduction` is
SUM_OVER_BATCH_SIZE: the v1 canned default, SUM, would scale a step with the number of
workers still active at an uneven epoch's end. The evaluator evaluates every epoch.

`./es demo --api=estimator --model=ctr` writes a small data set (examples/ctr_data.py) and
starts one process per task (chief, workers, 2 ps, evaluator); every task runs this module.

Typical usage (by hand, one task):
  TF_CONFIG='{"cluster": {...}, "task": {"type": "chief", "index": 0}}' \
      python -m examples.ctr_train --data_dir=/shared/data --model_dir=/shared/run --num_epochs=3
"""

import os

from absl import app
from absl import flags
import tensorflow as tf

import estimator_ext
from examples import ctr_data
from hooks.workqueue import WorkUnit
# Defines the --epochsync_* flags, so that they and the EPOCHSYNC_* variables of a deployment
# (examples/k8s/ctr-tfjob.yaml) set EpochSyncRunConfig's settings.
from hooks.config import flags as epochsync_flags  # pylint: disable=unused-import

_DATA_DIR = flags.DEFINE_string("data_dir", None, "train/part-*.tfrecord and eval/part-*.tfrecord "
                                "(python -m examples.ctr_data writes them).")
_MODEL_DIR = flags.DEFINE_string("model_dir", None, "Checkpoints and eval results; storage "
                                 "every task sees.")
_NUM_EPOCHS = flags.DEFINE_integer("num_epochs", 3, "Passes over every shard.", lower_bound=1)
_BATCH_SIZE = flags.DEFINE_integer("batch_size", 4, "Examples per batch.", lower_bound=1)
_WORK_UNITS = flags.DEFINE_bool("work_units", False, "Hand the training files out as work units "
                                 "(estimator_ext.work_units: each task takes the next file when "
                                 "it is done with one) instead of sharding them by file.")
_CANNED = flags.DEFINE_enum("canned", "wide_deep", ["wide_deep", "linear", "dnn"],
                            "DNNLinearCombinedClassifier, LinearClassifier (Ftrl) or "
                            "DNNClassifier (Adagrad).")
_WARM_START_FROM = flags.DEFINE_string("warm_start_from", None, "A checkpoint to start the "
                                       "trainable variables from (the tests' reference run).")

_v1 = tf.compat.v1


def build_estimator(config, sync: bool = True, warm_start_from=None, canned: str = "wide_deep"):
  """The canned classifier; `sync=False`: the plain optimizers (the tests' reference run)."""
  linear_optimizer = _v1.train.FtrlOptimizer(0.05)
  dnn_optimizer = _v1.train.AdagradOptimizer(0.05)
  if sync:
    linear_optimizer = estimator_ext.sync_optimizer(linear_optimizer)
    dnn_optimizer = estimator_ext.sync_optimizer(dnn_optimizer)
  reduction = _v1.losses.Reduction.SUM_OVER_BATCH_SIZE  # v1 canned default: SUM
  if canned == "linear":
    return _v1.estimator.LinearClassifier(ctr_data.linear_columns(), optimizer=linear_optimizer,
                                          loss_reduction=reduction, config=config,
                                          warm_start_from=warm_start_from)
  if canned == "dnn":
    return _v1.estimator.DNNClassifier(
        [8], ctr_data.dnn_columns(), optimizer=dnn_optimizer, loss_reduction=reduction,
        input_layer_partitioner=_v1.fixed_size_partitioner(2), config=config,
        warm_start_from=warm_start_from)
  return _v1.estimator.DNNLinearCombinedClassifier(
      linear_feature_columns=ctr_data.linear_columns(), linear_optimizer=linear_optimizer,
      dnn_feature_columns=ctr_data.dnn_columns(), dnn_optimizer=dnn_optimizer,
      dnn_hidden_units=[8],
      # Each embedding in 2 partitions, one per ps task (the default min-max partitioner would
      # keep tables this small in one piece on one ps).
      input_layer_partitioner=_v1.fixed_size_partitioner(2),
      loss_reduction=reduction, config=config, warm_start_from=warm_start_from)


def parse_spec():
  return ctr_data.parse_spec(ctr_data.linear_columns() + ctr_data.dnn_columns())


def train_input_fn(config):
  """One pass over this task's files (file i: training task i % num_workers), in batches; with
  --work_units, every file a unit of the work queue."""
  pattern = os.path.join(_DATA_DIR.value, "train", "part-*.tfrecord")
  if _WORK_UNITS.value:
    units = [WorkUnit(path) for path in sorted(tf.io.gfile.glob(pattern))]
    return estimator_ext.work_units(units, _unit_batches, config)
  files = estimator_ext.shard(tf.data.Dataset.list_files(pattern, shuffle=False), config)
  records = files.flat_map(tf.data.TFRecordDataset)
  return records.batch(_BATCH_SIZE.value).map(_parse)


def _unit_batches(unit):
  """One file's examples, batched and parsed (a unit's last batch may be partial)."""
  return tf.data.TFRecordDataset(unit.path).batch(_BATCH_SIZE.value).map(_parse)


def eval_input_fn():
  files = tf.io.gfile.glob(os.path.join(_DATA_DIR.value, "eval", "part-*.tfrecord"))
  return ctr_data.parsed_dataset(sorted(files), _BATCH_SIZE.value, parse_spec())


def _parse(serialized):
  features = tf.io.parse_example(serialized, parse_spec())
  return features, features.pop(ctr_data.LABEL)


def main(argv):
  del argv
  config = estimator_ext.EpochSyncRunConfig(_MODEL_DIR.value, num_epochs=_NUM_EPOCHS.value)
  warm_start = _WARM_START_FROM.value and tf.estimator.WarmStartSettings(
      _WARM_START_FROM.value, vars_to_warm_start=".*")
  estimator = build_estimator(config, warm_start_from=warm_start or None, canned=_CANNED.value)
  train_spec = tf.estimator.TrainSpec(train_input_fn)
  eval_spec = tf.estimator.EvalSpec(eval_input_fn, steps=None, throttle_secs=0)
  result = estimator_ext.train_and_evaluate(estimator, train_spec, eval_spec)
  summary = {"task": config.task_name, "epochs_trained": result.epochs_trained,
             "per_epoch": {str(e): {k: float(v) for k, v in m.items()}
                           for e, m in result.per_epoch.items()}}
  ctr_data.write_summary(_MODEL_DIR.value, config.task_name, summary)


if __name__ == "__main__":
  flags.mark_flags_as_required(["data_dir", "model_dir"])
  app.run(main)
