"""A calibrated model of ps:0's and the chief's load, from bench/scale.py's measured costs.

Each piece's CPU per operation is fitted on the measured points but the largest, which is kept
to check the fit (its error is printed): a cost per operation that should not depend on N by
the median, the barrier's by a + b·N (least squares). The model then gives,
for a job of N workers that each take `--steps_per_worker` steps a second and one unit every
`--unit_secs`, with every task's heartbeat once a second and `--waiting_share` of the workers
polling the heartbeat rows (a barrier's wait) every `--poll_secs`:

  ps:0's CPU share of one core for admissions, claims, heartbeat writes and reads; the chief's
  for its probes (capped at 5 % by the watch's own pacing); a barrier's ps work.

Typical usage:
  python -m bench.scale_model bench/results/scale-1ps-2026-11-28.json \
      bench/results/scale-2026-11-28.json --workers=100,300,1000 \
      --steps_per_worker=20 --unit_secs=30 --plot=bench/results/scale-model.png
"""

import json
import statistics
import sys
from typing import Callable, Dict, List, Sequence, Tuple

from absl import app
from absl import flags

from bench import common

_WORKERS = flags.DEFINE_list("workers", ["100", "300", "1000"], "Job sizes to model.")
_STEPS = flags.DEFINE_float("steps_per_worker", 20.0, "Steps per second of each worker.")
_UNIT_SECS = flags.DEFINE_float("unit_secs", 30.0, "Seconds of training per work unit.")
_WAITING = flags.DEFINE_float("waiting_share", 0.1, "Share of the workers in a barrier wait.")
_POLL = flags.DEFINE_float("poll_secs", 0.5, "How often a waiting worker reads the rows.")
_PLOT = flags.DEFINE_string("plot", None, "Write the modelled loads (PNG) here.")
_OUTPUT = flags.DEFINE_string("output", None, "Write the model's figures as JSON here.")

# piece -> (how to read its cost in µs from a run, its form in N, what it is). "flat": a cost
# per operation that should not depend on N (modelled by the median of the fitted points: the
# figures are noisy on a shared 2-core machine); "linear": a + b·N by least squares.
PIECES: Dict[str, Tuple[Callable[[Dict], float], str, str]] = {
    "admission (batch gate)": (
        lambda r: r["capacity"]["batch_gate"]["ps0_cpu_us_per_admission"], "flat",
        "ps:0 CPU per step's admission (no client: bench.scale's capacity)"),
    "admission (ElasticOptimizer)": (
        lambda r: r["steps"]["admitted"]["over_plain_ps_cpu_us"], "flat",
        "ps CPU per step over a plain step, one ps (admission, staging, count)"),
    "queue lock (before)": (
        lambda r: r["capacity"]["queue_lock"]["ps0_cpu_us_per_admission"], "flat",
        "ps:0 CPU per step in the queue's lock, serialized (the gate before 0.2.0)"),
    "claim": (lambda r: sum(r["claim"]["ps_cpu_us"]), "flat", "ps:0 CPU per claim"),
    "heartbeat write": (lambda r: sum(r["heartbeat"]["write"]["ps_cpu_us"]), "flat",
                        "ps:0 CPU per row written"),
    "heartbeat read": (lambda r: sum(r["heartbeat"]["read_all_rows"]["ps_cpu_us"]), "flat",
                       "ps:0 CPU per read of all N rows"),
    "barrier": (lambda r: 1000 * r["barrier"]["ps0_cpu_ms_per_barrier"], "linear",
                "ps:0 CPU per barrier (every arrival and the release)"),
    "probe": (lambda r: r["probes"]["cpu_us_per_probe"], "flat", "the chief's CPU per probe"),
}


def fit(points: Sequence[Tuple[float, float]], form: str) -> Tuple[float, float]:
  """(a, b) of y = a + b·x: the median (b = 0) for "flat", least squares for "linear"."""
  if form == "flat" or len(points) == 1:
    return statistics.median(y for _, y in points), 0.0
  n = len(points)
  mx = sum(x for x, _ in points) / n
  my = sum(y for _, y in points) / n
  sxx = sum((x - mx) ** 2 for x, _ in points)
  b = sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else 0.0
  return my - b * mx, b


