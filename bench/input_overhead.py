"""CPU per step of EpochInput (look-ahead + driver hook) vs a plain iterator, in one process.

No cluster: a MonitoredSession on a trivial train op (add one to global_step per batch), so
what is measured is the input's own ops and Python per step. Variants alternate. Two inputs:
dense (batches of 8 x 16 float32) and sparse (a SparseTensor of --sparse_batch examples x
--sparse_ids int64 ids each, as a parsed VarLenFeature is; the train op reads its values).
`work_queue@K` reads the dense rows through a work queue in this process (hooks.workqueue), in
units of K batches sliced out of the rows: its CPU per step beside `epoch_input`'s is what the
queue costs per step, its claims and unit changes included (a claim's gRPC round trip is not:
bench.claim_cost measures it). Two or more unit sizes split that cost into a part per step
and a part per unit (a least-squares fit of extra = per_step + per_unit / K); with
--step_cpu_ms (a training step's CPU, e.g. bench.step_overhead's) it prints the ratio a step
of that cost would have at each unit size. `elastic_queue@K` is `work_queue@K` with
--epochsync_elastic: beside it, what the elastic gate costs per step (one run of the queue's
critical section per batch; in a cluster that run is on ps:0, inside the step's own RPC).

Typical usage:
  python -m bench.input_overhead                       # 3 alternations of 2000 steps each
  python -m bench.input_overhead --sparse_batch=256 --sparse_ids=30
  python -m bench.input_overhead --steps=5000 --repetitions=5
  python -m bench.input_overhead --variants=epoch_input,work_queue@50,work_queue@1000 \
      --step_cpu_ms=26.22
  python -m bench.input_overhead --variants=epoch_input,work_queue@100,elastic_queue@100
"""

import json
import os
import statistics
import time
from typing import Dict, List, Optional

from absl import app
from absl import flags
import numpy as np
import tensorflow as tf

from hooks.config.settings import EpochSyncSettings
from hooks.data.epoch_input import EpochInput
from hooks.workqueue import WorkUnit, work_queue_input

_STEPS = flags.DEFINE_integer("steps", 2000, "Timed steps per run.", lower_bound=1)
_WARMUP = flags.DEFINE_integer("warmup", 100, "Untimed steps before them.", lower_bound=0)
_REPETITIONS = flags.DEFINE_integer("repetitions", 3, "Alternations.", lower_bound=1)
_OUTPUT = flags.DEFINE_string("output", None, "Write the results as JSON here.")
_SPARSE_BATCH = flags.DEFINE_integer("sparse_batch", 256, "Examples per sparse batch.",
                                     lower_bound=1)
_SPARSE_IDS = flags.DEFINE_integer("sparse_ids", 30, "Ids per example.", lower_bound=1)
_ALL_VARIANTS = ("plain", "epoch_input", "plain_sparse", "epoch_input_sparse", "work_queue@K",
                 "elastic_queue@K")
_QUEUES = ("work_queue@", "elastic_queue@")
_VARIANTS = flags.DEFINE_list("variants", list(_ALL_VARIANTS[:4]),
                              f"Run alternately, in this order; any of {', '.join(_ALL_VARIANTS)} "
                              "(K: batches per unit).")
_STEP_CPU_MS = flags.DEFINE_float("step_cpu_ms", None, "A training step's CPU in ms: print the "
                                  "ratio the queue's cost per step gives it at each unit size.")

_v1 = tf.compat.v1
_PAIRS = (("dense", "plain", "epoch_input"), ("sparse", "plain_sparse", "epoch_input_sparse"))


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
    elif variant.startswith(_QUEUES):
      epoch_input = _work_queue_input(batches, _unit_batches(variant),
                                      variant.startswith("elastic"))
      x, hooks = epoch_input.get_next(), [epoch_input.hook]
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


def _unit_batches(variant: str) -> int:
  return int(variant.split("@", 1)[1])


def _work_queue_input(batches: int, unit_batches: int, elastic: bool) -> EpochInput:
  """The run's dense rows, in units of `unit_batches` batches (the last may hold fewer)."""
  size = unit_batches * 8
  total = batches * 8
  rows = tf.constant(np.zeros((total, 16), np.float32))
  units = [WorkUnit("", start, min(start + size, total)) for start in range(0, total, size)]

  def unit_fn(unit):  # the unit's rows sliced out, as docs/workqueue.md advises
    return tf.data.Dataset.from_tensor_slices(rows[unit.start:unit.start + unit.count]).batch(8)
  return work_queue_input(units, unit_fn, num_epochs=1, num_workers=1, worker_id=0,
                          task_name="worker:0", ps_device="",
                          settings=EpochSyncSettings(elastic=elastic, sync=not elastic))


