"""What running each step on a runner thread costs: session.run direct vs through the watchdog.

Every training step's session.run goes to a runner thread (hooks.faults.step_runner), so that a
run TensorFlow lost can be left behind and the step run again; the training loop waits for
it. This measures that hand-over in-process: a local session runs a tiny step (one assign_add)
`--runs` times directly and then through `StuckStepWatchdog.run`, alternating in `--pairs`
pairs; per pair the extra wall and CPU (this process) per run, then the medians and ranges.

Typical usage:
  python -m bench.step_runner_cost --pairs=10 --runs=5000 --output=bench/results/step_runner.json
"""

import sys
import time
from typing import Callable, Dict, List

from absl import app
from absl import flags
import tensorflow as tf

from bench import common
from hooks.faults.stuck_step import StuckStepWatchdog

_PAIRS = flags.DEFINE_integer("pairs", 10, "Pairs of (direct, through the runner) batches.")
_RUNS = flags.DEFINE_integer("runs", 5000, "session.run calls per batch.")
_OUTPUT = flags.DEFINE_string("output", None, "Write the results as JSON here.")

_v1 = tf.compat.v1


def _timed(fn: Callable[[], object], runs: int) -> Dict[str, float]:
  """Wall and CPU microseconds per call of `fn`, over `runs` calls."""
  wall, cpu = time.perf_counter(), time.process_time()
  for _ in range(runs):
    fn()
  return {"wall_us": (time.perf_counter() - wall) / runs * 1e6,
          "cpu_us": (time.process_time() - cpu) / runs * 1e6}


def measure(pairs: int, runs: int) -> Dict[str, object]:
  """The pairs and their medians (see the module docstring)."""
  graph = tf.Graph()
  with graph.as_default():
    counter = _v1.Variable(0.0)
    step = _v1.assign_add(counter, 1.0)
    watchdog = StuckStepWatchdog("worker:0")
    watchdog.build("/cpu:0")
    init = [_v1.global_variables_initializer(), _v1.local_variables_initializer()]
  session = _v1.Session(graph=graph)
  session.run(init)
  watchdog.bind(session)
  watchdog.start()

  def direct():
    return session.run(step)

  def through_runner():
    return watchdog.run(direct)

  _timed(direct, runs // 10)
  _timed(through_runner, runs // 10)  # warm-up: the runner thread, the graph's first run
  rows: List[Dict[str, float]] = []
  for _ in range(pairs):
    plain, runner = _timed(direct, runs), _timed(through_runner, runs)
    rows.append({"direct_wall_us": plain["wall_us"], "runner_wall_us": runner["wall_us"],
                 "extra_wall_us": runner["wall_us"] - plain["wall_us"],
                 "extra_cpu_us": runner["cpu_us"] - plain["cpu_us"]})
  watchdog.stop()
  session.close()
  summary = {key: common.summary(r[key] for r in rows) for key in rows[0]}
  return {"pairs": rows, "summary": summary, "runs": runs}


def main(argv):
  del argv
  load_at_start = common.load_average()
  result = measure(_PAIRS.value, _RUNS.value)
  for key, value in result["summary"].items():
    print(f"{key:>16}: median {value['median']:7.1f} us  ({value['min']:.1f} .. "
          f"{value['max']:.1f})")
  load_at_end = common.load_average()
  print(f"load {load_at_start[0]:.2f} -> {load_at_end[0]:.2f}")
  common.write_results(_OUTPUT.value, result, sys.argv, load_at_start=load_at_start,
                       load_at_end=load_at_end)


if __name__ == "__main__":
  app.run(main)
