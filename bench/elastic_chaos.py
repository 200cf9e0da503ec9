"""Chaos soak of an elastic job: workers killed, frozen and relaunched at random, for minutes.

One elastic job per --modes entry and --seeds seed (bench/work_queue_task.py: examples.train
through a work queue, --epochsync_elastic): 1 ps, the chief and --workers workers, --epochs
epochs of --total_batches batches in units of --unit_batches. Every --fault_every_secs on
average (exponential gaps, drawn from the seed) one running worker other than the chief gets a
fault: SIGKILL (a --kill_share of them), else SIGSTOP until the chief names it lost (or, for a
process the chief does not watch yet, one waiting to rejoin, until the stall's detection time
and 10 s more), then SIGCONT (a woken member finds itself fenced and exits). A worker whose
process ended with a non-zero status is started again at its address after U(0,
--max_relaunch_secs) s, as Kubernetes' OnFailure restart does. So the job loses and regains
workers, one fault on top of another, until its last epoch starts; no fault comes after that.

The entry of a job passes when the chief and every worker's last process exit 0 (a worker
whose fault came near the end may instead end killed, frozen or fenced before its relaunch was
due: on a TFJob the chief's exit ends the job), every epoch's audit has every unit once with
all its batches, and (asynchronous) the global step is the epochs' batches less at most one
per kill. It records the faults, the chief's lost-worker WARNINGs, every ERROR line, the wall
time and the load average; each entry is written to --output as soon as its job ended.

Typical usage (opt-in; a few minutes per job):
  python -m bench.elastic_chaos --modes=async,sync --seeds=0,1 --output=bench/results/chaos.json
  ./es bench --only=elastic_chaos
"""

import json
import os
import random
import re
import signal
import sys
import tempfile
import time
from typing import Dict, List, Optional

from absl import app
from absl import flags
import tensorflow as tf

from hooks.epoch.audit import read_audit
from hooks.testing.local_cluster import LocalCluster

_MODES = flags.DEFINE_list("modes", ["async", "sync"], "Jobs to run: async, sync.")
_SEEDS = flags.DEFINE_list("seeds", ["0"], "One job per seed and mode.")
_WORKERS = flags.DEFINE_integer("workers", 3, "Workers beside the chief.", lower_bound=2)
_EPOCHS = flags.DEFINE_integer("epochs", 12, "Epochs per job.", lower_bound=2)
_TOTAL = flags.DEFINE_integer("total_batches", 360, "Batches per epoch.", lower_bound=1)
_UNIT = flags.DEFINE_integer("unit_batches", 12, "Batches per unit.", lower_bound=1)
_SLEEP = flags.DEFINE_float("step_sleep_secs", 0.05, "Pause per step.")
_EVERY = flags.DEFINE_float("fault_every_secs", 4.0, "Mean seconds between two faults.")
_KILL_SHARE = flags.DEFINE_float("kill_share", 0.75, "Share of the faults that are SIGKILLs "
                                 "(the rest freeze the worker).", lower_bound=0, upper_bound=1)
_RELAUNCH = flags.DEFINE_float("max_relaunch_secs", 3.0, "A failed worker is relaunched after "
                               "a uniform delay up to this.", lower_bound=0)
_STEP_TIMEOUT = flags.DEFINE_float("step_timeout_secs", None, "--epochsync_step_timeout_secs "
                                   "(default 6 s asynchronous, 12 s synchronous, as the kill "
                                   "matrix): a frozen worker is lost after it (synchronous: "
                                   "half, and the other workers' steps wait that long).")
_TIMEOUT = flags.DEFINE_float("timeout_secs", 1800.0, "Hard deadline of one job.")
_OUTPUT = flags.DEFINE_string("output", None, "Write the results as JSON here.")

_TASK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "work_queue_task.py")
_CHIEF = "worker:0"
_AFTER_THE_CHIEF_SECS = 30.0  # the workers end within seconds of the chief
_FROZEN_MARGIN_SECS = 10.0  # a frozen worker is woken this long after its stall's detection


