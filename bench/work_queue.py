"""Asynchronous epochs with one worker at half speed: static shards vs the work queue.

4 workers, 1 ps, examples.train's linear model, asynchronous, 2 epochs of --total_batches
batches; every step pauses --step_sleep_secs (worker:3 twice as long). Per repetition: one job
on 4 equal static shards, then one job per unit size through the work queue (the same batches
as units of that many). From the chief's audit of epoch 1 (epoch 0 warms up):

  wall   = epoch 1's release - epoch 0's release (the chief's barrier);
  ideal  = total batches / the workers' summed throughput, each worker's throughput measured
           in the static job (its shard's batches / its epoch time): the epoch if the work
           were split by speed;
  ratio  = wall / ideal, for the static shards and each unit size.

Typical usage:
  python -m bench.work_queue --repetitions=3 --output=bench/results/work_queue.json
"""

import json
import os
import statistics
import sys
from typing import Dict, List

from absl import app
from absl import flags

from bench import common

_REPETITIONS = flags.DEFINE_integer("repetitions", 3, "Repetitions.", lower_bound=1)
_TOTAL = flags.DEFINE_integer("total_batches", 160, "Batches per epoch (all workers).")
_UNITS = flags.DEFINE_list("unit_batches", ["2", "4", "10"], "Unit sizes to run (batches).")
_SLEEP = flags.DEFINE_float("step_sleep_secs", 0.05, "Pause per step (the slow worker: 2x).")
_OUTPUT = flags.DEFINE_string("output", None, "Write the results as JSON here.")

_TASK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "work_queue_task.py")
_WORKERS = 4


def _job(input_flag: str) -> List[dict]:
  """One asynchronous job of 2 epochs; its audit lines."""
  return common.audited_job(
      [_TASK, input_flag, "--epochsync_num_epochs=2", "--epochsync_sync=false",
       "--epochsync_save_checkpoint_secs=0", f"--step_sleep_secs={_SLEEP.value}"], _WORKERS,
      {f"worker:{_WORKERS - 1}": ["--slowdown=2"]}, prefix="epochsync-bench-wq-")


def _wall(audit: List[dict]) -> float:
  return audit[1]["released_at"] - audit[0]["released_at"]


def _ideal(static: List[dict]) -> float:
  """Epoch 1's batches over the workers' summed throughput in the static job."""
  workers = static[1]["workers"].values()
  rate = sum(w["batches"] / (w["arrived_at"] - w["started_at"]) for w in workers)
  return sum(w["batches"] for w in workers) / rate


def main(argv):
  per_worker = _TOTAL.value // _WORKERS
  runs: List[Dict[str, object]] = []
  for rep in range(_REPETITIONS.value):
    load = common.load_average()
    static = _job("--shard_batches=" + ",".join([str(per_worker)] * _WORKERS))
    ideal = _ideal(static)
    row = {"repetition": rep, "load_before": load, "ideal_secs": round(ideal, 3),
           "static": {"wall_secs": round(_wall(static), 3),
                      "ratio": round(_wall(static) / ideal, 3)}}
    for size in map(int, _UNITS.value):
      audit = _job("--unit_batches=" + ",".join([str(size)] * (_TOTAL.value // size)))
      slow = audit[1]["workers"][f"worker:{_WORKERS - 1}"]["batches"]
      row[f"units_of_{size}"] = {"wall_secs": round(_wall(audit), 3),
                                 "ratio": round(_wall(audit) / ideal, 3),
                                 "slow_worker_batches": slow}
    row["load_after"] = common.load_average()
    runs.append(row)
    print(json.dumps(row), flush=True)
  keys = ["static"] + [f"units_of_{s}" for s in _UNITS.value]
  medians = {k: statistics.median(r[k]["ratio"] for r in runs) for k in keys}
  print("median wall / ideal:", medians, flush=True)
  common.write_results(_OUTPUT.value, {"runs": runs, "median_ratio": medians}, sys.argv,
                       workers=_WORKERS, total_batches=_TOTAL.value,
                       step_sleep_secs=_SLEEP.value)


if __name__ == "__main__":
  app.run(main)
