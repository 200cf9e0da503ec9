"""What one worker's death costs a job: elastic against stop-and-relaunch, side by side.

4 workers, 1 ps, examples.train's linear model, asynchronous (--sync: synchronous) through a
work queue of --total_batches batches per epoch in units of --unit_batches, --epochs epochs;
every step pauses --step_sleep_secs. Per repetition, three jobs from a fresh model_dir each
(with --sync four: also `plain`), wall time from the launch to every task's exit:

  plain           (--sync only) not elastic, nothing happens: uninterrupted / plain is what
                  elastic synchronous steps cost;
  uninterrupted   --epochsync_elastic, nothing happens;
  elastic         --epochsync_elastic; worker:2 is SIGKILLed --kill_after_secs into a unit of
                  epoch 1 and relaunched at once (as Kubernetes' OnFailure does): it rejoins;
  stop_relaunch   today's default (not elastic), the same kill: every task ends (the liveness
                  monitor names the dead worker), and the whole job is relaunched from its
                  newest checkpoint (mid-epoch checkpoints every --save_checkpoint_secs).

loss = wall - uninterrupted's wall. The elastic loss is the detection (the chief's WARNING after
the kill, from its log), the lost worker's share of the epoch done by the others, and the
rejoin. Every task, the relaunched one too, is forked from a process that imported TensorFlow
once (hooks.testing.fork_server), as a relaunched pod pays its import on its own node's CPU,
not on the survivors'; EPOCHSYNC_TEST_FORK_SERVER=0 has each task import it on these cores.
Two jobs' start-ups differ by a second or more from run to run, as much as the loss itself;
so each job's training span is timed too, from epoch 0's end to the last epoch's end (the
audit's releases: the kill is in epoch 1), and span_loss = span - uninterrupted's span: the
same loss without the start-up's noise. Its bound is the detection plus one unit's time
(unit_secs: a unit's batches at the uninterrupted job's pace per worker). Stop-and-relaunch
loses every task's work since the newest checkpoint plus a whole job's restart. With a save
period P, that work is P/2 on average: the JSON gives the measured loss plus P/2 for P = 600 s,
and its ratio to the elastic loss (at least the detection: a loss below it is the runs'
noise).

The span loss is still as noisy as the spans (seconds from job to job on 2 busy cores), so
the lost worker's absence is also timed directly: slot_gap, from the kill to the first unit
its replacement (a spare, or the relaunched process) takes, and gap_loss, the job time that
gap costs (a quarter of it with 4 workers: each worker's pace is its own; synchronous, the
steps also wait for the lost marker until the detection).

With --spare_workers=K the two elastic jobs run K spare workers besides the 4
(--epochsync_spare_workers): a spare stands by, and joins in place of worker:2 when the chief
finds it lost; the relaunched worker:2 then stands by. The JSON gives the seconds from the kill
to the spare's join (spare_joined_secs).

Typical usage:
  python -m bench.elastic_cost --repetitions=3 --output=bench/results/elastic_cost.json
  python -m bench.elastic_cost --sync --repetitions=3 --output=bench/results/elastic_sync.json
  python -m bench.elastic_cost --spare_workers=1 --output=bench/results/elastic_spare.json
"""

import os
import re
import statistics
import sys
import tempfile
import time
from typing import Dict, List, Optional

from absl import app
from absl import flags

from bench import common
from hooks.epoch.audit import read_audit
from hooks.testing.local_cluster import LocalCluster

_REPETITIONS = flags.DEFINE_integer("repetitions", 3, "Repetitions.", lower_bound=1)
_TOTAL = flags.DEFINE_integer("total_batches", 480, "Batches per epoch (all workers).")
_UNIT = flags.DEFINE_integer("unit_batches", 12, "Batches per unit.", lower_bound=1)
_EPOCHS = flags.DEFINE_integer("epochs", 3, "Epochs per job.", lower_bound=2)
_SLEEP = flags.DEFINE_float("step_sleep_secs", 0.05, "Pause per step.")
_KILL_AFTER = flags.DEFINE_float("kill_after_secs", 0.2, "The kill comes this long after the "
                                 "victim took its first unit of epoch 1.")
_SAVE_SECS = flags.DEFINE_float("save_checkpoint_secs", 600.0, "Mid-epoch checkpoint period "
                                "of the stop-and-relaunch job.")
