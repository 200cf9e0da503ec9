"""tf-epochsync's epoch barrier vs the source's polling barrier, 2, 4 and 8 workers.

One cluster per size (1 ps + N workers, bench.barrier_task on every worker) runs, epoch after
epoch, idle / baseline / ours (see bench.barrier_task) --repetitions times, so the variants
alternate in the same processes. Per size it prints, exactly:

  barrier workers=N baseline_ms=X ours_ms=Y rtt_ms=R straggler_slowdown_baseline=A straggler_slowdown_ours=B

X and Y: median over epochs of the time from the last worker's arrival (the straggler entering
the barrier) to the moment every worker has left it. R: the median of trivial session.run reads
of a scalar on ps:0 in the same run. A and B: the straggler's median step time while the other
N-1 wait in that barrier, over its median step while they sleep (idle). Then a table with the
latency in round trips, the session.run calls per worker per barrier, and the load on ps:0
while the N-1 wait (session.run calls and liveness probes per second, ps:0's CPU).

Typical usage:
  python -m bench.barrier                                  # 2, 4, 8 workers, 5 repetitions
  python -m bench.barrier --workers=2 --repetitions=2 --straggler_steps=60
"""

import statistics
import sys
from typing import Dict, List

from absl import app
from absl import flags

from bench import common

_WORKERS = flags.DEFINE_list("workers", ["2", "4", "8"], "Cluster sizes.")
_REPETITIONS = flags.DEFINE_integer("repetitions", 5, "Epochs of each variant per size.",
                                    lower_bound=1)
_STRAGGLER_STEPS = flags.DEFINE_integer("straggler_steps", 300, "The straggler's batches.")
_IDLE_SECS = flags.DEFINE_float("idle_secs", 4.0, "The others' sleep in idle epochs.")
_OUTPUT = flags.DEFINE_string("output", None, "Write all results as JSON here.")
_PLOT = flags.DEFINE_string("plot", None, "Write a PNG of the latencies here.")


def _median(values):
  return statistics.median(values) if values else float("nan")


def _analyse(rows: Dict[str, dict], sampler, n: int) -> dict:
  """The figures of one cluster run (see the module doc)."""
  tasks = sorted(rows)
  straggler = next(t for t in tasks if rows[t]["straggler"])
  others = [t for t in tasks if t != straggler]
  steps = rows[straggler]["steps"]
  rtt = [s for t in tasks for s in rows[t]["rtt_secs"]]
  by_epoch = {}
  for t in tasks:
    for e in rows[t]["epochs"]:
      by_epoch.setdefault(e["epoch"], {})[t] = e
  out = {v: {"latency_secs": [], "release_secs": {}, "step_secs": [], "runs_per_barrier": [],
             "wait_secs": [], "runs": 0, "probes": 0, "ps0_probes": 0, "ps0_cpu_secs": 0.0}
         for v in ("idle", "baseline", "ours")}
  for epoch, recs in sorted(by_epoch.items()):
    variant = recs[straggler]["variant"]
    if variant.startswith("warmup"):
      continue
    fig = out[variant]
    trained_from = recs[straggler]["trained_from"]
    if variant == "idle":  # The straggler's steps while every other worker sleeps.
      start = max([recs[t]["idle"][0] for t in others] + [trained_from])
      end = min(recs[t]["idle"][1] for t in others)
    else:  # ... while every other worker waits at the barrier.
      start = max([recs[t]["arrived"] for t in others] + [trained_from])
      end = recs[straggler]["arrived"]
      last_arrival = max(r["arrived"] for r in recs.values())
      fig["latency_secs"].append(max(r["released"] for r in recs.values()) - last_arrival)
      for t in tasks:  # Who is released last: the chief, the straggler (last arrival), others.
        role = "straggler" if t == straggler else "chief" if t == tasks[0] else "others"
        fig["release_secs"].setdefault(role, []).append(recs[t]["released"] - last_arrival)
      fig["runs_per_barrier"] += [recs[t]["runs"] for t in tasks]
      # Steady state: from 50 ms after the last of them arrived (its arrival's own runs are
      # not waiting) to the straggler's arrival.
      start_calls = start + 0.05
      if end > start_calls:
        fig["wait_secs"].append(end - start_calls)
        fig["ps0_cpu_secs"] += sampler.cpu_between("ps:0", start_calls, end)
        for t in others:
          for kind in ("runs", "probes", "ps0_probes"):
            fig[kind] += sum(start_calls <= x <= end for x in rows[t]["call_times"][kind])
    fig["step_secs"] += [b - a for a, b in steps if a >= start and b <= end]
  rtt_secs = _median(rtt)
  result = {"workers": n, "rtt_secs": rtt_secs}
  idle_step = _median(out["idle"]["step_secs"])
  for v, fig in out.items():
    waited = sum(fig["wait_secs"])
    latency = _median(fig["latency_secs"])
    result[v] = {
        "latency_ms": latency * 1e3, "latency_rtts": latency / rtt_secs,
        "latency_ms_all": [x * 1e3 for x in fig["latency_secs"]],
        "release_ms_by_role": {role: _median(x) * 1e3 for role, x in fig["release_secs"].items()},
        "straggler_step_ms": _median(fig["step_secs"]) * 1e3,
        "straggler_steps_measured": len(fig["step_secs"]),
        "straggler_slowdown": _median(fig["step_secs"]) / idle_step,
        "runs_per_worker_per_barrier": _median(fig["runs_per_barrier"]),
        "runs_per_worker_per_barrier_max": max(fig["runs_per_barrier"], default=0),
        "waited_secs": waited,
        "ps0_session_runs_per_sec": fig["runs"] / waited if waited else float("nan"),
        "ps0_probes_per_sec": fig["ps0_probes"] / waited if waited else float("nan"),
        "probes_per_sec": fig["probes"] / waited if waited else float("nan"),
        "ps0_cpu_ms_per_sec": fig["ps0_cpu_secs"] * 1e3 / waited if waited else float("nan")}
  return result


