"""Start-up: from process start to every worker's first step, ours vs stock, 2/4/8 workers.

Each run is one localhost cluster (1 ps + N workers, bench.startup_scaling_task); ours and
stock alternate per size. Two figures per run: the start-up beyond the processes' own start
(the last worker's first step minus the moment the last process had TensorFlow imported, its
graph built and its server up), and the whole time from the first process's exec to the last
worker's first step. Stock's workers re-check the chief's initialisation every 30 s
(MonitoredTrainingSession), ours every 0.5 s, then pass the start barrier.

See also bench/startup.py (branch mts-dropin): the chief's initialisation to every worker's
first step with the MonitoredTrainingSession drop-in, 6 training tasks, a late chief.

Typical usage:
  python -m bench.startup_scaling --workers=2,4,8 --repetitions=5
"""

import statistics
import sys

from absl import app
from absl import flags

from bench import common

_WORKERS = flags.DEFINE_list("workers", ["2", "4", "8"], "Cluster sizes.")
_REPETITIONS = flags.DEFINE_integer("repetitions", 5, "Repetitions.", lower_bound=1)
_OUTPUT = flags.DEFINE_string("output", None, "Write all results as JSON here.")
_PLOT = flags.DEFINE_string("plot", None, "Write a PNG here.")
_VARIANTS = ("ours", "stock")


def _plot(summary, path):
  plt = common.plt()
  fig, ax = plt.subplots(figsize=(6, 4))
  ns = sorted({s["workers"] for s in summary})
  for k, v in enumerate(_VARIANTS):
    ys = [next(s for s in summary if s["workers"] == n and s["variant"] == v) for n in ns]
    ax.bar([i + 0.4 * k for i in range(len(ns))], [y["beyond_median"] for y in ys], 0.4,
           yerr=[[y["beyond_median"] - y["beyond_min"] for y in ys],
                 [y["beyond_max"] - y["beyond_median"] for y in ys]], capsize=4, label=v)
  ax.axhline(2.0, color="red", linestyle=":", label="goal 2 s")
  ax.set_xticks([i + 0.2 for i in range(len(ns))], [str(n) for n in ns])
  ax.set_xlabel("workers")
  ax.set_ylabel("last first step - last process ready (s)")
  ax.legend()
  common.save_plot(fig, path)


def main(argv):
  del argv
  runs, loads = [], [common.load_average()]
  for rep in range(_REPETITIONS.value):
    for n in (int(w) for w in _WORKERS.value):
      for variant in _VARIANTS:
        rows = common.run_tasks(["-m", "bench.startup_scaling_task", f"--variant={variant}",
                                 "--epochsync_log_every_secs=30"], n, timeout_secs=300,
                                prefix="epochsync-bench-startup-")
        run = {"variant": variant, "workers": n, "repetition": rep,
               "beyond_secs": max(r["first_step"] for r in rows.values()) -
                              max(r["ready"] for r in rows.values()),
               "total_secs": max(r["first_step"] for r in rows.values()) -
                             min(r["exec"] for r in rows.values()),
               "own_start_secs": max(r["ready"] - r["exec"] for r in rows.values()),
               "load_before": loads[-1][0]}
        runs.append(run)
        loads.append(common.load_average())
        print(f"rep={rep} workers={n} {variant:>5}: first steps {run['beyond_secs']:.2f} s after "
              f"the last process was ready ({run['total_secs']:.2f} s after the first exec; "
              f"own start up to {run['own_start_secs']:.2f} s)", flush=True)
  summary = []
  print("\nworkers  variant  beyond own start: median (min..max)  exec -> all first steps")
  for n in (int(w) for w in _WORKERS.value):
    for v in _VARIANTS:
      b = sorted(r["beyond_secs"] for r in runs if r["workers"] == n and r["variant"] == v)
      t = [r["total_secs"] for r in runs if r["workers"] == n and r["variant"] == v]
      row = {"workers": n, "variant": v, "beyond_median": statistics.median(b),
             "beyond_min": b[0], "beyond_max": b[-1], "total_median": statistics.median(t)}
      summary.append(row)
      print(f"{n:>7}  {v:<7}  {row['beyond_median']:6.2f} s ({b[0]:.2f}..{b[-1]:.2f})"
            f"                 {row['total_median']:6.2f} s")
  print(f"\nload average (1 min) before each run and at the end: {[l[0] for l in loads]}")
  common.write_results(_OUTPUT.value, {"runs": runs, "summary": summary}, sys.argv,
                       load_average=loads)
  if _PLOT.value:
    _plot(summary, _PLOT.value)


if __name__ == "__main__":
  app.run(main)
