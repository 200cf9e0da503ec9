"""CPU per step of EpochInput (look-ahead + driver hook) vs a plain iterator, in one process.

No cluster: a MonitoredSession on a trivial train op (add one to global_step per batch), so
what is measured is the input's own ops and Python per step. Variants alternate. Two inputs:
dense (batches of 8 x 16 float32) and sparse (a SparseTensor of --sparse_batch examples x
--sparse_ids int64 ids each, as a parsed VarLenFeature is; the train op reads its values).

Typical usage:
  python -m bench.input_overhead                       # 3 alternations of 2000 steps each
  python -m bench.input_overhead --sparse_batch=256 --sparse_ids=30
  python -m bench.input_overhead --steps=5000 --repetitions=5
"""

import json
import os
import statistics
import time

from absl import app
from absl import flags
import numpy as np
import tensorflow as tf

from hooks.data.epoch_input import EpochInput

_STEPS = flags.DEFINE_integer("steps", 2000, "Timed steps per run.", lower_bound=1)
_WARMUP = flags.DEFINE_integer("warmup", 100, "Untimed steps before them.", lower_bound=0)
_REPETITIONS = flags.DEFINE_integer("repetitions", 3, "Alternations.", lower_bound=1)
_OUTPUT = flags.DEFINE_string("output", None, "Write the results as JSON here.")
_SPARSE_BATCH = flags.DEFINE_integer("sparse_batch", 256, "Examples per sparse batch.",
                                     lower_bound=1)
_SPARSE_IDS = flags.DEFINE_integer("sparse_ids", 30, "Ids per example.", lower_bound=1)

_v1 = tf.compat.v1
_VARIANTS = ("plain", "epoch_input", "plain_sparse", "epoch_input_sparse")


def _one_run(variant: str) -> tuple:
  """(wall, CPU) seconds per step of one run: one epoch of exactly warmup + steps batches."""
  batches = _WARMUP.value + _STEPS.value
  graph = tf.Graph()
  with graph.as_default():
    if variant.endswith("_sparse"):
      dataset = _sparse_dataset(batches)
    else:
      dataset = tf.data.Dataset.from_tensor_slices(
          np.zeros((batches * 8, 16), np.float32)).batch(8)
    global_step = _v1.train.get_or_create_global_step()
    hooks = []
    if variant.startswith("plain"):
      x = _v1.data.make_one_shot_iterator(dataset).get_next()
    else:
      epoch_input = EpochInput(dataset, num_epochs=1)
      x, hooks = epoch_input.get_next(), [epoch_input.hook]
    if isinstance(x, tf.SparseTensor):  # ids >= 1: adds 1, and no constant folding removes it
      train_op = _v1.assign_add(global_step, tf.minimum(tf.reduce_min(x.values), 0) + 1)
    else:
      train_op = _v1.assign_add(global_step, tf.cast(tf.reduce_sum(x) * 0, tf.int64) + 1)
    with _v1.train.MonitoredSession(hooks=hooks) as sess:
      for _ in range(_WARMUP.value):
        sess.run(train_op)
      cpu, wall = time.process_time(), time.perf_counter()
      for _ in range(_STEPS.value):
        sess.run(train_op)
      return ((time.perf_counter() - wall) / _STEPS.value,
              (time.process_time() - cpu) / _STEPS.value)


def _sparse_dataset(batches: int) -> tf.data.Dataset:
  """`batches` batches of a SparseTensor [sparse_batch, sparse_ids] of int64 ids in [1, 1000)."""
  rng = np.random.default_rng(0)
  size, ids = _SPARSE_BATCH.value, _SPARSE_IDS.value
  one = rng.integers(1, 1000, (size, ids)).astype(np.int64)  # one batch, repeated: no RAM growth
  return tf.data.Dataset.from_tensors(one).repeat(batches).map(tf.sparse.from_dense)


def main(argv):
  del argv
  _v1.disable_eager_execution()
  results = {v: [] for v in _VARIANTS}
  for rep in range(_REPETITIONS.value):
    for variant in _VARIANTS:
      wall, cpu = _one_run(variant)
      results[variant].append((wall, cpu))
      print(f"rep={rep} {variant:12s} wall {wall * 1e6:7.1f} us/step  CPU {cpu * 1e6:7.1f} us/step")
  extras = {}
  for kind, plain, ours in (("dense", "plain", "epoch_input"),
                            ("sparse", "plain_sparse", "epoch_input_sparse")):
    extra = [c - p for (_, c), (_, p) in zip(results[ours], results[plain])]
    extras[kind] = extra
    print(f"\nEpochInput's extra CPU per step, {kind}, paired: median "
          f"{statistics.median(extra) * 1e6:.0f} us (min {min(extra) * 1e6:.0f}, "
          f"max {max(extra) * 1e6:.0f})")
  if _OUTPUT.value:
    with open(_OUTPUT.value, "w") as f:
      json.dump({"steps": _STEPS.value, "load_average": os.getloadavg(),
                 "runs": {v: [{"wall_secs": w, "cpu_secs": c} for w, c in r]
                          for v, r in results.items()},
                 "sparse_batch": [_SPARSE_BATCH.value, _SPARSE_IDS.value],
                 "extra_cpu_secs_paired": extras["dense"],
                 "extra_cpu_secs_paired_sparse": extras["sparse"]}, f, indent=1)
    print(f"wrote {_OUTPUT.value}")


if __name__ == "__main__":
  app.run(main)
