"""Reproduces long synchronous runs dying on "The same RunGraph (Worker) request was received twice".

Runs the epoch-sync hooks hand-wired into TensorFlow's own MonitoredTrainingSession
(tests/tasks/stock_session_task.py: the linear model, WorkerDoneSyncReplicasOptimizer,
mid-epoch checkpoints every --save_steps) on a LocalCluster, --runs times in a row, and counts
the runs that failed, by the error in the failed task's log: a duplicate RunGraph on a ps, an
UNAVAILABLE, another ABORTED, or a re-created session. TensorFlow's gRPC logging of the
retries is on (TF_CPP_VMODULE=grpc_state=1,...), so a resent request shows in the logs, which
are kept under --runs_dir (one directory per run).

Typical usage (about a minute per 10,000 steps on an idle 2-core machine):
  python -m bench.repro_rungraph_twice --runs=5 --batches=6000 --epochs=3 --workers=2
  ./es bench --only=repro_rungraph_twice
"""

import collections
import json
import os
import re
import sys
import tempfile
import time

from absl import app
from absl import flags

from hooks.testing.local_cluster import LocalCluster

_RUNS = flags.DEFINE_integer("runs", 5, "Jobs to run in a row.", lower_bound=1)
_WORKERS = flags.DEFINE_integer("workers", 2, "Training tasks (worker:0 the chief).",
                                lower_bound=1)
_PS = flags.DEFINE_integer("ps", 1, "Parameter-server tasks.", lower_bound=1)
_BATCHES = flags.DEFINE_integer("batches", 6000, "Batches per worker per epoch.", lower_bound=1)
_EPOCHS = flags.DEFINE_integer("epochs", 3, "Epochs per job.", lower_bound=1)
_SAVE_STEPS = flags.DEFINE_integer("save_steps", 500, "Mid-epoch checkpoint every this many "
                                   "global steps (0: none).", lower_bound=0)
_TIMEOUT = flags.DEFINE_float("timeout_secs", 1800.0, "Hard deadline of one job.")
_VMODULE = flags.DEFINE_string("vmodule", "grpc_state=1,grpc_remote_worker=1,master_session=1",
                               "TF_CPP_VMODULE for every task ('' for none).")
_RUNS_DIR = flags.DEFINE_string("runs_dir", None, "Where each run's task logs go (default: a "
                               "new temporary directory).")
_OUTPUT = flags.DEFINE_string("output", None, "Write the counts as JSON here.")

_TASK = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests",
                     "tasks", "stock_session_task.py")
# The kinds of failure, each by a pattern of the failed task's log (the first that matches).
KINDS = (("rungraph_twice", re.compile(r"The same RunGraph \(Worker\) request was received twice")),
         ("unavailable", re.compile(r"UNAVAILABLE|UnavailableError")),
         ("aborted", re.compile(r"ABORTED|AbortedError")),
         ("recreated", re.compile(r"re-created its lost session|lost its session")))
_RETRY = re.compile(r"Retrying call for|returned with non-ok status")


def classify(log: str) -> str:
  """The kind of failure a failed task's log shows (KINDS), or "other"."""
  return next((kind for kind, pattern in KINDS if pattern.search(log)), "other")


def run_once(log_dir: str) -> dict:
  """One job; returns {ok, secs, failures: {task: kind}, retries: {task: count}, logs}."""
  model_dir = os.path.join(log_dir, "model")
  shard = ",".join([str(_BATCHES.value)] * _WORKERS.value)
  command = [sys.executable, _TASK, f"--model_dir={model_dir}", f"--shard_batches={shard}",
             f"--epochsync_num_epochs={_EPOCHS.value}",
             f"--epochsync_save_checkpoint_steps={_SAVE_STEPS.value}",
             "--epochsync_save_checkpoint_secs=0", "--session=mts"]
  env = {"TF_CPP_VMODULE": _VMODULE.value} if _VMODULE.value else {}
  start = time.monotonic()
  with LocalCluster(num_workers=_WORKERS.value, num_ps=_PS.value, timeout_secs=_TIMEOUT.value,
                    log_dir=log_dir, env=env) as cluster:
    cluster.start(command)
    result = cluster.wait()
    tasks = dict(result.tasks)
  failures = {t.name: ("timeout" if t.timed_out else classify(t.log)) for t in result.failed}
  retries = {}
  for name in os.listdir(log_dir):
    if name.endswith(".log"):
      with open(os.path.join(log_dir, name), errors="replace") as f:
        retries[name[:-4]] = len(_RETRY.findall(f.read()))
  return {"ok": not failures, "secs": round(time.monotonic() - start, 1),
          "failures": failures, "retries": retries, "logs": log_dir,
          "tasks": sorted(tasks)}


def main(argv):
  del argv
  root = _RUNS_DIR.value or tempfile.mkdtemp(prefix="repro-rungraph-")
  runs, kinds = [], collections.Counter()
  for i in range(_RUNS.value):
    load = os.getloadavg()[0]
    run = run_once(os.path.join(root, f"run{i}"))
    run["load"] = round(load, 2)
    runs.append(run)
    kinds.update(set(run["failures"].values()) or {"ok"})
    print(f"run {i}: {'ok' if run['ok'] else 'FAILED ' + json.dumps(run['failures'])} in "
          f"{run['secs']} s (load {load:.2f}); logs {run['logs']}", flush=True)
  failed = sum(not r["ok"] for r in runs)
  summary = {"runs": len(runs), "failed": failed, "kinds": dict(kinds),
             "steps_per_run": _BATCHES.value * _EPOCHS.value, "workers": _WORKERS.value,
             "ps": _PS.value, "save_steps": _SAVE_STEPS.value, "details": runs}
  print(f"{failed} of {len(runs)} runs failed: {dict(kinds)}", flush=True)
  if _OUTPUT.value:
    with open(_OUTPUT.value, "w") as f:
      json.dump(summary, f, indent=1)


if __name__ == "__main__":
  app.run(main)
