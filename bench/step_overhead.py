"""Median step time of tf-epochsync's full stack vs stock, variants run alternately.

Each case (model, size, number of workers) runs its variants alternately in one invocation
(stock, ours, stock, ours, ...), each run a fresh localhost cluster (1 ps, or --num_ps, + N
worker processes), so that machine noise hits every variant. Per case it prints the summary
table `workers variant median_ms ratio paired (min..max)`: the median over repetitions of each
run's median step, its ratio to the first variant's, and the median (min..max) of the ratios
paired by repetition; then the extra milliseconds per step.

Typical usage:
  python -m bench.step_overhead                                  # MLP 1M, 2 and 4 workers
  python -m bench.step_overhead --params=0.1M,1M,10M --workers=2 --repetitions=5
  python -m bench.step_overhead --model=ctr --num_ps=2 --workers=2,4
  python -m bench.step_overhead --variants=async,async-hooks    # epoch hooks without sync
  python -m bench.step_overhead --trace --repetitions=1          # + one traced step per variant
"""

import itertools
import statistics
import sys
from typing import Dict, List

from absl import app
from absl import flags

from bench import common

_WORKERS = flags.DEFINE_list("workers", ["2", "4"], "Cluster sizes to measure.")
_REPETITIONS = flags.DEFINE_integer("repetitions", 5, "ABAB repetitions per case.", lower_bound=1)
_STEPS = flags.DEFINE_integer("steps", 200, "Synchronous steps per run.")
_WARMUP = flags.DEFINE_integer("warmup", 20, "Leading steps left out of the median.")
_MODEL = flags.DEFINE_enum("model", "mlp", ["mlp", "ctr"], "The model (see bench.sync_task).")
_PARAMS = flags.DEFINE_list("params", ["1M"], "MLP size presets: 0.1M, 1M, 10M.")
_NUM_PS = flags.DEFINE_integer("num_ps", 1, "ps tasks (ctr: the embedding is split over them).")
_OUTPUT = flags.DEFINE_string("output", None, "Write all results as JSON here.")
_PLOT = flags.DEFINE_string("plot", None, "Write a PNG of the extra ms per step here.")
_VARIANTS = flags.DEFINE_list("variants", ["stock", "ours"], "Run alternately, in this order; "
                              "ratios are against the first.")
_TRACE = flags.DEFINE_bool("trace", False, "Before the timed runs, one run per variant that "
                           "traces step 30 (RunMetadata FULL_TRACE) and times every hook.")

_SYNC = ("stock", "ours", "ours-bare")


def _one_run(variant: str, num_workers: int, params: str, trace: bool = False) -> dict:
  args = ["-m", "bench.sync_task", f"--variant={variant}", f"--model={_MODEL.value}",
          f"--params={params}", f"--steps={_STEPS.value}", f"--warmup={_WARMUP.value}"]
  if trace:
    args += [f"--trace_step={min(30, _STEPS.value - 1)}", "--time_hooks"]
  load = common.load_average()[0]
  rows = common.run_tasks(args, num_workers, num_ps=_NUM_PS.value, sample_cpu=True)
  sampler = rows.pop("cpu")
  # CPU per step of each process over its measured steps; a ps task's over the chief's.
  chief = rows["worker:0"]
  cpu = {task: sampler.cpu_between(task, *rows.get(task, chief)["window"]) /
         rows.get(task, chief)["measured_steps"] for task in sampler.names}
  steps = []
  for row in rows.values():
    steps += row["step_secs"][_WARMUP.value:]
  last = max(row["tokens"][-1] for row in rows.values())
  # Sync: the last token is the global step after _STEPS updates. Async: every worker's steps
  # raised global_step, less the increments TensorFlow's unlocked assign_add may lose.
  ok = (last == _STEPS.value if variant in _SYNC else
        _STEPS.value * num_workers * 0.9 <= last <= _STEPS.value * num_workers)
  if not ok:
    raise RuntimeError(f"{variant}: last global step {last} after {_STEPS.value} steps of "
                       f"{num_workers} workers: the run did not train as configured")
  run = {"variant": variant, "workers": num_workers, "model": _MODEL.value,
         "params_preset": params, "params": next(iter(rows.values()))["params"],
         "median_step_secs": statistics.median(steps),
         "cpu_secs_per_step": cpu, "cpu_secs_per_step_total": sum(cpu.values()),
         "load_before": load}
  if trace:
    run["trace"] = {t: r["trace"] for t, r in rows.items()}
    run["hook_traces"] = {t: r["hook_traces"] for t, r in rows.items()}
    run["hook_calls"] = {t: r["hook_calls"] for t, r in rows.items()}
    run["hook_secs"] = {t: {k: statistics.median(v) for k, v in r["hook_secs"].items() if v}
                        for t, r in rows.items()}
  return run