def calibrate(runs: List[Dict]) -> Dict[str, Dict]:
  """Per piece: the fit on all measured points but the largest N, and its error there."""
  out = {}
  for piece, (read, form, what) in PIECES.items():
    try:
      points = sorted((r["workers"], read(r)) for r in runs)
    except KeyError:
      continue
    a, b = fit(points[:-1], form)
    n_check, measured = points[-1]
    predicted = a + b * n_check
    out[piece] = {"what": what, "form": form, "a_us": round(a, 2),
                  "b_us_per_worker": round(b, 4), "points": points, "checked_at": n_check,
                  "measured_us": round(measured, 1), "predicted_us": round(predicted, 1),
                  "error": round((predicted - measured) / measured, 3) if measured else None}
  return out


def loads(model: Dict[str, Dict], n: int) -> Dict[str, float]:
  """Shares of one core (1.0 = a core busy) at N workers, and the barrier's latency (s)."""
  cost = lambda piece: model[piece]["a_us"] + model[piece]["b_us_per_worker"] * n  # µs
  steps = n * _STEPS.value
  claims = n / _UNIT_SECS.value
  out = {
      "ps0_admission_gate": steps * cost("admission (batch gate)") / 1e6,
      "ps0_admission_elastic_optimizer": steps * cost("admission (ElasticOptimizer)") / 1e6,
      "ps0_claims": claims * cost("claim") / 1e6,
      "ps0_heartbeats": (n * cost("heartbeat write") +
                         n * _WAITING.value / _POLL.value * cost("heartbeat read")) / 1e6,
  }
  if "queue lock (before)" in model:
    out["queue_lock_busy (before)"] = steps * cost("queue lock (before)") / 1e6
  if "probe" in model:
    from hooks.elastic.lost_workers import probe_period_secs  # pylint: disable=g-import-not-at-top
    # The watch waits at least its round's CPU over 5 % (hooks.elastic.lost_workers).
    out["chief_probes"] = min(0.05, n * cost("probe") / 1e6 / probe_period_secs(n))
    out["probe_round_secs"] = max(probe_period_secs(n), n * cost("probe") / 1e6 / 0.05)
  if "barrier" in model:  # an upper bound: the barrier's ps work done one op after another
    out["barrier_secs_at_most"] = cost("barrier") / 1e6
  return {k: round(v, 4) for k, v in out.items()}


def main(argv):
  if len(argv) < 2:
    raise app.UsageError("usage: python -m bench.scale_model <scale-*.json> [<more runs>]: "
                         "each piece is read from the first file that has it")
  runs_by_file = []
  for path in argv[1:]:
    with open(path) as f:
      runs_by_file.append(json.load(f)["results"]["runs"])
  runs = [dict(row) for row in runs_by_file[0]]
  for more in runs_by_file[1:]:  # pieces the first file lacks (e.g. a one-ps run's capacity)
    by_n = {r["workers"]: r for r in more}
    for row in runs:
      for key, value in by_n.get(row["workers"], {}).items():
        row.setdefault(key, value)
  model = calibrate(runs)
  for piece, m in model.items():
    print(f"{piece:32s} {m['a_us']:9.1f} + {m['b_us_per_worker']:8.4f}·N µs ({m['what']}); "
          f"at N={m['checked_at']}: predicted {m['predicted_us']}, measured {m['measured_us']} "
          f"({100 * (m['error'] or 0):+.0f} %)")
  table = {n: loads(model, n) for n in map(int, _WORKERS.value)}
  for n, row in table.items():
    print(n, row)
  common.write_results(_OUTPUT.value, {"model": model, "loads": table}, sys.argv,
                       steps_per_worker=_STEPS.value, unit_secs=_UNIT_SECS.value,
                       waiting_share=_WAITING.value, poll_secs=_POLL.value)
  if _PLOT.value:
    pyplot = common.plt()
    fig, ax = pyplot.subplots(figsize=(7, 4))
    ns = list(table)
    for key in next(iter(table.values())):
      if key not in ("barrier_secs_at_most", "probe_round_secs"):
        ax.plot(ns, [table[n][key] for n in ns], marker="o", label=key)
    ax.set(title=f"modelled load, {_STEPS.value:g} steps/s per worker (1.0 = one core)",
           xlabel="workers", xscale="log", yscale="log")
    ax.legend(fontsize=7)
    common.save_plot(fig, _PLOT.value)


if __name__ == "__main__":
  app.run(main)
