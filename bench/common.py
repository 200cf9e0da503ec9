"""What every benchmark in bench/ shares: cluster runs, ABAB order, statistics, JSON, plots.

Typical usage:
  rows = run_tasks(["-m", "bench.sync_task", "--variant=ours"], num_workers=2)
  stats = summary([r["median"] for r in runs])       # {"median":, "min":, "max":, "n":}
  write_results("bench/results/step_overhead.json", results, argv=sys.argv)
"""

import datetime
import glob
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from hooks.epoch.audit import read_audit
from hooks.testing.local_cluster import LocalCluster

__all__ = ["run_tasks", "CpuSampler", "MLP_SIZES", "shard_batches", "generated_batches",
           "summary", "paired", "load_average", "write_results", "plt", "save_plot",
           "RESULTS_DIR"]

RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
# MLP size preset -> (width, hidden): 2 * width * hidden + width + hidden parameters.
MLP_SIZES = {"0.1M": (128, 384), "1M": (512, 1024), "10M": (1024, 4864)}


def generated_batches(num_batches, batch_size: int, width: int, seed: int, autotune: bool = True):
  """A tf.data pipeline of `num_batches` (an int or int64 tensor) batches (x, x) of normal noise.

  Generated per batch from (seed, batch index), like a pipeline that reads files: no arrays
  embedded in the graph, so re-initialising it each epoch costs what tf.data itself costs
  (with autotune on, stopping the previous iterator's autotuning thread: ~5..300 ms here).
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top; bench tasks only

  def batch(i):
    x = tf.random.stateless_normal([batch_size, width], tf.stack([tf.cast(seed, tf.int64), i]))
    return x, x

  dataset = tf.data.Dataset.range(tf.cast(num_batches, tf.int64)).map(batch)
  if not autotune:
    options = tf.data.Options()
    options.autotune.enabled = False
    dataset = dataset.with_options(options)
  return dataset


def shard_batches(skew: float, num_workers: int, mean: int) -> List[int]:
  """Batches of each shard: mean * (1 + skew * (2i / (N-1) - 1)); the largest is (1+skew) x mean.

  The total is N * mean (rounding aside): skew 0.6 with mean 40 gives 16, 32, 48, 64.
  """
  if num_workers == 1:
    return [mean]
  return [int(round(mean * (1 + skew * (2 * i / (num_workers - 1) - 1))))
          for i in range(num_workers)]


class CpuSampler:
  """Samples the CPU seconds (user + system, all threads) of some processes every `period`.

    sampler = CpuSampler(cluster.pids); ...; sampler.stop()
    secs = sampler.cpu_between("ps:0", t0, t1)       # t0, t1: time.time() values
  """

  def __init__(self, pids: Mapping[str, int], period_secs: float = 0.05):
    self._pids, self._period = dict(pids), period_secs
    self.names = sorted(self._pids)
    self._ticks = os.sysconf("SC_CLK_TCK")
    self.samples: List[Tuple[float, Dict[str, float]]] = []
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._loop, daemon=True, name="cpu-sampler")
    self._thread.start()

  def _read(self) -> Dict[str, float]:
    out = {}
    for name, pid in self._pids.items():
      try:
        with open(f"/proc/{pid}/stat") as f:
          fields = f.read().rsplit(")", 1)[1].split()
        out[name] = (int(fields[11]) + int(fields[12])) / self._ticks  # utime + stime
      except (OSError, IndexError, ValueError):
        pass  # The process has ended: its last sample stands.
    return out

  def _loop(self) -> None:
    while not self._stop.wait(self._period):
      self.samples.append((time.time(), self._read()))

  def stop(self) -> None:
    self._stop.set()
    self._thread.join(timeout=5)

  def cpu_between(self, name: str, start: float, end: float) -> float:
    """CPU seconds `name` used between two time.time() values (linear between samples)."""
    points = [(t, v[name]) for t, v in self.samples if name in v]
    return _interpolate(points, end) - _interpolate(points, start)


def _interpolate(points: Sequence[Tuple[float, float]], t: float) -> float:
  for (t0, v0), (t1, v1) in zip(points, points[1:]):
    if t0 <= t <= t1:
      return v0 if t1 == t0 else v0 + (v1 - v0) * (t - t0) / (t1 - t0)
  if not points:
    raise ValueError(f"no CPU samples around {t}")
  return points[0][1] if t < points[0][0] else points[-1][1]  # Not started yet, or ended.


def run_tasks(module_args: Sequence[str], num_workers: int, num_ps: int = 1,
              timeout_secs: float = 300.0, has_chief: bool = False,
              per_task_args=None, prefix: str = "epochsync-bench-",
              sample_cpu: bool = False) -> Dict[str, dict]:
  """Runs `python <module_args> --output_dir=D` on every training task of a LocalCluster.

  Returns every task's <D>/<task>.json by task name; raises ClusterLaunchError (with the
  failed task's log) if any task failed. With `sample_cpu`, rows["cpu"] is the CpuSampler of
  every process of the cluster (ps tasks included).
  """
  out = tempfile.mkdtemp(prefix=prefix)
  command = [sys.executable, *module_args, f"--output_dir={out}"]
  sampler = None
  with LocalCluster(num_workers=num_workers, num_ps=num_ps, timeout_secs=timeout_secs,
                    has_chief=has_chief, log_dir=os.path.join(out, "logs")) as cluster:
    cluster.start(command, per_task_args)
    sampler = CpuSampler(cluster.pids) if sample_cpu else None
    try:
      cluster.wait().check()
    finally:
      if sampler:
        sampler.stop()
  rows = {}
  for path in glob.glob(os.path.join(out, "*.json")):
    with open(path) as f:
      row = json.load(f)
    rows[row["task"]] = row
  if sampler:
    rows["cpu"] = sampler
  return rows


def audited_job(module_args: Sequence[str], num_workers: int, per_task_args=None,
                timeout_secs: float = 300.0, prefix: str = "epochsync-bench-") -> List[dict]:
  """Runs `python <module_args> --model_dir=D` on every training task of a LocalCluster (D a
  fresh directory); returns the chief's audit lines of D. Raises ClusterLaunchError (with the
  failed task's log) if any task failed."""
  model_dir = tempfile.mkdtemp(prefix=prefix)
  command = [sys.executable, *module_args, f"--model_dir={model_dir}"]
  with LocalCluster(num_workers=num_workers, timeout_secs=timeout_secs,
                    log_dir=os.path.join(model_dir, "logs")) as cluster:
    cluster.start(command, per_task_args)
    cluster.wait().check()
  return read_audit(model_dir)


