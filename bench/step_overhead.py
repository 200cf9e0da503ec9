"""CPU and wall time per step of tf-epochsync's full stack vs stock, variants run alternately.

Each case (model, number of workers) runs its variants alternately in one invocation (stock,
ours, stock, ours, ... : --pairs pairs), each run a fresh localhost cluster (1 ps, or
--num_ps, + N worker processes), so that machine noise hits every variant alike. The headline
is the CPU of all the cluster's processes per measured step (user + system from /proc, ps
tasks included), with the wall time per step beside it, both as the median over the pairs of
ours / stock. Every run records the load: the 1-minute load average and the cores that other
processes (outside this benchmark's process tree) used before and during it; a run started
while others used more than 0.5 cores, or an invocation started at a load average above 0.5,
says so (`busy` in the JSON). Per case it prints one line a script can read:

  cpu model=M workers=N pairs=K paired_cpu_ratio=R paired_wall_ratio=W load_before=L

With --trace, one more run per variant first traces one step (RunMetadata FULL_TRACE) and
counts its ops (deterministic, the same at any load); per case it prints

  ops workers=N worker_stock=A worker_ours=B ps0_stock=C ps0_ours=D agg_stock=E agg_ours=F

(a worker's own partition, its part on ps:0, the chief's aggregation run on ps:0; the largest
over tasks). --pairs=0 runs the traces only.

Typical usage:
  python -m bench.step_overhead --trace --pairs=0 --workers=2,4,8   # op counts only
  python -m bench.step_overhead --models=mlp0.1m,mlp1m,ctr --workers=2,4 --pairs=20
  python -m bench.step_overhead --variants=async,async-hooks    # epoch hooks without sync
  python -m bench.step_overhead --models=ctr --workers=2 --variants=ours,ours-units  # the queue
  python -m bench.step_overhead --variants=stock,ours@/tmp/base,ours   # a change vs its base
"""

import itertools
import os
import statistics
import sys
from typing import Dict, List, Tuple

from absl import app
from absl import flags

from bench import common
from bench.noise import OthersCpu, QUIET_LOAD

_WORKERS = flags.DEFINE_list("workers", ["2", "4"], "Cluster sizes to measure.")
_PAIRS = flags.DEFINE_integer("pairs", 20, "Alternating runs of every variant per case; 0: "
                              "only the --trace runs.", lower_bound=0)
flags.DEFINE_alias("repetitions", "pairs")
_STEPS = flags.DEFINE_integer("steps", 200, "Synchronous steps per run.")
_WARMUP = flags.DEFINE_integer("warmup", 20, "Leading steps left out of the measurement.")
_MODEL = flags.DEFINE_enum("model", "mlp", ["mlp", "ctr"], "The model (see bench.sync_task).")
_PARAMS = flags.DEFINE_list("params", ["1M"], "MLP size presets: 0.1M, 1M, 10M.")
_MODELS = flags.DEFINE_list("models", None, "Instead of --model/--params: any of mlp0.1m, "
                            "mlp1m, mlp10m, ctr.")
_NUM_PS = flags.DEFINE_integer("num_ps", None, "ps tasks (default 1, the ctr model 2: its "
                               "embedding is split over them).")
_OUTPUT = flags.DEFINE_string("output", None, "Write all results as JSON here.")
_PLOT = flags.DEFINE_string("plot", None, "Write a PNG of the extra ms per step here.")
_VARIANTS = flags.DEFINE_list("variants", ["stock", "ours"], "Run alternately, in this order; "
                              "ratios are against the first. `ours@DIR`: ours with the hooks "
                              "and bench of the checkout in DIR (e.g. the commit before a change).")
_UNIT_BATCHES = flags.DEFINE_integer("unit_batches", 15, "ours-units: batches per work unit.",
                                     lower_bound=1)
_TRACE = flags.DEFINE_bool("trace", False, "Before the timed runs, one run per variant that "
                           "traces step 30 (RunMetadata FULL_TRACE) and counts its ops.")

_SYNC = ("stock", "ours", "ours-units", "ours-bare")