def _command(model_dir: str, sync: bool) -> List[str]:
  return [sys.executable, _TASK, f"--model_dir={model_dir}",
          "--unit_batches=" + ",".join([str(_UNIT.value)] * (_TOTAL.value // _UNIT.value)),
          f"--epochsync_num_epochs={_EPOCHS.value}", f"--epochsync_sync={str(sync).lower()}",
          "--epochsync_elastic", "--epochsync_save_checkpoint_secs=0",
          f"--epochsync_step_timeout_secs={_step_timeout(sync)}",
          f"--step_sleep_secs={_SLEEP.value}"]


def _step_timeout(sync: bool) -> float:
  return _STEP_TIMEOUT.value or (12.0 if sync else 6.0)


class _Chaos:
  """The faults of one job, and the restarts a restart policy would do."""

  def __init__(self, cluster: LocalCluster, rng: random.Random, stall_secs: float):
    self._cluster, self._rng, self._stall_secs = cluster, rng, stall_secs
    self._workers = [f"worker:{i}" for i in range(1, _WORKERS.value + 1)]
    self._relaunch_at: Dict[str, float] = {}
    self._frozen: Optional[tuple] = None  # (worker, its lost WARNINGs before, since)
    self._codes: Dict[str, Optional[int]] = {}  # the tasks' exit codes at this round
    self.faults: List[dict] = []
    self.problems: List[str] = []
    self.relaunches = 0
    self.fenced_at_end: List[str] = []  # killed, frozen or fenced; the job ended first

  def _log(self, task: str) -> str:
    path = os.path.join(self._cluster.log_dir, task.replace(":", "-") + ".log")
    return open(path).read() if os.path.exists(path) else ""

  def _lost_count(self, worker: str) -> int:
    return len(re.findall(re.escape(worker) + r" is lost in epoch", self._log(_CHIEF)))

  def _running(self, task: str) -> bool:
    return self._codes[task] is None

  def _poll(self) -> None:
    self._codes = {n: r.returncode for n, r in self._cluster.results().items()}

  def run(self, start: float, deadline: float, last_epoch_started) -> None:
    """Faults until the last epoch starts, restarts until the chief ends."""
    next_fault = start + self._rng.expovariate(1 / _EVERY.value)
    self._poll()
    while self._running(_CHIEF) and time.monotonic() < deadline:
      now = time.monotonic()
      self._thaw(now)
      self._restart(now)
      if now >= next_fault and self._frozen is None and not last_epoch_started():
        self._fault(now - start)
        next_fault = now + self._rng.expovariate(1 / _EVERY.value)
      time.sleep(0.1)
      self._poll()
    frozen_at_end = self._frozen[0] if self._frozen else None
    if frozen_at_end:  # the job ended first: wake it all the same
      self._cluster.kill_task(frozen_at_end, signal.SIGCONT)
    self._after_the_chief(deadline, frozen_at_end)

  def _after_the_chief(self, deadline: float, frozen_at_end: Optional[str]) -> None:
    """The chief ended: the workers end within seconds, and none is relaunched (on a TFJob the
    chief's exit ends the job). One still running after _AFTER_THE_CHIEF_SECS is stopped (a
    problem unless it was relaunched as the chief ended and waits for it); one whose last
    process was killed, frozen or fenced when the job ended goes into `fenced_at_end`."""
    ends_by = min(deadline, time.monotonic() + _AFTER_THE_CHIEF_SECS)
    while time.monotonic() < ends_by:
      self._poll()
      if all(self._codes[w] is not None for w in self._workers):
        break
      time.sleep(0.1)
    for worker in self._workers:  # one relaunched as the job ended waits for its chief: stop it
      if self._codes[worker] is None:
        waiting = "waiting at the start of the run for " + _CHIEF in self._log(worker)
        if not waiting:
          self.problems.append(f"{worker} still runs {_AFTER_THE_CHIEF_SECS:.0f} s after the "
                               "chief ended")
        self._cluster.kill_task(worker)
    self._poll()
    for worker in self._workers:
      code = self._codes[worker]
      if code == -signal.SIGKILL or worker == frozen_at_end or (
          code not in (None, 0) and "WorkerFencedError" in self._log(worker)):
        self.fenced_at_end.append(worker)  # killed, frozen or fenced: its relaunch not due

  def _fault(self, at: float) -> None:
    up = [w for w in self._workers if self._running(w) and w not in self._relaunch_at]
    if not up:
      return
    victim = self._rng.choice(up)
    kind = "kill" if self._rng.random() < _KILL_SHARE.value else "freeze"
    self.faults.append({"at_secs": round(at, 2), "worker": victim, "fault": kind})
    if kind == "kill":
      self._cluster.kill_task(victim)
    else:
      self._frozen = (victim, self._lost_count(victim), time.monotonic())
      self._cluster.kill_task(victim, signal.SIGSTOP)

  def _thaw(self, now: float) -> None:
    """Wakes the frozen worker once the chief named it lost, or (a process the chief does not
    watch: one waiting to rejoin) after the stall's detection time and a margin."""
    if self._frozen is None:
      return
    victim, lost_before, since = self._frozen
    named = self._lost_count(victim) > lost_before
    if named or now - since > self._stall_secs + _FROZEN_MARGIN_SECS:
      self.faults[-1]["named_lost"] = named
      self._cluster.kill_task(victim, signal.SIGCONT)
      self._frozen = None

  def _restart(self, now: float) -> None:
    """A worker whose process failed starts again after its drawn delay."""
    for worker in self._workers:
      code = self._codes[worker]
      if code not in (None, 0) and worker not in self._relaunch_at:
        self._relaunch_at[worker] = now + self._rng.uniform(0, _RELAUNCH.value)
    for worker, at in list(self._relaunch_at.items()):
      if now >= at:
        del self._relaunch_at[worker]
        self._cluster.restart_task(worker)
        self.relaunches += 1


def _audit_problems(model_dir: str, units: int) -> List[str]:
  audit = read_audit(model_dir)
  problems = []
  if [line["epoch"] for line in audit] != list(range(_EPOCHS.value)):
    problems.append(f"audit epochs {[line['epoch'] for line in audit]}")
  for line in audit:
    indices = sorted(u["index"] for u in line["units"])
    if indices != list(range(units)):
      problems.append(f"epoch {line['epoch']}: units {indices}")
    whole = [u for u in line["units"] if u["batches"] != _UNIT.value]
    if whole:
      problems.append(f"epoch {line['epoch']}: units not whole {whole[:3]}")
  return problems


def run_job(mode: str, seed: int) -> dict:
  """One chaos job; its entry."""
  model_dir = tempfile.mkdtemp(prefix=f"epochsync-bench-chaos-{mode}-{seed}-")
  logs = os.path.join(model_dir, "logs")
  rng, units = random.Random(seed), _TOTAL.value // _UNIT.value
  start, load = time.monotonic(), os.getloadavg()[0]
  audit_path = os.path.join(model_dir, "epochsync_epochs.jsonl")
  last_epoch_started = lambda: os.path.exists(audit_path) and sum(
      1 for _ in open(audit_path)) >= _EPOCHS.value - 1
  with LocalCluster(num_workers=_WORKERS.value + 1, timeout_secs=_TIMEOUT.value,
                    fail_fast_secs=None, log_dir=logs) as cluster:
    cluster.start(_command(model_dir, mode == "sync"))
    chaos = _Chaos(cluster, rng, _step_timeout(mode == "sync"))
    chaos.run(start, start + _TIMEOUT.value, last_epoch_started)
    result = cluster.wait()
  codes = {name: r.returncode for name, r in result.tasks.items()
           if name not in chaos.fenced_at_end}
  problems = list(chaos.problems)
  if any(codes.values()):
    problems.append(f"exit codes {codes}")
  problems += _audit_problems(model_dir, units)
  kills = sum(f["fault"] == "kill" for f in chaos.faults)
  step = None
  checkpoint = tf.train.latest_checkpoint(model_dir)
  if checkpoint:
    step = int(tf.train.load_variable(checkpoint, "global_step"))
    total = _EPOCHS.value * units * _UNIT.value
    if mode == "async" and not total - kills <= step <= total:
      problems.append(f"global step {step}, epochs' batches {total}, kills {kills}")
  chief_log = open(os.path.join(logs, "worker-0.log")).read()
  errors = [line[:300] for name in sorted(os.listdir(logs))
            for line in open(os.path.join(logs, name)).read().splitlines()
            if re.match(r"^[EF]\d{4} ", line)]
  entry = {"mode": mode, "seed": seed, "passed": not problems, "problems": problems,
           "wall_secs": round(time.monotonic() - start, 1), "faults": chaos.faults,
           "kills": kills, "freezes": len(chaos.faults) - kills, "relaunches": chaos.relaunches,
           "fenced_at_end": chaos.fenced_at_end,
           "lost_warnings": len(re.findall(r" is lost in epoch", chief_log)),
           "global_step": step, "error_lines": errors[:20], "error_line_count": len(errors),
           "load_at_start": round(load, 2), "load_at_end": round(os.getloadavg()[0], 2),
           "logs": logs}
  print(json.dumps({k: v for k, v in entry.items() if k not in ("faults", "error_lines")}),
        flush=True)
  return entry


def main(argv):
  del argv
  entries = []
  for seed in _SEEDS.value:
    for mode in _MODES.value:
      entries.append(run_job(mode, int(seed)))
      if _OUTPUT.value:
        with open(_OUTPUT.value, "w") as f:
          json.dump({"jobs": entries, "command": " ".join(sys.argv)}, f, indent=1)
  failed = [(e["mode"], e["seed"]) for e in entries if not e["passed"]]
  print(f"{len(entries) - len(failed)} of {len(entries)} chaos jobs passed; failed: {failed}")
  return 1 if failed else 0


if __name__ == "__main__":
  app.run(main)
