"""Soak: a synchronous and an asynchronous job of N global steps each, with mid-epoch saves.

Each job is examples.train (the drop-in MonitoredTrainingSession, the linear model) on a
LocalCluster of --workers workers and --ps ps tasks, --epochs epochs, a mid-epoch checkpoint
every --save_steps global steps. While it runs, every task's RSS is sampled every
--sample_secs; the workers' progress lines give their examples/s over time. The result, one
entry per job and repetition: whether it passed (the failed tasks and the last lines of their
logs if not), its wall time, the RSS of every task over time (first, last, max, growth) and
the step-time drift (the workers' examples/s in the first vs the last tenth of the run), the
runs TensorFlow rejected as duplicates and ran again (hooks.faults.step_retry's WARNINGs), the
runs TensorFlow lost and ran again (hooks.faults.stuck_step, the aggregation loop), and
the audit's check: every epoch once, every worker's whole shard. With --relaunches=N a job
that failed is started again from its model_dir, as an orchestrator's restart policy would, up
to N times; the entry records each attempt's failure. Each entry is written to --output as
soon as its job ended.

Typical usage (opt-in; the default is 100,000 steps per job, ~20-40 minutes each):
  python -m bench.soak --steps=100000 --repetitions=1 --output=bench/results/soak.json
  ./es bench --only=soak
"""

import json
import os
import re
import sys
import threading
import time
from typing import Dict, List

from absl import app
from absl import flags

from hooks.epoch.audit import read_audit
from hooks.testing.local_cluster import LocalCluster

_STEPS = flags.DEFINE_integer("steps", 100_000, "Global steps per job.", lower_bound=1)
_REPETITIONS = flags.DEFINE_integer("repetitions", 1, "Runs of each job.", lower_bound=1)
_MODES = flags.DEFINE_list("modes", ["sync", "async"], "Jobs to run: sync, async.")
_WORKERS = flags.DEFINE_integer("workers", 2, "Training tasks.", lower_bound=1)
_PS = flags.DEFINE_integer("ps", 1, "Parameter-server tasks.", lower_bound=1)
_EPOCHS = flags.DEFINE_integer("epochs", 3, "Epochs per job.", lower_bound=1)
_SAVE_STEPS = flags.DEFINE_integer("save_steps", 500, "Mid-epoch checkpoint period in global "
                                   "steps.", lower_bound=1)
_SAMPLE_SECS = flags.DEFINE_float("sample_secs", 5.0, "RSS sampling period.")
_TIMEOUT = flags.DEFINE_float("timeout_secs", 7200.0, "Hard deadline of one job.")
_OUTPUT = flags.DEFINE_string("output", None, "Write the result as JSON here.")
_RELAUNCHES = flags.DEFINE_integer("relaunches", 0, "Restarts of a failed job from its "
                                   "model_dir (a restart policy).", lower_bound=0)

_RETRIED = "as a duplicate RunGraph request"
_LEFT_BEHIND = "the lost run stays blocked"  # a lost step or aggregation run, run again
_SETTLED_SECS = 60.0
_PROGRESS = re.compile(r"progress (\S+) epoch (\d+)(?: done)?: (\d+)/\d+ batches.* "
                       r"([\d.]+) examples/s")


class _RssSampler:
  """Samples VmRSS (MB) of every task's process every `period` seconds, in a thread."""

  def __init__(self, pids: Dict[str, int], period: float):
    self.samples: Dict[str, List[List[float]]] = {name: [] for name in pids}
    self._pids, self._period, self._start = pids, period, time.monotonic()
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._run, daemon=True)
    self._thread.start()

  def _run(self) -> None:
    while not self._stop.wait(self._period):
      for name, pid in self._pids.items():
        rss = _rss_mb(pid)
        if rss is not None:
          self.samples[name].append([round(time.monotonic() - self._start, 1), rss])

  def stop(self) -> Dict[str, dict]:
    self._stop.set()
    self._thread.join()
    summary = {}
    for name, samples in self.samples.items():
      if samples:
        rss = [mb for _, mb in samples]
        # Growth from the first sample after the first minute (start-up allocates, then frees).
        settled = next((mb for t, mb in samples if t >= _SETTLED_SECS), rss[0])
        summary[name] = {"first_mb": rss[0], "settled_mb": settled, "last_mb": rss[-1],
                         "max_mb": max(rss), "growth_mb": round(rss[-1] - settled, 1),
                         "samples": samples}
    return summary


def _rss_mb(pid: int):
  try:
    with open(f"/proc/{pid}/status") as f:
      for line in f:
        if line.startswith("VmRSS:"):
          return round(int(line.split()[1]) / 1024, 1)
  except OSError:
    return None
  return None