def _cases() -> List[Tuple[str, str, str]]:
  """(label, model, MLP preset) of every case, e.g. ("mlp0.1m", "mlp", "0.1M")."""
  if not _MODELS.value:
    return [(_label(_MODEL.value, p), _MODEL.value, p) for p in _PARAMS.value]
  cases = []
  for name in _MODELS.value:
    if name == "ctr":
      cases.append(("ctr", "ctr", "1M"))
    elif name.startswith("mlp") and name[3:].upper() in common.MLP_SIZES:
      cases.append((name, "mlp", name[3:].upper()))
    else:
      raise app.UsageError(f"--models: {name!r} is none of ctr, " +
                           ", ".join("mlp" + p.lower() for p in common.MLP_SIZES))
  return cases


def _label(model: str, params: str) -> str:
  return "ctr" if model == "ctr" else "mlp" + params.lower()


def _num_ps(model: str) -> int:
  return _NUM_PS.value or (2 if model == "ctr" else 1)


def _task_module(variant: str) -> Tuple[List[str], str]:
  """The task's python arguments and its bench.sync_task variant.

  `ours@/path/to/checkout` runs `ours` with that checkout's hooks and bench (e.g. a worktree of
  the commit before a change), so a change is paired against its base in one invocation.
  """
  if "@" not in variant:
    return ["-m", "bench.sync_task"], variant
  variant, tree = variant.split("@", 1)
  return ["-c", f"import runpy, sys; sys.path.insert(0, {os.path.abspath(tree)!r}); "
          "runpy.run_module('bench.sync_task', run_name='__main__')"], variant


def _one_run(variant: str, num_workers: int, model: str, params: str, others: OthersCpu,
             trace: bool = False) -> dict:
  module, task_variant = _task_module(variant)
  args = module + [f"--variant={task_variant}", f"--model={model}",
                   f"--params={params}", f"--steps={_STEPS.value}", f"--warmup={_WARMUP.value}",
                   f"--unit_batches={_UNIT_BATCHES.value}"]
  if trace:
    args += [f"--trace_step={min(30, _STEPS.value - 1)}", "--time_hooks"]
  load, others_before = common.load_average()[0], others.cores_before()
  rows = common.run_tasks(args, num_workers, num_ps=_num_ps(model), sample_cpu=True)
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
  # ours-units: as many steps as the units the busiest worker took (all the same size).
  ok = (last == _STEPS.value if task_variant in _SYNC and task_variant != "ours-units" else
        _STEPS.value <= last <= 2 * _STEPS.value if task_variant == "ours-units" else
        _STEPS.value * num_workers * 0.9 <= last <= _STEPS.value * num_workers)
  if not ok:
    raise RuntimeError(f"{variant}: last global step {last} after {_STEPS.value} steps of "
                       f"{num_workers} workers: the run did not train as configured")
  start, end = chief["window"]
  run = {"variant": variant, "workers": num_workers, "model": _label(model, params),
         "params": next(iter(rows.values()))["params"],
         "median_step_secs": statistics.median(steps),
         "wall_secs_per_step": (end - start) / chief["measured_steps"],
         "cpu_secs_per_step": cpu, "cpu_secs_per_step_total": sum(cpu.values()),
         "load_before": load, "others_cores_before": others_before,
         "others_cores_during": others.cores_between(start, end),
         "load_after": common.load_average()[0]}
  run["busy"] = others_before > QUIET_LOAD
  if trace:
    run["trace"] = {t: r["trace"] for t, r in rows.items()}
    run["hook_traces"] = {t: r["hook_traces"] for t, r in rows.items()}
    run["hook_secs"] = {t: {k: statistics.median(v) for k, v in r["hook_secs"].items() if v}
                        for t, r in rows.items()}
  return run


