"""Epochs on uneven shards: tf-epochsync's epoch wall time vs the ideal, and stock's workaround.

4 workers, shards skewed by 0%, 30% and 60% with the same total (shard i has
mean * (1 + skew * (2i/3 - 1)) batches: 40/40/40/40, 28/36/44/52, 16/32/48/64). Per repetition
one tf-epochsync cluster trains one epoch of each skew, in turn (bench.uneven_task), and then
the stock workaround runs once per skew (its own cluster: every shard repeated forever, stock
SyncReplicasOptimizer, max_steps = the mean shard's batches, i.e. one epoch of steps).

  ours:  epoch wall = from the previous barrier's release to this epoch's end barrier's release
         (the chief's); ideal = the largest shard's batches x the median synchronous step of
         that epoch (the largest-shard worker's steps, same run); the ratio wall / ideal.
         Also the phased ideal: the same worker's steps grouped by how many workers still had
         a batch (4, then 3, ...), each group's batches x its own median step. On a machine
         with fewer cores than workers a step with 4 workers computing costs more than one
         with 1, which the single median averages away; the phased ideal does not.
  stock: its wall time for the same number of examples, and how many examples of the epoch's
         data it trained 0, 1 and 2+ times (and how many batches the chief's take dropped).

Typical usage:
  python -m bench.uneven                               # 5 repetitions
  python -m bench.uneven --repetitions=2 --mean_batches=20
"""

import statistics
import sys
from typing import Dict, List

from absl import app
from absl import flags

from bench import common
from bench.common import shard_batches

_REPETITIONS = flags.DEFINE_integer("repetitions", 5, "Repetitions.", lower_bound=1)
_SKEWS = flags.DEFINE_list("skews", ["0", "0.3", "0.6"], "Skews of the shard sizes.")
_MEAN = flags.DEFINE_integer("mean_batches", 40, "Batches of the mean shard.")
_SIZE = flags.DEFINE_string("size", "1M", "MLP size preset (bench.common.MLP_SIZES).")
_WORKERS = flags.DEFINE_integer("workers", 4, "Workers.")
_WARMUP = flags.DEFINE_integer("warmup_epochs", 1, "Leading epochs (skew 0) left out.")
_AUTOTUNE = flags.DEFINE_bool("dataset_autotune", True, "tf.data autotune in the pipelines.")
_OUTPUT = flags.DEFINE_string("output", None, "Write all results as JSON here.")
_PLOT = flags.DEFINE_string("plot", None, "Write a PNG here.")


def _ours(rows: Dict[str, dict], skews: List[float]) -> List[dict]:
  """Per measured epoch: its skew, wall time, ideal, ratio and where the rest went."""
  chief = rows["worker:0"]
  marks = [chief["started"]] + chief["released"]
  out = []
  for epoch, (start, end) in enumerate(zip(marks, marks[1:])):
    if epoch < _WARMUP.value:
      continue
    skew = skews[epoch % len(skews)]
    sizes = shard_batches(skew, len(rows), _MEAN.value)
    largest = max(range(len(rows)), key=lambda i: sizes[i])
    spans = [(a, b) for a, b in rows[f"worker:{largest}"]["steps"] if start <= a and b <= end]
    steps = [b - a for a, b in spans]
    worker = rows[f"worker:{largest}"]
    own_release = ([worker["started"]] + worker["released"])[epoch]
    history = {r["task"]: r["history"][epoch] for r in rows.values()}
    if any(h[1] != sizes[r["worker_id"]] for r, h in
           ((rows[t], history[t]) for t in rows)):
      raise RuntimeError(f"epoch {epoch}: batches {history} differ from the shards {sizes}")
    ideal = max(sizes) * statistics.median(steps)
    phased_ideal = _phased_ideal(steps, sizes)
    out.append({"epoch": epoch, "skew": skew, "shards": sizes, "wall_secs": end - start,
                "ideal_secs": ideal, "ratio": (end - start) / ideal,
                "phased_ideal_secs": phased_ideal, "phased_ratio": (end - start) / phased_ideal,
                "step_ms": statistics.median(steps) * 1e3, "steps": len(steps),
                # wall = start_secs + sum of the steps + gaps between steps + end_secs
                "start_secs": spans[0][0] - start, "steps_sum_secs": sum(steps),
                # start = the release reaching that worker + its epoch start (one run)
                "release_secs": own_release - start, "epoch_start_secs": spans[0][0] - own_release,
                "between_steps_secs": spans[-1][1] - spans[0][0] - sum(steps),
                "end_secs": end - spans[-1][1]})
  return out


