"""Graph helpers of EpochInput: tf.data autotuning off, and whether a run reads the input.

Typical usage (inside hooks.data.epoch_input):
  dataset = without_autotune_stall(dataset, task_name)
  consumes = reaches(fetch_ops, lookahead.dequeue_op)
"""

import warnings

import tensorflow as tf

from hooks import log as logging

__all__ = ["without_autotune_stall", "reaches"]


def without_autotune_stall(dataset: tf.data.Dataset, task_name: str) -> tf.data.Dataset:
  """`dataset` with tf.data autotuning off, unless its options already decide.

  In TensorFlow 2.15 re-initialising an iterator whose pipeline is autotuned waits for the
  autotune thread's current period to end, and the period doubles up to 60 s: a fresh iterator
  per epoch then starts up to 60 s late on some workers and not on others (seen: 4-5 s after
  6 s epochs). Without autotuning, AUTOTUNE parallelism and buffer sizes take TensorFlow's
  defaults instead.
  """
  with warnings.catch_warnings():  # options() in graph mode warns that it may be stale
    warnings.simplefilter("ignore", UserWarning)
    chosen = dataset.options().autotune.enabled
  if chosen is None:
    options = tf.data.Options()
    options.autotune.enabled = False
    return dataset.with_options(options)
  if chosen:
    logging.warning("%s: the dataset sets options.autotune.enabled=True: in TensorFlow 2.15 "
                    "each epoch's fresh iterator may then start up to 60 s late (the autotune "
                    "thread's period); leave it unset and EpochInput turns autotuning off",
                    task_name)
  return dataset


def reaches(fetch_ops, target: tf.Operation) -> bool:
  """True if `target` is among the (data or control) ancestors of `fetch_ops`."""
  seen, stack = set(), list(fetch_ops)
  while stack:
    op = stack.pop()
    if op is target:
      return True
    if op in seen:
      continue
    seen.add(op)
    stack.extend(t.op for t in op.inputs)
    stack.extend(op.control_inputs)
  return False