def _plot(results: List[dict], path: str) -> None:
  plt = common.plt()
  fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
  ns = [r["workers"] for r in results]
  for v, style in (("baseline", "s-"), ("ours", "o-")):
    ax1.plot(ns, [r[v]["latency_ms"] for r in results], style, label=v)
    ax2.plot(ns, [r[v]["straggler_slowdown"] for r in results], style, label=v)
  ax1.plot(ns, [r["rtt_secs"] * 1e3 for r in results], "k:", label="1 round trip")
  ax1.set_xlabel("workers")
  ax1.set_ylabel("last arrival -> all released (ms, median)")
  ax1.set_xticks(ns)
  ax1.legend()
  ax2.axhline(1.0, color="gray", linewidth=0.8)
  ax2.set_xlabel("workers")
  ax2.set_ylabel("straggler step time / with idle peers")
  ax2.set_xticks(ns)
  ax2.legend()
  common.save_plot(fig, path)


def main(argv):
  del argv
  results, loads = [], [common.load_average()]
  for n in (int(w) for w in _WORKERS.value):
    args = ["-m", "bench.barrier_task", f"--repetitions={_REPETITIONS.value}",
            f"--straggler_steps={_STRAGGLER_STEPS.value}", f"--idle_secs={_IDLE_SECS.value}",
            "--epochsync_log_every_secs=30"]
    rows = common.run_tasks(args, n, timeout_secs=600, sample_cpu=True,
                            prefix="epochsync-bench-barrier-")
    sampler = rows.pop("cpu")
    result = _analyse(rows, sampler, n)
    result["load_after"] = common.load_average()
    loads.append(result["load_after"])
    results.append(result)
    b, o = result["baseline"], result["ours"]
    print(f"barrier workers={n} baseline_ms={b['latency_ms']:.2f} ours_ms={o['latency_ms']:.2f} "
          f"rtt_ms={result['rtt_secs'] * 1e3:.2f} "
          f"straggler_slowdown_baseline={b['straggler_slowdown']:.3f} "
          f"straggler_slowdown_ours={o['straggler_slowdown']:.3f}", flush=True)
  print("\nworkers  variant   latency ms (min..max)     in RTTs  runs/worker/barrier  "
        "while N-1 wait: runs/s  ps:0 probes/s  ps:0 CPU ms/s")
  for r in results:
    for v in ("baseline", "ours"):
      f = r[v]
      lat = f["latency_ms_all"]
      print(f"{r['workers']:>7}  {v:<8}  {f['latency_ms']:8.2f} ({min(lat):.2f}..{max(lat):.2f})"
            f"  {f['latency_rtts']:7.1f}  {f['runs_per_worker_per_barrier']:8.0f} "
            f"(max {f['runs_per_worker_per_barrier_max']:.0f})"
            f"  {f['ps0_session_runs_per_sec']:18.1f}  {f['ps0_probes_per_sec']:13.1f}"
            f"  {f['ps0_cpu_ms_per_sec']:13.1f}")
  print("\nreleased after the last arrival, median ms, by task: chief (worker:0), straggler "
        "(the last arrival), others")
  for r in results:
    for v in ("baseline", "ours"):
      roles = r[v]["release_ms_by_role"]
      print(f"{r['workers']:>7}  {v:<8}  " + "  ".join(
          f"{role} {roles[role]:.2f}" for role in ("chief", "straggler", "others") if role in roles))
  print(f"\nload average (1, 5, 15 min) at the start and after each size: {loads}")
  common.write_results(_OUTPUT.value, results, sys.argv, load_average=loads,
                       repetitions=_REPETITIONS.value, straggler_steps=_STRAGGLER_STEPS.value)
  if _PLOT.value:
    _plot(results, _PLOT.value)


if __name__ == "__main__":
  app.run(main)