def _phased_ideal(steps: List[float], sizes: List[int]) -> float:
  """Sum over the phases of an epoch (k workers still have a batch) of its steps x their median.

  `steps` are the largest shard's worker's step times in order; its step i ran while the
  workers whose shard has more than i batches were still training.
  """
  phases: Dict[int, List[float]] = {}
  for i, step in enumerate(steps):
    phases.setdefault(sum(size > i for size in sizes), []).append(step)
  return sum(len(p) * statistics.median(p) for p in phases.values())


def _stock(rows: Dict[str, dict], skew: float) -> dict:
  """Wall time and how often each example of one epoch's data was trained."""
  n = len(rows)
  sizes = shard_batches(skew, n, _MEAN.value)
  chief = rows["worker:0"]
  counts = {"0": 0, "1": 0, "2+": 0}
  batches = 0
  for r in rows.values():
    size, done = sizes[r["worker_id"]], r["batches_trained"]
    batches += done
    for position in range(size):  # batch `position` of the shard came around this often
      times = done // size + (1 if position < done % size else 0)
      counts["0" if times == 0 else "1" if times == 1 else "2+"] += r["batch_size"]
  return {"skew": skew, "shards": sizes, "wall_secs": chief["ended"] - chief["started"],
          "global_step": chief["global_step"], "batches_computed": batches,
          "gradients_dropped": batches - n * chief["global_step"],
          "examples_trained": counts, "examples": sum(counts.values())}


def _plot(summary: List[dict], path: str) -> None:
  plt = common.plt()
  fig, ax = plt.subplots(figsize=(6, 4))
  skews = [s["skew"] * 100 for s in summary]
  ax.errorbar(skews, [s["ratio_median"] for s in summary],
              yerr=[[s["ratio_median"] - s["ratio_min"] for s in summary],
                    [s["ratio_max"] - s["ratio_median"] for s in summary]],
              marker="o", capsize=4, label="tf-epochsync: epoch wall / ideal")
  ax.errorbar(skews, [s["phased_ratio_median"] for s in summary],
              yerr=[[s["phased_ratio_median"] - s["phased_ratio_min"] for s in summary],
                    [s["phased_ratio_max"] - s["phased_ratio_median"] for s in summary]],
              marker="s", capsize=4, label="tf-epochsync: epoch wall / phased ideal")
  ax.axhline(1.05, color="red", linestyle=":", label="goal 1.05")
  ax.axhline(1.0, color="gray", linewidth=0.8)
  ax.set_xlabel("shard skew (%)")
  ax.set_ylabel("epoch wall time / (largest shard x sync step)")
  ax.set_xticks(skews)
  ax.legend()
  common.save_plot(fig, path)