def summary(values: Iterable[float]) -> Dict[str, float]:
  """Median, min, max and count of `values`."""
  values = sorted(values)
  return {"median": statistics.median(values), "min": values[0], "max": values[-1],
          "n": len(values)}


def paired(a: Sequence[float], b: Sequence[float]) -> List[float]:
  """Ratios a[i] / b[i] of the runs of one repetition, sorted."""
  return sorted(x / y for x, y in zip(a, b))


def load_average() -> List[float]:
  """The 1, 5 and 15 minute load averages (a 2-core machine is busy above 2)."""
  return [round(x, 2) for x in os.getloadavg()]


def write_results(path: Optional[str], results: Any, argv: Sequence[str], **meta) -> None:
  """Writes {"meta": {...}, "results": results} to `path` (None: do nothing)."""
  if not path:
    return
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  payload = {"meta": {"date": datetime.datetime.now().isoformat(timespec="seconds"),
                      "command": " ".join(argv), "cpus": os.cpu_count(),
                      "machine": platform.machine(), "python": platform.python_version(),
                      **meta},
             "results": results}
  with open(path, "w") as f:
    json.dump(payload, f, indent=1)
  print(f"wrote {path}", flush=True)


def plt():
  """matplotlib.pyplot with a file-only backend (`pip install -e .[bench]`)."""
  try:
    import matplotlib  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ImportError("the plots need matplotlib: ./es bench installs it, or "
                      "pip install -e '.[bench]'") from e
  matplotlib.use("Agg")
  import matplotlib.pyplot as pyplot  # pylint: disable=g-import-not-at-top
  return pyplot


def save_plot(fig, path: str) -> None:
  """Lays `fig` out, writes it to `path` as a PNG and says so."""
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  print(f"wrote {path}", flush=True)