def _sparse_dataset(batches: int) -> tf.data.Dataset:
  """`batches` batches of a SparseTensor [sparse_batch, sparse_ids] of int64 ids in [1, 1000)."""
  rng = np.random.default_rng(0)
  size, ids = _SPARSE_BATCH.value, _SPARSE_IDS.value
  one = rng.integers(1, 1000, (size, ids)).astype(np.int64)  # one batch, repeated: no RAM growth
  return tf.data.Dataset.from_tensors(one).repeat(batches).map(tf.sparse.from_dense)


def main(argv):
  del argv
  _v1.disable_eager_execution()
  unknown = [v for v in _VARIANTS.value if v not in _ALL_VARIANTS[:4] and not (
      v.startswith(_QUEUES) and v.split("@", 1)[1].isdigit() and _unit_batches(v) > 0)]
  if unknown:
    raise app.UsageError(f"unknown --variants {sorted(unknown)}; choose from {_ALL_VARIANTS}")
  results = {v: [] for v in _VARIANTS.value}
  load_before = os.getloadavg()
  for rep in range(_REPETITIONS.value):
    for variant in _VARIANTS.value:
      wall, cpu = _one_run(variant)
      results[variant].append((wall, cpu))
      print(f"rep={rep} {variant:12s} wall {wall * 1e6:7.1f} us/step  CPU {cpu * 1e6:7.1f} us/step")
  queues = [v for v in results if v.startswith("work_queue@")]
  gates = [(v, "work_queue@" + v.split("@", 1)[1]) for v in results if v.startswith("elastic")]
  if (queues and "epoch_input" not in results) or any(q not in results for _, q in gates):
    raise app.UsageError("work_queue@K is measured against epoch_input, elastic_queue@K against "
                         "work_queue@K: add it to --variants")
  extras = {}
  for kind, plain, ours in (_PAIRS + tuple((v, "epoch_input", v) for v in queues) +
                            tuple((v, q, v) for v, q in gates)):
    if plain not in results or ours not in results:
      continue
    extra = [c - p for (_, c), (_, p) in zip(results[ours], results[plain])]
    extras[kind] = extra
    print(f"\n{ours}'s extra CPU per step over {plain}, paired: median "
          f"{statistics.median(extra) * 1e6:.0f} us (min {min(extra) * 1e6:.0f}, "
          f"max {max(extra) * 1e6:.0f})")
  fit = _queue_cost(extras)
  if _OUTPUT.value:
    with open(_OUTPUT.value, "w") as f:
      json.dump({"steps": _STEPS.value, "load_average_before": load_before,
                 "load_average": os.getloadavg(), "queue_cost": fit,
                 "step_cpu_ms": _STEP_CPU_MS.value,
                 "runs": {v: [{"wall_secs": w, "cpu_secs": c} for w, c in r]
                          for v, r in results.items()},
                 "sparse_batch": [_SPARSE_BATCH.value, _SPARSE_IDS.value],
                 "extra_cpu_secs_paired": extras.get("dense"),
                 "extra_cpu_secs_paired_sparse": extras.get("sparse"),
                 "extra_cpu_secs_paired_work_queue": {v: extras[v] for v in queues},
                 "extra_cpu_secs_paired_elastic_gate": {v: extras[v] for v, _ in gates}},
                f, indent=1)
    print(f"wrote {_OUTPUT.value}")


def _queue_cost(extras: Dict[str, List[float]]) -> Optional[Dict[str, float]]:
  """The queue's paired extra CPU per step split into per step + per unit / K (least squares
  over the unit sizes measured, on the paired medians); None with fewer than 2 sizes."""
  sizes = {_unit_batches(v): statistics.median(e) for v, e in extras.items()
           if v.startswith("work_queue@")}
  if len(sizes) < 2:
    return None
  per_unit, per_step = np.polyfit([1.0 / k for k in sizes], list(sizes.values()), 1)
  fit = {"per_step_secs": float(per_step), "per_unit_secs": float(per_unit)}
  print(f"\nthe queue's extra CPU: {per_step * 1e6:.0f} us per step + "
        f"{per_unit * 1e3:.2f} ms per unit (fit over units of {sorted(sizes)} batches)")
  if _STEP_CPU_MS.value:
    step = _STEP_CPU_MS.value / 1e3
    fit["ratios"] = {}
    for k in sorted(set(sizes) | {25, 50, 100, 200, 400}):
      extra = sizes.get(k, per_step + per_unit / k)
      fit["ratios"][str(k)] = (step + extra) / step
      print(f"  units of {k:5d} batches: a step of {_STEP_CPU_MS.value:.2f} ms CPU becomes "
            f"{(step + extra) / step:.4f}x ({'measured' if k in sizes else 'from the fit'})")
  return fit


if __name__ == "__main__":
  app.run(main)