def main(argv):
  del argv
  skews = [float(s) for s in _SKEWS.value]
  common_args = [f"--mean_batches={_MEAN.value}", f"--size={_SIZE.value}",
                 f"--dataset_autotune={_AUTOTUNE.value}", "--epochsync_log_every_secs=30"]
  ours, stock, loads = [], [], [common.load_average()]
  for rep in range(_REPETITIONS.value):
    order = skews[rep % len(skews):] + skews[:rep % len(skews)]  # rotate which skew goes first
    epochs = [0.0] * _WARMUP.value + order
    rows = common.run_tasks(["-m", "bench.uneven_task", "--variant=ours",
                             "--skews=" + ",".join(map(str, epochs)), f"--epochs={len(epochs)}"]
                            + common_args, _WORKERS.value, prefix="epochsync-bench-uneven-")
    for e in _ours(rows, epochs):
      e["repetition"] = rep
      ours.append(e)
      print(f"rep={rep} ours  skew={e['skew']:.0%} shards={e['shards']}: epoch "
            f"{e['wall_secs']:.2f} s, ideal {e['ideal_secs']:.2f} s ({e['steps']} steps of "
            f"{e['step_ms']:.1f} ms): {e['ratio']:.3f}; phased ideal {e['phased_ideal_secs']:.2f} s: "
            f"{e['phased_ratio']:.3f}; start {e['start_secs']:.3f} s (release "
            f"{e['release_secs'] * 1e3:.0f} ms + epoch start {e['epoch_start_secs'] * 1e3:.0f} ms), steps "
            f"{e['steps_sum_secs']:.3f} s, between {e['between_steps_secs']:.3f} s, end "
            f"{e['end_secs']:.3f} s", flush=True)
    for skew in order:
      rows = common.run_tasks(["-m", "bench.uneven_task", "--variant=stock", f"--skews={skew}",
                               "--epochs=1"] + common_args, _WORKERS.value,
                              prefix="epochsync-bench-uneven-")
      s = _stock(rows, skew)
      s["repetition"] = rep
      stock.append(s)
      print(f"rep={rep} stock skew={skew:.0%}: {s['wall_secs']:.2f} s, examples trained "
            f"0/1/2+ times: {s['examples_trained']}, {s['gradients_dropped']} gradients "
            "dropped", flush=True)
    loads.append(common.load_average())
  summary = []
  print("\nskew  shards            epoch/ideal: median (min..max)  epoch/phased ideal  "
        "ours epoch s  stock epoch s  stock examples trained 0 / 1 / 2+ times (median)")
  for skew in skews:
    r = [e["ratio"] for e in ours if e["skew"] == skew]
    phased = [e["phased_ratio"] for e in ours if e["skew"] == skew]
    walls = [e["wall_secs"] for e in ours if e["skew"] == skew]
    st = [s for s in stock if s["skew"] == skew]
    row = {"skew": skew, "shards": shard_batches(skew, _WORKERS.value, _MEAN.value),
           "ratio_median": statistics.median(r), "ratio_min": min(r), "ratio_max": max(r),
           "phased_ratio_median": statistics.median(phased), "phased_ratio_min": min(phased),
           "phased_ratio_max": max(phased),
           "ours_wall_secs": statistics.median(walls),
           "stock_wall_secs": statistics.median(s["wall_secs"] for s in st),
           "stock_examples_trained": {k: statistics.median(s["examples_trained"][k] for s in st)
                                      for k in ("0", "1", "2+")},
           "stock_gradients_dropped": statistics.median(s["gradients_dropped"] for s in st)}
    summary.append(row)
    t = row["stock_examples_trained"]
    print(f"{skew:4.0%}  {str(row['shards']):<16}  {row['ratio_median']:.3f} "
          f"({row['ratio_min']:.3f}..{row['ratio_max']:.3f})            "
          f"{row['phased_ratio_median']:.3f} ({row['phased_ratio_min']:.3f}.."
          f"{row['phased_ratio_max']:.3f})  "
          f"{row['ours_wall_secs']:6.2f}  {row['stock_wall_secs']:13.2f}  "
          f"{t['0']:.0f} / {t['1']:.0f} / {t['2+']:.0f}")
  print(f"\nload average (1, 5, 15 min) at the start and after each repetition: {loads}")
  common.write_results(_OUTPUT.value, {"ours": ours, "stock": stock, "summary": summary},
                       sys.argv, load_average=loads, mean_batches=_MEAN.value,
                       workers=_WORKERS.value)
  if _PLOT.value:
    _plot(summary, _PLOT.value)


if __name__ == "__main__":
  app.run(main)
