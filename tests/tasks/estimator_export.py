"""Test task: exports examples/estimator_train.py's model with Estimator.export_saved_model.

As a user does after (or beside) training with estimator_ext: the same model_fn and an
EpochSyncRunConfig, no TF_CONFIG (a separate process). It writes <export_base>/export.json with
the SavedModel's path and the checkpoint it was exported from.

  --model_dir=<trained model_dir> --export_base=<dir> [--checkpoint=<path>]
"""

import json
import os

from absl import app
from absl import flags
import tensorflow as tf

import estimator_ext
from examples import estimator_train
from examples.estimator_data import FEATURES

_EXPORT_BASE = flags.DEFINE_string("export_base", None, "Where the SavedModel goes.")
_CHECKPOINT = flags.DEFINE_string("checkpoint", None, "Default: the latest in model_dir.")


def serving_input_receiver_fn():
  """The serving signature: x [batch, FEATURES] float32 -> the model's prediction."""
  x = tf.compat.v1.placeholder(tf.float32, [None, FEATURES], name="x")
  return tf.estimator.export.TensorServingInputReceiver(x, {"x": x})  # the tensor as it is


def main(argv):
  del argv
  model_dir = flags.FLAGS.model_dir
  config = estimator_ext.EpochSyncRunConfig(model_dir)
  estimator = tf.compat.v1.estimator.Estimator(estimator_train.model_fn, config=config)
  checkpoint = _CHECKPOINT.value or tf.train.latest_checkpoint(model_dir)
  path = estimator.export_saved_model(_EXPORT_BASE.value, serving_input_receiver_fn,
                                      checkpoint_path=checkpoint)
  with open(os.path.join(_EXPORT_BASE.value, "export.json"), "w") as f:
    json.dump({"saved_model": path.decode(), "checkpoint": checkpoint}, f)


if __name__ == "__main__":
  app.run(main)
