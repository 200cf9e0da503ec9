"""The main job: a real 1 ps + 3 worker cluster on this machine, one process per task.

Every worker trains exactly one pass over its shard per epoch (shards 9/5/0 batches by
default: uneven, one empty), all wait at the epoch barrier, the chief saves one
checkpoint per epoch, and the job ends by itself after the last epoch. While it trains,
each worker's progress lines (one per epoch, and one at most every --progress_secs within
a long epoch) and the chief's per-epoch line are echoed; at the end a table epoch x worker
(examples, seconds, barrier wait) and where the audit and the TensorBoard logs are. With
--api=estimator the same runs as an Estimator job (examples/estimator_train.py): a chief,
workers, 2 ps and an evaluator that evaluates every epoch.

Typical usage:
  python -m examples.local_cluster                       # 1 ps + 3 workers, 3 epochs
  python -m examples.local_cluster --num_workers=4 --shard_batches=6,6,3,0 --stream_logs
  python -m examples.local_cluster --api=estimator       # chief + 2 workers, 2 ps, evaluator
  python -m examples.local_cluster --api=estimator --model=ctr   # wide & deep on tf.Example files
  python -m examples.local_cluster --api=estimator --model=ctr --work_units --shard_batches=9,1,5,2
                                          # the same files handed out through the work queue
  python -m examples.local_cluster --work_units --shard_batches=900,700,800,600,900,500 \
      --epochsync_sync=false --epochsync_elastic --lose_worker=worker:1   # docs/elastic.md
                                          # worker:1 killed inside a unit; the job goes on
"""

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import threading

from absl import app
from absl import flags

from examples.demo_report import epoch_table, progress_printer, unit_table
from hooks.epoch.audit import AUDIT_FILENAME, read_audit
from hooks.testing.local_cluster import LocalCluster

_API = flags.DEFINE_enum("api", "mts", ["mts", "estimator"], "mts: examples/train.py with "
                         "MonitoredSession; estimator: examples/estimator_train.py with "
                         "estimator_ext.train_and_evaluate (a chief job and an evaluator).")
_MODEL = flags.DEFINE_enum("model", "linear", ["linear", "ctr"], "With --api=estimator: linear "
                           "(examples/estimator_train.py) or ctr (examples/ctr_train.py: a canned "
                           "wide & deep classifier on TFRecord files of tf.Example written first "
                           "into <model_dir>/data, file i holding 4 x shard_batches[i] examples).")
_NUM_WORKERS = flags.DEFINE_integer("num_workers", 3, "Training workers (with --api=estimator: "
                                    "the chief and num_workers-1 workers).", lower_bound=1)
_NUM_PS = flags.DEFINE_integer("num_ps", 1, "Parameter-server tasks (--api=estimator: 2 unless "
                               "given).", lower_bound=1)
_NUM_EPOCHS = flags.DEFINE_integer("num_epochs", 3, "Epochs to train.", lower_bound=1)
_WORK_UNITS = flags.DEFINE_boolean("work_units", False, "Hand the epoch out through a work queue "
                                    "(docs/workqueue.md): the --shard_batches sizes become units "
                                    "(with --api=estimator --model=ctr: files) that each worker "
                                    "takes when free.")
_SHARDS = flags.DEFINE_list("shard_batches", ["9", "5", "0"], "Batches per worker's shard.")
_TIMEOUT = flags.DEFINE_float("timeout_secs", 300, "Hard deadline for the whole job.")
_STREAM = flags.DEFINE_boolean("stream_logs", False, "Echo every task's log, prefixed.")
_PROGRESS_SECS = flags.DEFINE_float("progress_secs", 10, "A worker's progress line within a "
                                    "long epoch at most this often.", lower_bound=0.1)
_LOSE = flags.DEFINE_string("lose_worker", None, "SIGKILL this task (e.g. worker:1) "
                            "--lose_after_secs after it took its first unit, to watch an elastic "
                            "job (--epochsync_elastic, docs/elastic.md) go on without it.")
_LOSE_AFTER = flags.DEFINE_float("lose_after_secs", 3.0, "See --lose_worker.", lower_bound=0)
_MODEL_DIR = flags.DEFINE_string("model_dir", None, "Checkpoints, audit, summaries and logs "
                                 "(default: a new temporary directory).")


def _demo_timeouts(task_args):
  """The demo's short timeouts, for each --epochsync_* timeout flag the task args leave unset.

  The warning comes at half the barrier timeout at most, so that a user's lower
  --epochsync_barrier_timeout_secs never conflicts with the demo's own warning threshold.
  """
  given = {arg.split("=")[0].lstrip("-") for arg in task_args}
  barrier = 120.0
  for arg in task_args:
    if arg.startswith("--epochsync_barrier_timeout_secs="):
      barrier = float(arg.split("=", 1)[1])
  defaults = {"epochsync_barrier_timeout_secs": barrier,
              "epochsync_startup_timeout_secs": 120.0,
              "epochsync_log_every_secs": 10.0,
              "epochsync_warn_after_secs": min(30.0, barrier / 2)}
  return [f"--{name}={value:g}" for name, value in defaults.items() if name not in given]


def _input_flag() -> str:
  """The shard sizes, as static shards or (--work_units) as the work queue's units (a unit
  holds at least one batch: the empty ones are left out)."""
  if _WORK_UNITS.value:
    return "--unit_batches=" + ",".join(n for n in _SHARDS.value if int(n) > 0)
  return "--shard_batches=" + ",".join(_SHARDS.value)