def _table(results: List[dict], workers: List[int], variants: List[str]) -> Dict[str, dict]:
  """Prints the summary table of one case; returns its figures by "workers/variant"."""
  base = variants[0]
  print(f"\nworkers  variant      median ms  ratio vs {base:<5}  paired ratios (min..max)")
  out = {}
  for w in workers:
    runs = {v: [r["median_step_secs"] for r in results if r["workers"] == w and
                r["variant"] == v] for v in variants}
    for v in variants:
      pairs = common.paired(runs[v], runs[base])
      diffs = sorted((a - b) * 1e3 for a, b in zip(runs[v], runs[base]))
      fig = {"median_ms": statistics.median(runs[v]) * 1e3,
             "min_ms": min(runs[v]) * 1e3, "max_ms": max(runs[v]) * 1e3,
             "ratio_of_medians": statistics.median(runs[v]) / statistics.median(runs[base]),
             "paired_median": statistics.median(pairs), "paired_min": pairs[0],
             "paired_max": pairs[-1], "extra_ms_paired_median": statistics.median(diffs),
             "extra_ms_min": diffs[0], "extra_ms_max": diffs[-1]}
      out[f"{w}/{v}"] = fig
      print(f"{w:>7}  {v:<11}  {fig['median_ms']:9.2f}  {fig['ratio_of_medians']:14.3f}  "
            f"{fig['paired_median']:.3f} ({pairs[0]:.3f}..{pairs[-1]:.3f})")
  print(f"\nworkers  variant      CPU ms/step, all processes  ratio vs {base}  paired (min..max)")
  for w in workers:
    cpus = {v: [r["cpu_secs_per_step_total"] for r in results if r["workers"] == w and
                r["variant"] == v] for v in variants}
    for v in variants:
      pairs = common.paired(cpus[v], cpus[base])
      fig = out[f"{w}/{v}"]
      fig.update(cpu_ms=statistics.median(cpus[v]) * 1e3, cpu_ratio_of_medians=(
          statistics.median(cpus[v]) / statistics.median(cpus[base])),
                 cpu_paired_median=statistics.median(pairs), cpu_paired_min=pairs[0],
                 cpu_paired_max=pairs[-1])
      print(f"{w:>7}  {v:<11}  {fig['cpu_ms']:26.2f}  {fig['cpu_ratio_of_medians']:14.3f}  "
            f"{fig['cpu_paired_median']:.3f} ({pairs[0]:.3f}..{pairs[-1]:.3f})")
  print(f"\nworkers  variant      extra ms/step vs {base}: median of medians, paired median "
        "(min..max)")
  for w in workers:
    for v in variants[1:]:
      fig = out[f"{w}/{v}"]
      extra = fig["median_ms"] - out[f"{w}/{base}"]["median_ms"]
      print(f"{w:>7}  {v:<11}  {extra:+7.2f}  {fig['extra_ms_paired_median']:+7.2f} "
            f"({fig['extra_ms_min']:+.2f}..{fig['extra_ms_max']:+.2f})")
  return out


def _print_trace(run: dict) -> None:
  """The traced step: per device, its op count and busy time; the hooks' median costs."""
  print(f"\ntrace of one step: {run['variant']}, {run['workers']} workers")
  for task, devices in sorted(run["trace"].items()):
    for device, ops in sorted((devices or {}).items()):
      span = max(s + d for _, s, d in ops) if ops else 0
      print(f"  {task} sees {device}: {len(ops)} ops, span {span / 1e3:.2f} ms")
  for task, runs in sorted(run["hook_traces"].items()):  # e.g. the chief's aggregation run
    for fetch, devices in sorted(runs.items()):
      for device, ops in sorted((devices or {}).items()):
        print(f"  {task} {fetch[:50]} on {device}: {len(ops)} ops")
  for task, hooks in sorted(run["hook_secs"].items()):
    for name, secs in sorted(hooks.items()):
      print(f"  {task} {name}: {secs * 1e6:.0f} us")


def _plot(summaries: Dict[str, Dict[str, dict]], variants: List[str], path: str) -> None:
  plt = common.plt()
  fig, ax = plt.subplots(figsize=(6, 4))
  cases = list(summaries)
  for v in variants[1:]:
    for w in sorted({k.split("/")[0] for s in summaries.values() for k in s}, key=int):
      ys = [summaries[c][f"{w}/{v}"]["extra_ms_paired_median"] for c in cases]
      lo = [y - summaries[c][f"{w}/{v}"]["extra_ms_min"] for c, y in zip(cases, ys)]
      hi = [summaries[c][f"{w}/{v}"]["extra_ms_max"] - y for c, y in zip(cases, ys)]
      ax.errorbar(cases, ys, yerr=[lo, hi], marker="o", capsize=4, label=f"{v}, {w} workers")
  ax.axhline(0, color="gray", linewidth=0.8)
  ax.set_ylabel(f"extra ms per step vs {variants[0]} (paired median, min..max)")
  ax.set_xlabel("model")
  ax.legend()
  common.save_plot(fig, path)


def main(argv):
  del argv
  workers = [int(w) for w in _WORKERS.value]
  variants = list(_VARIANTS.value)
  results, summaries, traces = [], {}, []
  loads = [common.load_average()]
  for params in _PARAMS.value:
    case = f"{_MODEL.value} {params}" if _MODEL.value == "mlp" else _MODEL.value
    if _TRACE.value:
      for w, v in itertools.product(workers, variants):
        traces.append(_one_run(v, w, params, trace=True))
        _print_trace(traces[-1])
    case_results = []
    for w in workers:
      for rep in range(_REPETITIONS.value):
        for v in variants:
          run = _one_run(v, w, params)
          run["repetition"] = rep
          case_results.append(run)
          print(f"{case} workers={w} rep={rep} {v:>11}: median step "
                f"{run['median_step_secs'] * 1e3:.2f} ms ({run['params']:,} params, "
                f"load {run['load_before']})", flush=True)
    print(f"\n# {case}: {case_results[0]['params']:,} parameters, {_NUM_PS.value} ps, "
          f"{_REPETITIONS.value} repetitions")
    summaries[case] = _table(case_results, workers, variants)
    results += case_results
    loads.append(common.load_average())
  print(f"\nload average (1, 5, 15 min) at the start and after each case: {loads}")
  common.write_results(_OUTPUT.value, {"runs": results, "summary": summaries,
                                       "traces": traces},
                       sys.argv, load_average=loads, steps=_STEPS.value, warmup=_WARMUP.value)
  if _PLOT.value:
    _plot(summaries, variants, _PLOT.value)


if __name__ == "__main__":
  app.run(main)