_SYNC = flags.DEFINE_bool("sync", False, "Synchronous training (a sync optimizer).")
_STEP_COST = flags.DEFINE_bool("step_cost_only", False, "With --sync: only `plain` and "
                               "`uninterrupted`, to time elastic synchronous steps (use with "
                               "--step_sleep_secs=0).")
_SPARES = flags.DEFINE_integer("spare_workers", 0, "The elastic jobs (uninterrupted and "
                               "elastic) get this many spare workers besides the 4 "
                               "(--epochsync_spare_workers); stop-and-relaunch has none.",
                               lower_bound=0)
_RELAUNCH = flags.DEFINE_bool("relaunch", True, "The elastic job relaunches the killed worker "
                              "(--norelaunch with --spare_workers: the spare alone takes its "
                              "place, and no start-up of a new process shares the cores).")
_WITH_RESTART = flags.DEFINE_bool("stop_relaunch", True, "Run the stop-and-relaunch job too "
                                  "(--nostop_relaunch: the elastic job against the "
                                  "uninterrupted one only).")
_OUTPUT = flags.DEFINE_string("output", None, "Write the results as JSON here.")

_TASK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "work_queue_task.py")
_WORKERS, _VICTIM = 4, "worker:2"
_PERIOD_SECS = 600.0  # the save period the comparison is stated for
_LOST_AT = re.compile(r"^W\d{4} (\d\d):(\d\d):(\d\d\.\d+) .* is lost in epoch", re.M)
_TOOK = re.compile(r"^I\d{4} (\d\d):(\d\d):(\d\d\.\d+) .* took unit \d+ ", re.M)
_SPARE_JOINED = re.compile(r"^I\d{4} (\d\d):(\d\d):(\d\d\.\d+) .* joined epoch \d+ \(a spare, in "
                           r"place of a lost worker\)", re.M)


