"""One picture of the work queue's benchmarks, drawn from their result files (docs/benchmarks.md
§6-§8): the asynchronous epoch against its ideal, the synchronous steps on Zipf-sized files,
and the batches a resume reads again.

Typical usage (after the three benchmarks wrote their JSONs):
  python -m bench.work_queue_plot \
      --async_json=bench/results/work_queue-2026-11-26.json \
      --sync_json=bench/results/work_queue_sync-2026-11-26.json \
      --skip_json=bench/results/resume_skip-2026-11-26.json \
      --plot=bench/results/work_queue-2026-11-26.png
"""

import json
import statistics

from absl import app
from absl import flags

from bench import common

_ASYNC = flags.DEFINE_string("async_json", None, "bench.work_queue's result.", required=True)
_SYNC = flags.DEFINE_string("sync_json", None, "bench.work_queue_sync's result.", required=True)
_SKIP = flags.DEFINE_string("skip_json", None, "bench.resume_skip's result.", required=True)
_PLOT = flags.DEFINE_string("plot", None, "Write the PNG here.", required=True)


def _results(path: str) -> dict:
  with open(path) as f:
    return json.load(f)["results"]


def main(argv):
  del argv
  pyplot = common.plt()
  fig, (left, middle, right) = pyplot.subplots(1, 3, figsize=(13, 4))
  runs = _results(_ASYNC.value)["runs"]
  keys = ["static"] + sorted((k for k in runs[0] if k.startswith("units_of_")),
                             key=lambda k: int(k.rsplit("_", 1)[1]))
  ratios = [statistics.median(r[k]["ratio"] for r in runs) for k in keys]
  left.bar(["static\nshards"] + [f"units\nof {k.rsplit('_', 1)[1]}" for k in keys[1:]], ratios,
           color=["#b55"] + ["#58b"] * (len(keys) - 1))
  left.axhline(1.0, color="k", lw=0.8)
  left.axhline(1.1, color="k", lw=0.8, ls="--")
  left.set_title("async, one worker at half speed:\nepoch / ideal (median; goal 1.10, dashed)")
  sync = _results(_SYNC.value)
  first = sync["runs"][0]
  names = ["static", "files", "ranges"]
  middle.bar(["static file\nshards", "queue:\nwhole files", "queue: ranges\nof 8 batches"],
             [first[n]["steps"] for n in names], color=["#b55", "#58b", "#58b"])
  middle.axhline(sync["even_split"], color="k", lw=0.8, ls="--")
  middle.set_title("sync, 32 Zipf-sized files, 4 workers:\nsteps per epoch (even split, dashed)")
  skip = _results(_SKIP.value)["runs"][0]
  right.bar(["static shards", "work queue"],
            [skip["static"]["skipped_batches"], skip["queue"]["skipped_batches"]],
            color=["#b55", "#58b"])
  right.set_title(f"resume at step {skip['static']['resumed_at_step']}:\n"
                  "batches read again and thrown away")
  common.save_plot(fig, _PLOT.value)


if __name__ == "__main__":
  app.run(main)