def op_counts(run: dict) -> Dict[str, int]:
  """The traced step's ops: a worker's own partition, its part on ps:0, and the chief's
  aggregation run on ps:0 (the hooks' traced callable: stock's queue runner, ours' aggregate_op),
  each the largest over tasks."""
  counts = {"worker": 0, "ps0": 0, "agg": 0}
  for task, devices in run["trace"].items():
    job, index = task.split(":")
    for device, ops in (devices or {}).items():
      if f"/job:{job}/replica:0/task:{index}/" in device:
        counts["worker"] = max(counts["worker"], len(ops))
      elif "/job:ps/replica:0/task:0/" in device:
        counts["ps0"] = max(counts["ps0"], len(ops))
  for runs in run["hook_traces"].values():
    for fetch, devices in runs.items():
      for device, ops in (devices or {}).items():
        if fetch.startswith("callable ") and "/job:ps/replica:0/task:0/" in device:
          counts["agg"] = max(counts["agg"], len(ops))
  return counts


def _print_trace(run: dict) -> None:
  """The traced step: per device, its op count and busy time; the hooks' median costs."""
  print(f"\ntrace of one step: {run['model']} {run['variant']}, {run['workers']} workers")
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


def _ops_lines(traces: List[dict], workers: List[int]) -> List[str]:
  lines = []
  for w in workers:
    counts = {r["variant"]: op_counts(r) for r in traces if r["workers"] == w}
    if "stock" in counts and "ours" in counts:
      lines.append(f"ops workers={w} " + " ".join(
          f"{part}_{v}={counts[v][part]}" for part in ("worker", "ps0", "agg")
          for v in ("stock", "ours")))
  return lines


def _median_pair(runs: List[dict], key: str, variant: str, base: str) -> Tuple[float, list]:
  """Median over repetitions of run[key] of `variant` / that of `base` in the same pair."""
  by_rep = {}
  for r in runs:
    by_rep.setdefault(r["pair"], {})[r["variant"]] = r[key]
  ratios = sorted(p[variant] / p[base] for p in by_rep.values() if variant in p and base in p)
  return statistics.median(ratios), ratios


def _table(label: str, runs: List[dict], workers: List[int], variants: List[str],
           load_before: float) -> Tuple[Dict[str, dict], List[str]]:
  """Prints one case's table; returns its figures by "workers/variant" and its cpu lines."""
  base, out, lines = variants[0], {}, []
  print(f"\n# {label}: {runs[0]['params']:,} parameters, {_num_ps(runs[0]['model'][:3])} ps; "
        f"medians over pairs; ratios vs {base} paired by repetition (min..max)")
  print("workers  variant      CPU ms/step  paired CPU ratio        wall ms/step  "
        "paired wall ratio      median step ms  others' cores before, during")
  for w in workers:
    mine = [r for r in runs if r["workers"] == w]
    for v in variants:
      rs = [r for r in mine if r["variant"] == v]
      cpu_ratio, cpus = _median_pair(mine, "cpu_secs_per_step_total", v, base)
      wall_ratio, walls = _median_pair(mine, "wall_secs_per_step", v, base)
      fig = {"cpu_ms": statistics.median(r["cpu_secs_per_step_total"] for r in rs) * 1e3,
             "wall_ms": statistics.median(r["wall_secs_per_step"] for r in rs) * 1e3,
             "median_step_ms": statistics.median(r["median_step_secs"] for r in rs) * 1e3,
             "paired_cpu_ratio": cpu_ratio, "paired_cpu_min": cpus[0],
             "paired_cpu_max": cpus[-1], "paired_wall_ratio": wall_ratio,
             "paired_wall_min": walls[0], "paired_wall_max": walls[-1], "pairs": len(cpus),
             "others_before_max": max(r["others_cores_before"] for r in rs),
             "others_during_median": statistics.median(r["others_cores_during"] for r in rs)}
      out[f"{w}/{v}"] = fig
      print(f"{w:>7}  {v:<11}  {fig['cpu_ms']:11.2f}  {cpu_ratio:.3f} ({cpus[0]:.3f}.."
            f"{cpus[-1]:.3f})  {fig['wall_ms']:12.2f}  {wall_ratio:.3f} ({walls[0]:.3f}.."
            f"{walls[-1]:.3f})  {fig['median_step_ms']:14.2f}  "
            f"{fig['others_before_max']:.2f} (max), {fig['others_during_median']:.2f}")
      if v != base:
        lines.append(f"cpu model={label} workers={w} pairs={len(cpus)} paired_cpu_ratio="
                     f"{cpu_ratio:.3f} paired_wall_ratio={wall_ratio:.3f} "
                     f"load_before={load_before:.2f}" + ("" if v == "ours" else f" variant={v}"))
  return out, lines