def _drift(lines: List[str]) -> dict:
  """The workers' examples/s in the first and the last tenth of their progress lines."""
  rates = [float(m.group(4)) for m in map(_PROGRESS.search, lines) if m]
  if len(rates) < 10:
    return {"progress_lines": len(rates)}
  tenth = max(1, len(rates) // 10)
  first, last = sum(rates[:tenth]) / tenth, sum(rates[-tenth:]) / tenth
  return {"progress_lines": len(rates), "first_examples_per_sec": round(first, 1),
          "last_examples_per_sec": round(last, 1), "drift": round(last / first - 1, 3)}


def _audit_problems(model_dir: str, per_worker: int) -> List[str]:
  """What the chief's audit gets wrong: an epoch missing or twice, a shard not trained whole."""
  audit = read_audit(model_dir)
  problems = []
  if [line["epoch"] for line in audit] != list(range(_EPOCHS.value)):
    problems.append(f"audit epochs {[line['epoch'] for line in audit]}")
  for line in audit:
    batches = {w: s["batches"] for w, s in line["workers"].items()}
    if set(batches.values()) != {per_worker} or len(batches) != _WORKERS.value:
      problems.append(f"epoch {line['epoch']}: batches {batches}, expected {per_worker} each")
  return problems


def run_job(mode: str, model_dir: str) -> dict:
  """One job of `mode` (relaunched after a failure, up to --relaunches times)."""
  attempts = []
  for _ in range(_RELAUNCHES.value + 1):
    attempts.append(_run_once(mode, model_dir))
    if attempts[-1]["ok"]:
      break
  run = dict(attempts[-1], relaunches=len(attempts) - 1,
             secs=round(sum(a["secs"] for a in attempts), 1),
             retried_runs=sum(a["retried_runs"] for a in attempts),
             lost_runs=sum(a["lost_runs"] for a in attempts),
             failed_attempts=[a["failures"] for a in attempts[:-1]],
             earlier_attempts=attempts[:-1])  # their RSS and step times too
  per_worker = _per_worker(mode)
  run["audit_problems"] = _audit_problems(model_dir, per_worker) if run["ok"] else None
  run["ok"] = run["ok"] and not run["audit_problems"]
  return run


def _per_worker(mode: str) -> int:
  per_worker = _STEPS.value // _EPOCHS.value
  if mode == "async":  # each worker's batch is one global step
    per_worker //= _WORKERS.value
  return max(1, per_worker)


def _run_once(mode: str, model_dir: str) -> dict:
  """One launch of the job of `mode`; returns its result entry."""
  shard = ",".join([str(_per_worker(mode))] * _WORKERS.value)
  command = [sys.executable, "-m", "examples.train", f"--model_dir={model_dir}",
             f"--shard_batches={shard}", f"--epochsync_num_epochs={_EPOCHS.value}",
             f"--epochsync_sync={mode == 'sync'}", "--epochsync_save_checkpoint_secs=0",
             f"--epochsync_save_checkpoint_steps={_SAVE_STEPS.value}",
             "--epochsync_progress_secs=10"]
  lines: List[str] = []
  start, load = time.monotonic(), os.getloadavg()[0]
  with LocalCluster(num_workers=_WORKERS.value, num_ps=_PS.value,
                    timeout_secs=_TIMEOUT.value,
                    on_line=lambda task, line: lines.append(line)) as cluster:
    cluster.start(command)
    sampler = _RssSampler(cluster.pids, _SAMPLE_SECS.value)
    result = cluster.wait()
    rss = sampler.stop()
  failures = {t.name: ("killed at the deadline" if t.timed_out else t.tail(8))
              for t in result.failed}
  return {"mode": mode, "ok": not failures, "failures": failures,
          "global_steps": _STEPS.value, "secs": round(time.monotonic() - start, 1),
          "load_at_start": round(load, 2), "load_at_end": round(os.getloadavg()[0], 2),
          "rss": rss, "step_time": _drift(lines), "logs": cluster.log_dir,
          "retried_runs": sum(_RETRIED in line for line in lines),
          "lost_runs": sum(_LEFT_BEHIND in line for line in lines)}


def main(argv):
  del argv
  runs = []
  for rep in range(_REPETITIONS.value):
    for mode in _MODES.value:
      model_dir = os.path.join(os.environ.get("TMPDIR", "/tmp"),
                               f"soak-{os.getpid()}-{mode}-{rep}")
      run = run_job(mode, model_dir)
      runs.append(run)
      _write(runs)
      growth = {n: r["growth_mb"] for n, r in run["rss"].items()}
      print(f"{mode} #{rep}: {'passed' if run['ok'] else 'FAILED ' + ', '.join(run['failures'])}"
            f" in {run['secs']} s, RSS growth MB {growth}, step time {run['step_time']}, "
            f"load {run['load_at_start']}-{run['load_at_end']}, {run['retried_runs']} rejected "
            f"runs retried, {run['lost_runs']} lost runs run again, {run['relaunches']} relaunches {run['failed_attempts']}, audit "
            f"{'not checked' if run['audit_problems'] is None else run['audit_problems'] or 'exact'}",
            flush=True)
  passed = _write(runs)
  print(f"{passed} of {len(runs)} runs passed", flush=True)
  if passed < len(runs):
    sys.exit(1)


def _write(runs: List[dict]) -> int:
  """Writes the runs so far to --output; returns how many passed."""
  summary = {"steps": _STEPS.value, "workers": _WORKERS.value, "ps": _PS.value,
             "save_steps": _SAVE_STEPS.value, "relaunches": _RELAUNCHES.value,
             "passed": sum(r["ok"] for r in runs), "runs": runs}
  if _OUTPUT.value:
    with open(_OUTPUT.value, "w") as f:
      json.dump(summary, f, indent=1)
  return summary["passed"]


if __name__ == "__main__":
  app.run(main)
