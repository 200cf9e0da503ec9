"""The main job: a real 1 ps + 3 worker cluster on this machine, one process per task.

Typical usage:
  python -m examples.local_cluster                       # 1 ps + 3 workers, shards 9/5/0
  python -m examples.local_cluster --num_workers=4 --shard_batches=6,6,3,0 --stream_logs
"""

import json
import os
import sys
import tempfile

from absl import app
from absl import flags

from hooks.testing.local_cluster import LocalCluster

_NUM_WORKERS = flags.DEFINE_integer("num_workers", 3, "Training workers.", lower_bound=1)
_NUM_PS = flags.DEFINE_integer("num_ps", 1, "Parameter-server tasks.", lower_bound=1)
_SHARDS = flags.DEFINE_list("shard_batches", ["9", "5", "0"], "Batches per worker's shard.")
_TIMEOUT = flags.DEFINE_float("timeout_secs", 300, "Hard deadline for the whole job.")
_STREAM = flags.DEFINE_boolean("stream_logs", False, "Echo every task's log, prefixed.")
_OUTPUT_DIR = flags.DEFINE_string("output_dir", None, "Summaries and logs (default: a temp dir).")

_COLUMNS = ("task", "steps", "examples", "loss", "secs")


def main(argv):
  output_dir = _OUTPUT_DIR.value or tempfile.mkdtemp(prefix="epochsync-demo-")
  command = [sys.executable, "-m", "examples.train", "--output_dir=" + output_dir,
             "--shard_batches=" + ",".join(_SHARDS.value)] + argv[1:]
  cluster = LocalCluster(num_workers=_NUM_WORKERS.value, num_ps=_NUM_PS.value,
                         timeout_secs=_TIMEOUT.value, stream_logs=_STREAM.value,
                         log_dir=os.path.join(output_dir, "logs"))
  with cluster:
    cluster.start(command)
    result = cluster.wait()
  print(f"cluster: {json.dumps(cluster.cluster)}")
  print(f"job finished in {result.elapsed_secs:.1f} s; logs in {cluster.log_dir}")
  print("  ".join(f"{c:>10}" for c in _COLUMNS))
  for name, task in sorted(result.tasks.items()):
    path = os.path.join(output_dir, name.replace(":", "-") + ".json")
    if task.ok and os.path.exists(path):
      with open(path) as f:
        row = json.load(f)
      print("  ".join(f"{row[c]:>10.4g}" if isinstance(row[c], float) else f"{row[c]:>10}"
                      for c in _COLUMNS) + f"   pid {task.pid}, exit {task.returncode}")
  result.check()


if __name__ == "__main__":
  app.run(main)