def _plot(summaries: Dict[str, Dict[str, dict]], variants: List[str], path: str) -> None:
  plt = common.plt()
  fig, ax = plt.subplots(figsize=(6, 4))
  cases = list(summaries)
  for v in variants[1:]:
    for w in sorted({k.split("/")[0] for s in summaries.values() for k in s}, key=int):
      ys = [summaries[c][f"{w}/{v}"]["paired_cpu_ratio"] for c in cases]
      lo = [y - summaries[c][f"{w}/{v}"]["paired_cpu_min"] for c, y in zip(cases, ys)]
      hi = [summaries[c][f"{w}/{v}"]["paired_cpu_max"] - y for c, y in zip(cases, ys)]
      ax.errorbar(cases, ys, yerr=[lo, hi], marker="o", capsize=4, label=f"{v}, {w} workers")
  ax.axhline(1, color="gray", linewidth=0.8)
  ax.set_ylabel(f"CPU per step / {variants[0]}'s (paired median, min..max)")
  ax.set_xlabel("model")
  ax.legend()
  common.save_plot(fig, path)


def main(argv):
  del argv
  workers = [int(w) for w in _WORKERS.value]
  variants = list(_VARIANTS.value)
  others = OthersCpu()
  load_before, others_before = common.load_average()[0], others.cores_before()
  busy = max(load_before, others_before) > QUIET_LOAD
  note = (f"NOT QUIET: load average {load_before:.2f}, other processes using "
          f"{others_before:.2f} cores before the start (> {QUIET_LOAD}): the CPU and wall "
          "figures carry their noise; the op counts do not") if busy else ""
  if note:
    print(note, flush=True)
  results, summaries, traces, lines = [], {}, [], []
  for label, model, params in _cases():
    if _TRACE.value:
      case_traces = []
      for w, v in itertools.product(workers, variants):
        case_traces.append(_one_run(v, w, model, params, others, trace=True))
        _print_trace(case_traces[-1])
      traces += case_traces
      ops = _ops_lines(case_traces, workers)
      print(f"\n# op counts, {label}\n" + "\n".join(ops), flush=True)
      lines += ops
    if not _PAIRS.value:
      continue
    case_runs = []
    for w in workers:
      for pair in range(_PAIRS.value):
        for v in variants:
          run = _one_run(v, w, model, params, others)
          run["pair"] = pair
          case_runs.append(run)
          print(f"{label} workers={w} pair={pair} {v:>11}: CPU "
                f"{run['cpu_secs_per_step_total'] * 1e3:.2f} ms/step, wall "
                f"{run['wall_secs_per_step'] * 1e3:.2f} ms/step (load "
                f"{run['load_before']}, others {run['others_cores_before']:.2f} cores before"
                f"{', BUSY' if run['busy'] else ''})", flush=True)
    summaries[label], cpu_lines = _table(label, case_runs, workers, variants, load_before)
    lines += cpu_lines
    results += case_runs
  others.stop()
  busy_runs = sum(r["busy"] for r in results)
  if busy_runs:
    note += f"{'; ' if note else 'NOT QUIET: '}{busy_runs} run(s) started while others used " \
            f"> {QUIET_LOAD} cores"
  print("\n" + "\n".join(lines + ([note] if note else [])), flush=True)
  common.write_results(_OUTPUT.value, {"runs": results, "summary": summaries, "traces": traces,
                                       "lines": lines},
                       sys.argv, load_before=load_before, others_cores_before=others_before,
                       busy=bool(note), note=note, steps=_STEPS.value, warmup=_WARMUP.value,
                       pairs=_PAIRS.value)
  if _PLOT.value and summaries:
    _plot(summaries, variants, _PLOT.value)


if __name__ == "__main__":
  app.run(main)
