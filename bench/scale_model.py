"""A calibrated model of ps:0's and the chief's load, from bench/scale.py's measured costs.

Each piece's CPU per operation is fitted as a + b·N (least squares) on the measured points
but the largest, which is kept to check the fit (its error is printed). The model then gives,
for a job of N workers that each take `--steps_per_worker` steps a second and one unit every
`--unit_secs`, with every task's heartbeat once a second and `--waiting_share` of the workers
polling the heartbeat rows (a barrier's wait) every `--poll_secs`:

  ps:0's CPU share of one core for admissions, claims, heartbeat writes and reads; the chief's
  for its probes; a barrier's release latency (the measured fit).

Typical usage:
  python -m bench.scale_model bench/results/scale-2026-11-28.json --workers=100,300,1000 \
      --steps_per_worker=20 --unit_secs=30 --plot=bench/results/scale-model.png
"""

import json
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

# piece -> (how to read its cost in µs from a run, what it is)
PIECES: Dict[str, Tuple[Callable[[Dict], float], str]] = {
    "admission (batch gate)": (lambda r: r["steps"]["batch_gate"]["over_plain_ps_cpu_us"],
                               "ps CPU per step over a plain step"),
    "admission (ElasticOptimizer)": (lambda r: r["steps"]["admitted"]["over_plain_ps_cpu_us"],
                                     "ps CPU per step over a plain step"),
    "queue lock (before)": (lambda r: r["steps"]["queue_lock"]["over_plain_ps_cpu_us"],
                            "ps CPU per step over a plain step, serialized"),
    "claim": (lambda r: sum(r["claim"]["ps_cpu_us"]), "ps:0 CPU per claim"),
    "heartbeat write": (lambda r: sum(r["heartbeat"]["write"]["ps_cpu_us"]),
                        "ps:0 CPU per row written"),
    "heartbeat read": (lambda r: sum(r["heartbeat"]["read_all_rows"]["ps_cpu_us"]),
                       "ps:0 CPU per read of all N rows"),
    "barrier": (lambda r: 1000 * r["barrier"]["ps0_cpu_ms_per_barrier"],
                "ps:0 CPU per barrier (every arrival and the release)"),
    "barrier release p50": (lambda r: 1000 * r["barrier"]["p50_ms"],
                            "µs from the chief's gather to the last release"),
    "probe": (lambda r: r["probes"]["cpu_us_per_probe"], "the chief's CPU per probe"),
}


def fit(points: Sequence[Tuple[float, float]]) -> Tuple[float, float]:
  """(a, b) of y = a + b·x by least squares (b = 0 from a single point)."""
  if len(points) == 1:
    return points[0][1], 0.0
  n = len(points)
  mx = sum(x for x, _ in points) / n
  my = sum(y for _, y in points) / n
  sxx = sum((x - mx) ** 2 for x, _ in points)
  b = sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else 0.0
  return my - b * mx, b


def calibrate(runs: List[Dict]) -> Dict[str, Dict]:
  """Per piece: the fit on all measured points but the largest N, and its error there."""
  out = {}
  for piece, (read, what) in PIECES.items():
    try:
      points = [(r["workers"], read(r)) for r in runs]
    except KeyError:
      continue
    points.sort()
    a, b = fit(points[:-1])
    n_check, measured = points[-1]
    predicted = a + b * n_check
    out[piece] = {"what": what, "a_us": round(a, 2), "b_us_per_worker": round(b, 4),
                  "points": points, "checked_at": n_check, "measured_us": round(measured, 1),
                  "predicted_us": round(predicted, 1),
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
    out["chief_probes"] = n * cost("probe") / 1e6 / probe_period_secs(n)
  if "barrier release p50" in model:
    out["barrier_release_secs"] = cost("barrier release p50") / 1e6
  return {k: round(v, 4) for k, v in out.items()}


def main(argv):
  if len(argv) != 2:
    raise app.UsageError("usage: python -m bench.scale_model <bench/results/scale-*.json>")
  with open(argv[1]) as f:
    runs = json.load(f)["results"]["runs"]
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
      if key != "barrier_release_secs":
        ax.plot(ns, [table[n][key] for n in ns], marker="o", label=key)
    ax.set(title=f"modelled load, {_STEPS.value:g} steps/s per worker (1.0 = one core)",
           xlabel="workers", xscale="log", yscale="log")
    ax.legend(fontsize=7)
    common.save_plot(fig, _PLOT.value)


if __name__ == "__main__":
  app.run(main)
