"""CPU per step of EpochInput (look-ahead + driver hook) vs a plain iterator, in one process.

No cluster: a MonitoredSession on a trivial train op (add one to global_step per batch), so
what is measured is the input's own ops and Python per step. Variants alternate.

Typical usage:
  python -m bench.input_overhead                       # 3 alternations of 2000 steps
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

from hooks.epoch_input import EpochInput

_STEPS = flags.DEFINE_integer("steps", 2000, "Timed steps per run.", lower_bound=1)
_WARMUP = flags.DEFINE_integer("warmup", 100, "Untimed steps before them.", lower_bound=0)
_REPETITIONS = flags.DEFINE_integer("repetitions", 3, "Alternations.", lower_bound=1)
_OUTPUT = flags.DEFINE_string("output", None, "Write the results as JSON here.")

_v1 = tf.compat.v1
_VARIANTS = ("plain", "epoch_input")


def _one_run(variant: str) -> tuple:
  """(wall, CPU) seconds per step of one run: one epoch of exactly warmup + steps batches."""
  batches = _WARMUP.value + _STEPS.value
  graph = tf.Graph()
  with graph.as_default():
    dataset = tf.data.Dataset.from_tensor_slices(np.zeros((batches * 8, 16), np.float32)).batch(8)
    global_step = _v1.train.get_or_create_global_step()
    hooks = []
    if variant == "plain":
      x = _v1.data.make_one_shot_iterator(dataset).get_next()
    else:
      epoch_input = EpochInput(dataset, num_epochs=1)
      x, hooks = epoch_input.get_next(), [epoch_input.hook]
    train_op = _v1.assign_add(global_step, tf.cast(tf.reduce_sum(x) * 0, tf.int64) + 1)
    with _v1.train.MonitoredSession(hooks=hooks) as sess:
      for _ in range(_WARMUP.value):
        sess.run(train_op)
      cpu, wall = time.process_time(), time.perf_counter()
      for _ in range(_STEPS.value):
        sess.run(train_op)
      return ((time.perf_counter() - wall) / _STEPS.value,
              (time.process_time() - cpu) / _STEPS.value)


def main(argv):
  del argv
  _v1.disable_eager_execution()
  results = {v: [] for v in _VARIANTS}
  for rep in range(_REPETITIONS.value):
    for variant in _VARIANTS:
      wall, cpu = _one_run(variant)
      results[variant].append((wall, cpu))
      print(f"rep={rep} {variant:12s} wall {wall * 1e6:7.1f} us/step  CPU {cpu * 1e6:7.1f} us/step")
  plain_cpu = [c for _, c in results["plain"]]
  extra = [c - p for (_, c), p in zip(results["epoch_input"], plain_cpu)]
  print(f"\nEpochInput's extra CPU per step, paired: median {statistics.median(extra) * 1e6:.0f} us "
        f"(min {min(extra) * 1e6:.0f}, max {max(extra) * 1e6:.0f})")
  if _OUTPUT.value:
    with open(_OUTPUT.value, "w") as f:
      json.dump({"steps": _STEPS.value, "load_average": os.getloadavg(),
                 "runs": {v: [{"wall_secs": w, "cpu_secs": c} for w, c in r]
                          for v, r in results.items()},
                 "extra_cpu_secs_paired": extra}, f, indent=1)
    print(f"wrote {_OUTPUT.value}")


if __name__ == "__main__":
  app.run(main)
