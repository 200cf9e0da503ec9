"""What a resume skips: static shards vs the work queue, on the same data and the same save.

4 workers, 1 ps, examples.train's linear model, synchronous, one epoch of --units units of
--unit_batches batches (the static job: the same batches as 4 equal shards), a mid-epoch
checkpoint every --save_steps steps. Each job is SIGKILLed (worker:1) right after the chief's
first mid-epoch save, then relaunched from it. From the audit of the resumed epoch:

  static  every worker skips what the checkpoint holds of its shard, min(S, shard): about
          workers x S batches, read again (and thrown away) on the resume;
  queue   only the units in flight at the save skip what it holds of them: at most one unit
          per worker, whatever S.

Both are counts (batches read again), independent of the machine's load; bench.resume_cost
gives the time a skip takes per example.

Typical usage:
  python -m bench.resume_skip --repetitions=3 --output=bench/results/resume_skip.json
"""

import os
import sys
import tempfile
import time
from typing import Dict, List

from absl import app
from absl import flags

from bench import common
from hooks.epoch.audit import read_audit
from hooks.testing.local_cluster import LocalCluster

_REPETITIONS = flags.DEFINE_integer("repetitions", 3, "Repetitions.", lower_bound=1)
_UNITS = flags.DEFINE_integer("units", 40, "Units per epoch.", lower_bound=4)
_UNIT_BATCHES = flags.DEFINE_integer("unit_batches", 8, "Batches per unit.", lower_bound=1)
_SAVE = flags.DEFINE_integer("save_steps", 44, "Mid-epoch checkpoint period (steps); not a "
                             "multiple of --unit_batches, or no unit is in flight at the save "
                             "(the workers take their units in lockstep).")
_OUTPUT = flags.DEFINE_string("output", None, "Write the results as JSON here.")

_TASK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "work_queue_task.py")
_WORKERS = 4


def _killed_and_resumed(input_flag: str) -> dict:
  """The resumed epoch's audit line of a job killed after its first mid-epoch save."""
  model_dir = tempfile.mkdtemp(prefix="epochsync-bench-skip-")
  command = [sys.executable, _TASK, f"--model_dir={model_dir}", input_flag,
             "--epochsync_num_epochs=1", "--epochsync_sync=true",
             "--epochsync_save_checkpoint_secs=0",
             f"--epochsync_save_checkpoint_steps={_SAVE.value}"]
  saved = os.path.join(model_dir, "mid_epoch", "checkpoint")
  with LocalCluster(num_workers=_WORKERS, timeout_secs=300, fail_fast_secs=30,
                    log_dir=os.path.join(model_dir, "logs1")) as cluster:
    cluster.start(command + ["--step_sleep_secs=0.05"])
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not os.path.exists(saved):
      time.sleep(0.02)
    cluster.kill_task("worker:1")
    cluster.wait()
  with LocalCluster(num_workers=_WORKERS, timeout_secs=300,
                    log_dir=os.path.join(model_dir, "logs2")) as cluster:
    cluster.start(command + ["--step_sleep_secs=0"])
    cluster.wait().check()
  (line,) = read_audit(model_dir)
  return line


def main(argv):
  del argv
  total = _UNITS.value * _UNIT_BATCHES.value
  shard = ",".join([str(total // _WORKERS)] * _WORKERS)
  runs: List[Dict[str, object]] = []
  for rep in range(_REPETITIONS.value):
    row: Dict[str, object] = {"repetition": rep, "load_before": common.load_average()}
    static = _killed_and_resumed(f"--shard_batches={shard}")
    (resume,) = static["resumed_from"]
    row["static"] = {"resumed_at_step": resume["epoch_step"],
                     "skipped_batches": sum(resume["skipped_batches"].values())}
    queue = _killed_and_resumed("--unit_batches=" + ",".join([str(_UNIT_BATCHES.value)] *
                                                             _UNITS.value))
    (resume,) = queue["resumed_from"]
    parts = queue.get("unit_parts", [])
    row["queue"] = {"resumed_at_step": resume["epoch_step"], "units_in_flight": len(parts),
                    "skipped_batches": sum(p["to"] - p["from"] for p in parts),
                    "units_done_before": sum(1 for u in queue["units"] if u.get("before_resume"))}
    row["load_after"] = common.load_average()
    runs.append(row)
    print(row, flush=True)
  common.write_results(_OUTPUT.value, {"runs": runs}, sys.argv, workers=_WORKERS,
                       units=_UNITS.value, unit_batches=_UNIT_BATCHES.value,
                       save_steps=_SAVE.value)


if __name__ == "__main__":
  app.run(main)
