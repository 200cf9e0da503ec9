"""Per-epoch overhead (done signal + barrier + save + next epoch's start) as the job grows.

Two sweeps of bench.growth_task, one localhost cluster (1 ps) per point, short epochs of a model
of V variables of 16 floats with the user's full stack (a checkpoint per epoch):

  workers 1, 2, 4, 8 at V = 100        variables 10, 100, 1000 at 4 workers

Per epoch, between the last step of epoch e (the last worker's) and the first step of epoch e+1
(the last worker's to start): the done signal (the slowest task's), the barrier (the last
arriver's wait from its arrival to its release, the chief's save left out), the chief's save,
and the next epoch's start (iterator re-initialised, local step refreshed, first batch read:
the slowest task's). Medians over --epochs - 2 epochs (the first and the last are left out).

Typical usage:
  python -m bench.growth --plot=bench/results/growth.png
  python -m bench.growth --workers=1,2 --variables=10 --epochs=4
"""

import statistics
import sys
from typing import Dict, List

from absl import app
from absl import flags

from bench import common

_WORKERS = flags.DEFINE_list("workers", ["1", "2", "4", "8"], "Worker counts (at --fixed_vars).")
_VARIABLES = flags.DEFINE_list("variables", ["10", "100", "1000"],
                               "Variable counts (at --fixed_workers).")
_FIXED_WORKERS = flags.DEFINE_integer("fixed_workers", 4, "Workers of the variable sweep.")
_FIXED_VARS = flags.DEFINE_integer("fixed_vars", 100, "Variables of the worker sweep.")
_EPOCHS = flags.DEFINE_integer("epochs", 7, "Epochs per point (the first and last left out).")
_OUTPUT = flags.DEFINE_string("output", None, "Write all results as JSON here.")
_PLOT = flags.DEFINE_string("plot", None, "Write a PNG here.")

_PARTS = ("done", "barrier", "save", "start")


def _analyse(rows: Dict[str, dict]) -> dict:
  """Median seconds of each part of the per-epoch overhead, and of the whole gap."""
  tasks = sorted(rows)
  chief = rows[tasks[0]] if "worker:0" not in rows else rows["worker:0"]
  parts: Dict[str, List[float]] = {p: [] for p in _PARTS + ("gap", "step")}
  epochs = sorted(int(e) for e in chief["marks"])
  for e in epochs[1:-1]:
    marks = {t: rows[t]["marks"][str(e)] for t in tasks}
    last_arrival = max(tasks, key=lambda t: marks[t]["done_sent"])
    save = chief["saves"][e]
    saved = save[1] - save[0]
    next_release = {t: [a for a, _ in rows[t]["steps"] if a >= marks[t]["released"]]
                    for t in tasks}
    starts = {t: min(v) - marks[t]["released"] for t, v in next_release.items() if v}
    parts["done"].append(max(m["done_sent"] - m["last_step_done"] for m in marks.values()))
    parts["barrier"].append(marks[last_arrival]["released"] - marks[last_arrival]["done_sent"]
                            - saved)
    parts["save"].append(saved)
    parts["start"].append(max(starts.values()))
    last_step = max(m["last_step_done"] for m in marks.values())
    first_next = max(min(v) for v in next_release.values() if v)
    parts["gap"].append(first_next - last_step)
  steps = [b - a for a, b in chief["steps"][5:]]
  parts["step"] = [statistics.median(steps)] if steps else []
  return {p: statistics.median(v) * 1e3 for p, v in parts.items() if v} | {
      p + "_all": [x * 1e3 for x in v] for p, v in parts.items()}


def _plot(by_workers: List[dict], by_vars: List[dict], path: str) -> None:
  plt = common.plt()
  fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
  for ax, points, key, label in ((ax1, by_workers, "workers", "workers"),
                                 (ax2, by_vars, "variables", "variables (16 floats each)")):
    xs = [p[key] for p in points]
    bottom = [0.0] * len(points)
    for part in _PARTS:
      ys = [p[part] for p in points]
      ax.bar([str(x) for x in xs], ys, bottom=bottom, label=part)
      bottom = [b + y for b, y in zip(bottom, ys)]
    ax.plot([str(x) for x in xs], [p["gap"] for p in points], "k.-", label="measured gap")
    ax.set_xlabel(label)
    ax.set_ylabel("ms per epoch (median)")
    ax.legend()
  ax1.set_title(f"per-epoch overhead vs workers ({_FIXED_VARS.value} variables)")
  ax2.set_title(f"per-epoch overhead vs variables ({_FIXED_WORKERS.value} workers)")
  common.save_plot(fig, path)


def _point(workers: int, variables: int) -> dict:
  rows = common.run_tasks(["-m", "bench.growth_task", f"--variables={variables}",
                           f"--epochs={_EPOCHS.value}", "--epochsync_log_every_secs=30"],
                          workers, timeout_secs=600, prefix="epochsync-bench-growth-")
  point = {"workers": workers, "variables": variables, **_analyse(rows),
           "load_after": common.load_average()}
  print(f"workers={workers} variables={variables}: per epoch "
        + ", ".join(f"{p} {point[p]:.1f} ms" for p in _PARTS + ("gap",))
        + f" (a step: {point.get('step', float('nan')):.1f} ms; load {point['load_after'][0]})",
        flush=True)
  return point


def main(argv):
  del argv
  loads = [common.load_average()]
  by_workers = [_point(int(w), _FIXED_VARS.value) for w in _WORKERS.value]
  by_vars = [_point(_FIXED_WORKERS.value, int(v)) for v in _VARIABLES.value]
  print("\nsweep      workers  variables   done  barrier    save   start    gap (ms per epoch)")
  for name, points in (("workers", by_workers), ("variables", by_vars)):
    for p in points:
      print(f"{name:<9}  {p['workers']:>7}  {p['variables']:>9}  "
            + "  ".join(f"{p[k]:6.1f}" for k in _PARTS + ("gap",)))
  loads.append(common.load_average())
  print(f"\nload average (1, 5, 15 min) at the start and at the end: {loads}")
  common.write_results(_OUTPUT.value, {"by_workers": by_workers, "by_variables": by_vars},
                       sys.argv, load_average=loads, epochs=_EPOCHS.value)
  if _PLOT.value:
    _plot(by_workers, by_vars, _PLOT.value)


if __name__ == "__main__":
  app.run(main)