def _command(model_dir: str, elastic: bool) -> List[str]:
  return [sys.executable, _TASK, f"--model_dir={model_dir}",
          "--unit_batches=" + ",".join([str(_UNIT.value)] * (_TOTAL.value // _UNIT.value)),
          f"--epochsync_num_epochs={_EPOCHS.value}",
          f"--epochsync_sync={str(_SYNC.value).lower()}",
          f"--epochsync_elastic={str(elastic).lower()}",
          f"--epochsync_spare_workers={_SPARES.value if elastic else 0}",
          f"--epochsync_save_checkpoint_secs={0 if elastic else _SAVE_SECS.value}",
          f"--step_sleep_secs={_SLEEP.value}"]


def _kill_in_epoch_1(cluster: LocalCluster, deadline: float) -> float:
  """SIGKILLs the victim --kill_after_secs into its first unit of epoch 1; the time.time()."""
  took = re.compile(re.escape(_VICTIM) + r" took unit \d+ .* in epoch 1")
  path = os.path.join(cluster.log_dir, _VICTIM.replace(":", "-") + ".log")
  while time.monotonic() < deadline:
    if os.path.exists(path) and took.search(open(path).read()):
      time.sleep(_KILL_AFTER.value)
      cluster.kill_task(_VICTIM)
      return time.time()
    time.sleep(0.02)
  raise RuntimeError(f"{_VICTIM} never took a unit of epoch 1")


def _after(found: "re.Match", killed_at: float) -> float:
  """Seconds from the kill to a log line's time (the logs are in local time, HH:MM:SS.f)."""
  day = time.localtime(killed_at)
  h, m, s = found.groups()
  return time.mktime(day[:3] + (int(h), int(m), 0) + day[6:]) + float(s) - killed_at


def _log(cluster: LocalCluster, task: str) -> str:
  return open(os.path.join(cluster.log_dir, task.replace(":", "-") + ".log")).read()


def _found_after(cluster: LocalCluster, killed_at: float) -> Optional[float]:
  """Seconds from the kill to the chief's WARNING that the victim is lost (elastic)."""
  found = _LOST_AT.search(_log(cluster, "worker:0"))
  return None if found is None else _after(found, killed_at)


def _spare_tasks() -> List[str]:
  """The spares' task names: the tasks after the 4 workers."""
  return [f"worker:{i}" for i in range(_WORKERS, _WORKERS + _SPARES.value)]


def _spare_joined_after(cluster: LocalCluster, killed_at: float) -> Optional[float]:
  """Seconds from the kill to a spare's line that it joined in the victim's place."""
  for task in _spare_tasks():
    found = _SPARE_JOINED.search(_log(cluster, task))
    if found:
      return _after(found, killed_at)
  return None


def _slot_gap(cluster: LocalCluster, killed_at: float) -> Optional[float]:
  """Seconds from the kill to the first unit its replacement (a spare, or the relaunched
  victim) took: the time the lost worker's place trained nothing."""
  gaps = [gap for task in [_VICTIM] + _spare_tasks() for gap in (_after(m, killed_at) for m in
                                              _TOOK.finditer(_log(cluster, task))) if gap > 0]
  return min(gaps, default=None)


def _job(kind: str) -> Dict[str, float]:
  """One job of `kind`; its wall seconds (and the kill's timings)."""
  model_dir = tempfile.mkdtemp(prefix=f"epochsync-bench-elastic-{kind}-")
  start, row = time.monotonic(), {}
  logs = os.path.join(model_dir, "logs")
  spares = _SPARES.value if kind in ("uninterrupted", "elastic") else 0
  with LocalCluster(num_workers=_WORKERS + spares, timeout_secs=600, fail_fast_secs=None,
                    log_dir=logs) as cluster:
    cluster.start(_command(model_dir, kind not in ("stop_relaunch", "plain")))
    if kind not in ("uninterrupted", "plain"):
      killed_at = _kill_in_epoch_1(cluster, time.monotonic() + 300)
      row["kill_at_secs"] = round(time.monotonic() - start, 3)
    if kind == "elastic" and _RELAUNCH.value:
      while cluster.results()[_VICTIM].returncode is None:
        time.sleep(0.02)
      cluster.restart_task(_VICTIM)
    result = cluster.wait()
    if kind == "elastic":
      row["detection_secs"] = round(_found_after(cluster, killed_at), 3)
      gap = _slot_gap(cluster, killed_at)
      row["slot_gap_secs"] = None if gap is None else round(gap, 3)
      if spares:
        joined = _spare_joined_after(cluster, killed_at)
        row["spare_joined_secs"] = None if joined is None else round(joined, 3)
  codes = {n: r.returncode for n, r in result.tasks.items()
           if kind != "elastic" or _RELAUNCH.value or n != _VICTIM}
  if kind != "stop_relaunch":
    if any(codes.values()):
      raise RuntimeError(f"{kind}: exit codes {codes}; logs in {logs}")
  else:  # Every task ended; the whole job is relaunched from the newest checkpoint.
    row["failed_after_secs"] = round(time.monotonic() - start, 3)
    with LocalCluster(num_workers=_WORKERS, timeout_secs=600,
                      log_dir=os.path.join(model_dir, "logs-relaunch")) as cluster:
      cluster.start(_command(model_dir, False))
      cluster.wait().check()
  row["wall_secs"] = round(time.monotonic() - start, 3)
  audit = read_audit(model_dir)
  released = {line["epoch"]: line["released_at"] for line in audit}
  row["span_secs"] = round(released[_EPOCHS.value - 1] - released[0], 3)  # epochs 1..last
  if kind in ("uninterrupted", "plain"):  # A unit's time at this job's pace per worker.
    epoch = audit[1]["released_at"] - audit[0]["released_at"]
    row["unit_secs"] = round(epoch * _WORKERS / _TOTAL.value * _UNIT.value, 3)
    # The steps after epoch 0 (start-up apart): seconds per global step.
    row["step_secs"] = round((audit[-1]["released_at"] - audit[0]["released_at"]) /
                             (audit[-1]["global_step"] - audit[0]["global_step"]), 5)
  return row


def _gap_loss(gap: float, detection: float) -> float:
  """The job time the lost worker's absence costs: its place trains nothing for `gap` seconds,
  a quarter of the job's pace (each worker's pace is its own); synchronous, every step also
  waits for its marker until the chief finds it lost (`detection`), then goes on with the
  others' batches only."""
  if _SYNC.value:
    return detection + max(gap - detection, 0.0) / _WORKERS
  return gap / _WORKERS


def main(argv):
  del argv
  runs = []
  for rep in range(_REPETITIONS.value):
    row = {"repetition": rep, "load_before": common.load_average()}
    kinds = ("uninterrupted",) if _STEP_COST.value else (
        ("uninterrupted", "elastic") + (("stop_relaunch",) if _WITH_RESTART.value else ()))
    for kind in (("plain",) if _SYNC.value else ()) + kinds:
      row[kind] = _job(kind)
    if _SYNC.value:  # What elastic synchronous steps cost: per step, and the whole job.
      row["elastic_over_plain"] = round(row["uninterrupted"]["wall_secs"] /
                                        row["plain"]["wall_secs"], 3)
      row["step_over_plain"] = round(row["uninterrupted"]["step_secs"] /
                                     row["plain"]["step_secs"], 3)
    if _STEP_COST.value:
      row["load_after"] = common.load_average()
      runs.append(row)
      print(row, flush=True)
      continue
    for kind in ("elastic", "stop_relaunch")[:1 + _WITH_RESTART.value]:
      wall, span = (row[kind][f] - row["uninterrupted"][f] for f in ("wall_secs", "span_secs"))
      row[kind]["loss_secs"], row[kind]["span_loss_secs"] = round(wall, 3), round(span, 3)
    elastic = row["elastic"]
    elastic["bound_secs"] = round(elastic["detection_secs"] + row["uninterrupted"]["unit_secs"],
                                  3)
    if elastic["slot_gap_secs"] is not None:  # the same loss from the gap: far less noisy
      elastic["gap_loss_secs"] = round(_gap_loss(elastic["slot_gap_secs"],
                                                 elastic["detection_secs"]), 3)
    if _WITH_RESTART.value:
      floor = max(elastic["loss_secs"], elastic["detection_secs"])
      restart = row["stop_relaunch"]["loss_secs"]
      row["ratio_measured"] = round(restart / floor, 1)
      row["stop_relaunch_loss_at_600s_secs"] = round(restart + _PERIOD_SECS / 2, 1)
      row["ratio_at_600s"] = round(row["stop_relaunch_loss_at_600s_secs"] / floor, 1)
    row["load_after"] = common.load_average()
    runs.append(row)
    print(row, flush=True)
  median = lambda key, field: statistics.median(r[key][field] for r in runs)
  if _STEP_COST.value:
    summary = {"elastic_over_plain": statistics.median(r["elastic_over_plain"] for r in runs),
               "step_over_plain": statistics.median(r["step_over_plain"] for r in runs),
               "plain_wall_secs": median("plain", "wall_secs"),
               "elastic_wall_secs": median("uninterrupted", "wall_secs")}
    print("medians:", summary, flush=True)
    common.write_results(_OUTPUT.value, {"runs": runs, "medians": summary}, sys.argv,
                         workers=_WORKERS, total_batches=_TOTAL.value,
                         unit_batches=_UNIT.value, epochs=_EPOCHS.value,
                         step_sleep_secs=_SLEEP.value, sync=True)
    return
  summary = {"elastic_loss_secs": median("elastic", "loss_secs"),
             "elastic_span_loss_secs": median("elastic", "span_loss_secs"),
             "detection_secs": median("elastic", "detection_secs"),
             "bound_secs": median("elastic", "bound_secs")}
  if _WITH_RESTART.value:
    summary.update({
        "stop_relaunch_loss_secs": median("stop_relaunch", "loss_secs"),
        "stop_relaunch_span_loss_secs": median("stop_relaunch", "span_loss_secs"),
        "ratio_measured": statistics.median(r["ratio_measured"] for r in runs),
        "ratio_at_600s": statistics.median(r["ratio_at_600s"] for r in runs)})
  if _SYNC.value:
    for key in ("elastic_over_plain", "step_over_plain"):
      summary[key] = statistics.median(r[key] for r in runs)
  for key in ("slot_gap_secs", "gap_loss_secs"):
    values = [r["elastic"].get(key) for r in runs]
    if None not in values:
      summary[key] = statistics.median(values)
  joins = [r["elastic"].get("spare_joined_secs") for r in runs]
  if _SPARES.value and None not in joins:
    summary["spare_joined_secs"] = statistics.median(joins)
  print("medians:", summary, flush=True)
  common.write_results(_OUTPUT.value, {"runs": runs, "medians": summary}, sys.argv,
                       workers=_WORKERS, total_batches=_TOTAL.value, unit_batches=_UNIT.value,
                       epochs=_EPOCHS.value, step_sleep_secs=_SLEEP.value, sync=_SYNC.value,
                       spare_workers=_SPARES.value, relaunch=_RELAUNCH.value)


if __name__ == "__main__":
  app.run(main)
