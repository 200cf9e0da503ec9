"""CPU of one session run on a ps task, by what crosses between the client and the ps.

One process holds a ps server and a worker server (localhost gRPC, as in the cluster) and a
session on the worker; each case is a cached callable run over and over, the cases alternating
in rounds. The CPU is the whole process's (client, master, both servers), so a case's extra
over "target only" is what the feed or the fetch costs the chief and ps:0 together per run.
This is what decided that the chief's aggregation run feeds nothing (issue 22).

  target only        an assign_add on the ps, nothing fed or fetched (stock's queue runner)
  fetch              the same, and its int32 result fetched to the client
  feed + fetch       an int32 fed to the ps, the result fetched (the aggregation before)

Typical usage:
  python -m bench.run_cost                              # 5 rounds of 3000 runs per case
  python -m bench.run_cost --runs=1000 --output=bench/results/run_cost-<date>.json
"""

import statistics
import sys
import time
from typing import Callable, Dict, List, Tuple

from absl import app
from absl import flags
import portpicker
import tensorflow as tf

from bench import common

_RUNS = flags.DEFINE_integer("runs", 3000, "Runs per case per round.", lower_bound=1)
_ROUNDS = flags.DEFINE_integer("rounds", 5, "Rounds (the cases alternate).", lower_bound=1)
_OUTPUT = flags.DEFINE_string("output", None, "Write the results as JSON here.")

_v1 = tf.compat.v1
_SERVERS: List[tf.distribute.Server] = []


def _cases() -> Dict[str, Callable[[], object]]:
  ps, worker = portpicker.pick_unused_port(), portpicker.pick_unused_port()
  cluster = tf.train.ClusterSpec({"ps": [f"localhost:{ps}"], "worker": [f"localhost:{worker}"]})
  servers = [tf.distribute.Server(cluster, job_name=job, task_index=0) for job in ("ps", "worker")]
  with tf.device("/job:ps/task:0"):
    counter = _v1.Variable(0, dtype=tf.int32)
    fed = _v1.placeholder(tf.int32, [])
    step = counter.assign_add(1)
    fed_step = tf.identity(counter.assign_add(fed))
  session = _v1.Session(servers[1].target)
  session.run(counter.initializer)
  _SERVERS.extend(servers)  # Kept alive with the session.
  fed_callable = session.make_callable(fed_step, [fed])
  return {"target only": session.make_callable(step.op),
          "fetch": session.make_callable(step),
          "feed + fetch": lambda: fed_callable(1)}


def _time(fn: Callable[[], object], runs: int) -> Tuple[float, float]:
  cpu, wall = time.process_time(), time.perf_counter()
  for _ in range(runs):
    fn()
  return (time.process_time() - cpu) / runs * 1e6, (time.perf_counter() - wall) / runs * 1e6


def main(argv):
  del argv
  _v1.disable_eager_execution()
  load = common.load_average()[0]
  cases = _cases()
  for fn in cases.values():  # The first runs register the graphs.
    fn()
  rounds: Dict[str, List[Tuple[float, float]]] = {name: [] for name in cases}
  for _ in range(_ROUNDS.value):
    for name, fn in cases.items():
      rounds[name].append(_time(fn, _RUNS.value))
  base = statistics.median(cpu for cpu, _ in rounds["target only"])
  print(f"load average {load:.2f} before the start; {_ROUNDS.value} rounds of {_RUNS.value} runs")
  print("case            CPU us/run (median, min..max)   extra CPU us/run   wall us/run")
  summary = {}
  for name, figures in rounds.items():
    cpus = sorted(cpu for cpu, _ in figures)
    cpu, wall = statistics.median(cpus), statistics.median(w for _, w in figures)
    summary[name] = {"cpu_us": cpu, "wall_us": wall, "cpu_us_min": cpus[0], "cpu_us_max": cpus[-1]}
    print(f"{name:<14}  {cpu:8.1f} ({cpus[0]:.1f}..{cpus[-1]:.1f})  {cpu - base:+16.1f}  "
          f"{wall:11.1f}")
  common.write_results(_OUTPUT.value, {"summary": summary, "rounds": rounds}, sys.argv,
                       load_before=load)


if __name__ == "__main__":
  app.run(main)
