"""Synchronous epochs over files of Zipf sizes: steps per epoch, static file shards vs the queue.

4 workers, 1 ps, examples.train's linear model, synchronous, 2 epochs. The epoch is --files
files whose sizes in batches follow Zipf (size of the r-th largest ~ 1/r^--zipf_s, --total
batches in all). Three ways to hand them out:

  static      the files dealt round-robin to the workers (file i -> worker i % 4, as
              `Dataset.list_files(...).shard(4, i)` does): a synchronous epoch takes as many
              steps as the largest shard;
  files       every file a unit of the work queue;
  ranges      every file cut into record ranges of at most --range_batches batches, each a unit.

Per way, from the chief's audit of epoch 1 (epoch 0 warms up): the epoch's steps, against the
bound the docs give, ceil(total / workers) + the batches of the largest unit, and against the
least any split can do, max(ceil(total / workers), the largest unit). Steps are counts: they do
not depend on the machine's load (the assignment does a little: which worker is free first).

Typical usage:
  python -m bench.work_queue_sync --repetitions=3 --output=bench/results/work_queue_sync.json
"""

import json
import math
import os
import sys
from typing import Dict, List

from absl import app
from absl import flags

from bench import common

_REPETITIONS = flags.DEFINE_integer("repetitions", 3, "Repetitions.", lower_bound=1)
_FILES = flags.DEFINE_integer("files", 32, "Files per epoch.", lower_bound=4)
_TOTAL = flags.DEFINE_integer("total", 640, "Batches per epoch (all files).", lower_bound=16)
_ZIPF = flags.DEFINE_float("zipf_s", 1.0, "Zipf exponent of the file sizes.")
_RANGE = flags.DEFINE_integer("range_batches", 8, "The ranges' size (batches).", lower_bound=1)
_SLEEP = flags.DEFINE_float("step_sleep_secs", 0.0, "Pause per step.")
_OUTPUT = flags.DEFINE_string("output", None, "Write the results as JSON here.")

_TASK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "work_queue_task.py")
_WORKERS = 4


def zipf_sizes(files: int, total: int, s: float) -> List[int]:
  """Sizes (>= 1 batch) of `files` files summing to `total`, the r-th largest ~ 1/r^s."""
  weights = [1.0 / (r + 1) ** s for r in range(files)]
  sizes = [max(1, int(total * w / sum(weights))) for w in weights]
  sizes[0] += total - sum(sizes)
  return sizes


def _ranges(sizes: List[int], most: int) -> List[int]:
  return [min(most, size - start) for size in sizes for start in range(0, size, most)]


def _steps(input_flag: str) -> int:
  """Steps of epoch 1 of one synchronous job of 2 epochs."""
  audit = common.audited_job(
      [_TASK, input_flag, "--epochsync_num_epochs=2", "--epochsync_sync=true",
       "--epochsync_save_checkpoint_secs=0", f"--step_sleep_secs={_SLEEP.value}"], _WORKERS,
      timeout_secs=600, prefix="epochsync-bench-wqs-")
  return audit[1]["global_step"] - audit[0]["global_step"]


def main(argv):
  del argv
  sizes = zipf_sizes(_FILES.value, _TOTAL.value, _ZIPF.value)
  shards = [sum(sizes[i::_WORKERS]) for i in range(_WORKERS)]
  ways = {"files": sizes, "ranges": _ranges(sizes, _RANGE.value)}
  even = math.ceil(_TOTAL.value / _WORKERS)
  runs: List[Dict[str, object]] = []
  for rep in range(_REPETITIONS.value):
    row: Dict[str, object] = {"repetition": rep, "load_before": common.load_average(),
                              "static": {"steps": _steps("--shard_batches=" +
                                                         ",".join(map(str, shards)))}}
    for name, units in ways.items():
      steps = _steps("--unit_batches=" + ",".join(map(str, units)))
      row[name] = {"steps": steps, "units": len(units), "largest_unit": max(units),
                   "bound": even + max(units), "least_possible": max(even, max(units)),
                   "within_bound": steps <= even + max(units)}
    row["load_after"] = common.load_average()
    runs.append(row)
    print(json.dumps(row), flush=True)
  common.write_results(_OUTPUT.value, {"file_sizes": sizes, "static_shards": shards,
                                       "even_split": even, "runs": runs}, sys.argv,
                       workers=_WORKERS, total_batches=_TOTAL.value, zipf_s=_ZIPF.value,
                       range_batches=_RANGE.value)


if __name__ == "__main__":
  app.run(main)