def main(argv):
  model_dir = _MODEL_DIR.value or tempfile.mkdtemp(prefix="epochsync-demo-")
  estimator = _API.value == "estimator"
  if _MODEL.value == "ctr" and not estimator:
    raise app.UsageError("--model=ctr is an Estimator job: add --api=estimator")
  if _WORK_UNITS.value and estimator and _MODEL.value != "ctr":
    raise app.UsageError("--work_units with --api=estimator: add --model=ctr (its tf.Example "
                         "files are the units)")
  if _MODEL.value == "ctr":  # examples.ctr_train: files sharded by file over the tasks
    data_dir = os.path.join(model_dir, "data")
    subprocess.run([sys.executable, "-m", "examples.ctr_data", "--data_dir=" + data_dir,
                    "--train_files=" + ",".join(str(4 * int(n)) for n in _SHARDS.value)],
                   check=True, timeout=120)
    command = [sys.executable, "-m", "examples.ctr_train", "--model_dir=" + model_dir,
               "--data_dir=" + data_dir, f"--num_epochs={_NUM_EPOCHS.value}"] + (
                   ["--work_units"] if _WORK_UNITS.value else []) + argv[1:]
  elif estimator:  # examples.estimator_train is the user's job: its own flags, no --epochsync_*.
    command = [sys.executable, "-m", "examples.estimator_train", "--model_dir=" + model_dir,
               _input_flag(), f"--num_epochs={_NUM_EPOCHS.value}"] + argv[1:]
  else:
    command = [sys.executable, "-m", "examples.train", "--model_dir=" + model_dir,
               _input_flag(),
               f"--epochsync_num_epochs={_NUM_EPOCHS.value}",
               f"--epochsync_progress_secs={_PROGRESS_SECS.value}"]
    command += _demo_timeouts(argv[1:]) + argv[1:]
  num_ps = 2 if estimator and not flags.FLAGS["num_ps"].present else _NUM_PS.value
  on_line = None if _STREAM.value else progress_printer()
  cluster = LocalCluster(num_workers=_NUM_WORKERS.value, num_ps=num_ps,
                         has_chief=estimator, has_evaluator=estimator,
                         timeout_secs=_TIMEOUT.value, stream_logs=_STREAM.value,
                         log_dir=os.path.join(model_dir, "logs"),
                         fail_fast_secs=None if _LOSE.value else 10.0,
                         on_line=_killer(lambda: cluster, on_line) if _LOSE.value else on_line)
  print(f"cluster: {json.dumps(cluster.cluster)}", flush=True)
  print("training (each worker's progress, and the chief after every epoch):", flush=True)
  with cluster:
    cluster.start(command)
    result = cluster.wait()
  print(f"job finished in {result.elapsed_secs:.1f} s; model_dir {model_dir}")
  for name, task in sorted(result.tasks.items()):
    print(f"  {name:<12} pid {task.pid:<7} exit {task.returncode}  log {task.log_path}")
  audit = read_audit(model_dir)
  print("per epoch and worker (from the chief's audit): examples, seconds of its epoch, "
        "seconds it waited at the barrier")
  for row in epoch_table(audit):
    print("  " + row)
  for line in audit:
    print(f"  epoch {line['epoch']} checkpoint {line.get('checkpoint')}")
  if any("units" in line for line in audit):
    print("units per epoch and worker, in the order each took them (batches):")
    for row in unit_table(audit):
      print("  " + row)
  print(f"audit:       {os.path.join(model_dir, AUDIT_FILENAME)}")
  print(f"TensorBoard: tensorboard --logdir {model_dir}   (per-epoch scalars: run 'epochsync'; "
        "loss and global_step/sec: the top run)")
  if estimator:
    _print_evaluations(model_dir)
  if _LOSE.value:  # The lost worker's exit is the demo's doing; every other task must be fine.
    result = dataclasses.replace(result, tasks={n: t for n, t in result.tasks.items()
                                                if n != _LOSE.value})
  result.check()


def _killer(cluster_of, on_line):
  """An on_line callback that SIGKILLs --lose_worker --lose_after_secs after its first unit
  (then passes the line on)."""
  armed = threading.Event()

  def on(task: str, line: str) -> None:
    if task == _LOSE.value and " took unit " in line and not armed.is_set():
      armed.set()
      threading.Timer(_LOSE_AFTER.value, cluster_of().kill_task, [task]).start()
      print(f"  (the demo kills {task} in {_LOSE_AFTER.value:g} s)", flush=True)
    if on_line is not None:
      on_line(task, line)

  return on


def _print_evaluations(model_dir: str) -> None:
  """The evaluator's JSON lines (read without importing TensorFlow into the launcher)."""
  path = os.path.join(model_dir, "eval", "epochsync_eval-evaluator-0.jsonl")
  lines = []
  if os.path.exists(path):
    with open(path) as f:
      lines = [json.loads(line) for line in f if line.strip()]
  print(f"evaluations by evaluator:0 ({path}):")
  for line in lines:
    metrics = "  ".join(f"{k} {v:.4f}" for k, v in sorted(line["metrics"].items())
                        if k != "global_step")
    print(f"  epoch {line['epoch']}: global_step {line['global_step']}  {metrics}  "
          f"({line['eval_secs']:.2f} s)")
  if not lines:
    print("  none")


if __name__ == "__main__":
  app.run(main)
