"""Median synchronous step time of WorkerDoneSyncReplicasOptimizer vs stock SyncReplicas.

Both run on the same localhost cluster shape (1 ps + N workers, separate processes), the
same ~1M-parameter MLP and even shards, alternately (stock, ours, stock, ours, ...) in one
invocation, so machine noise hits both. Prints the median step time of each and the ratio.

Typical usage:
  python -m bench.step_overhead                      # 2 and 4 workers, 3 repetitions
  python -m bench.step_overhead --workers=2 --repetitions=5 --steps=100
"""

import json
import glob
import os
import statistics
import sys
import tempfile

from absl import app
from absl import flags

from hooks.testing.local_cluster import LocalCluster

_WORKERS = flags.DEFINE_list("workers", ["2", "4"], "Cluster sizes to measure.")
_REPETITIONS = flags.DEFINE_integer("repetitions", 3, "ABAB repetitions per size.")
_STEPS = flags.DEFINE_integer("steps", 60, "Synchronous steps per run.")
_WARMUP = flags.DEFINE_integer("warmup", 10, "Leading steps left out of the median.")
_OUTPUT = flags.DEFINE_string("output", None, "Write all results as JSON here.")
_VARIANTS = flags.DEFINE_list("variants", ["stock", "ours"], "Run alternately, in this order; "
                              "stock must be first (ratios are against it).")


def _one_run(variant: str, num_workers: int) -> dict:
  out = tempfile.mkdtemp(prefix=f"epochsync-bench-{variant}-")
  command = [sys.executable, "-m", "bench.sync_task", f"--variant={variant}",
             f"--steps={_STEPS.value}", f"--output_dir={out}"]
  with LocalCluster(num_workers=num_workers, timeout_secs=300,
                    log_dir=os.path.join(out, "logs")) as cluster:
    cluster.start(command)
    cluster.wait().check()
  steps = []
  for path in glob.glob(os.path.join(out, "*.json")):
    with open(path) as f:
      row = json.load(f)
    steps += row["step_secs"][_WARMUP.value:]
    # Synchronous: the last step's token is the global step after _STEPS updates.
    if row["last_token"] != _STEPS.value:
      raise RuntimeError(f"{variant} {row['task']}: last token {row['last_token']} != "
                         f"{_STEPS.value} steps: the run was not synchronous")
  return {"variant": variant, "workers": num_workers, "params": row["params"],
          "median_step_secs": statistics.median(steps)}


def main(argv):
  del argv
  results = []
  for workers in (int(w) for w in _WORKERS.value):
    for rep in range(_REPETITIONS.value):
      for variant in _VARIANTS.value:
        run = _one_run(variant, workers)
        run["repetition"] = rep
        results.append(run)
        print(f"workers={workers} rep={rep} {variant:>5}: median step "
              f"{run['median_step_secs'] * 1e3:.2f} ms ({run['params']:,} params)", flush=True)
  print("\nworkers  variant    median ms  ratio vs stock  paired ratios (min..max)")
  for workers in (int(w) for w in _WORKERS.value):
    runs = {v: [r["median_step_secs"] for r in results
                if r["workers"] == workers and r["variant"] == v] for v in _VARIANTS.value}
    for v in _VARIANTS.value:
      paired = sorted(a / b for a, b in zip(runs[v], runs["stock"]))
      print(f"{workers:>7}  {v:<9}  {statistics.median(runs[v]) * 1e3:9.2f}  "
            f"{statistics.median(runs[v]) / statistics.median(runs['stock']):14.3f}  "
            f"{statistics.median(paired):.3f} ({paired[0]:.3f}..{paired[-1]:.3f})")
  if _OUTPUT.value:
    with open(_OUTPUT.value, "w") as f:
      json.dump(results, f, indent=1)


if __name__ == "__main__":
  app.run(main)
