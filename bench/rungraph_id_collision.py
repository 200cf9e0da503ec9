"""Stock TensorFlow alone fails a step with "The same RunGraph (Worker) request was received twice".

No tf-epochsync code: one ps and one worker (tf.distribute.Server, in this process), a session
on the worker, and a graph with a partition on each task (a variable on the ps, an op on the
worker), run --runs times from --threads client threads. Each `session.run` is one RunStep;
TensorFlow's master runs it in a new thread (Env::SchedClosure), whose request ids come from
a thread-local std::mt19937_64 seeded with 32 bits (tsl::random::ThreadLocalNew64), and each
task rejects an id among the last 100,000 it has seen (RecentRequestIds). So a step's ids
repeat an earlier step's with probability (earlier steps in the window) / 2**32 per step:
about 1 - exp(-N**2 / 2**33) after N runs (N <= 100,000): 7 % at 25,000, 69 % at 100,000.

It prints each collision (run index, the error type raised, the tasks that rejected it, the
request ids) and a JSON summary; the collision is counted and the runs go on (the session
survives it). The step raises AbortedError, or CancelledError when the worker's own partition,
cancelled while it waited for the rejected ps partition, reported first.

With the LD_PRELOAD shim bench/seed_bits.cc (std::random_device cut to SEED_BITS bits) the
same collisions come within seconds; the rate follows the seed's bits, which shows the cause:
  g++ -O2 -shared -fPIC -o /tmp/libseed_bits.so bench/seed_bits.cc
  SEED_BITS=10 LD_PRELOAD=/tmp/libseed_bits.so python -m bench.rungraph_id_collision --runs=3000

Typical usage (1 to 3 minutes per 100,000 runs on an idle 2-core machine):
  python -m bench.rungraph_id_collision --runs=150000 --threads=2 --output=/tmp/ids.json
"""

import json
import math
import os
import re
import threading
import time

from absl import app
from absl import flags
import portpicker
import tensorflow as tf

_RUNS = flags.DEFINE_integer("runs", 150000, "session.run calls in all.", lower_bound=1)
_THREADS = flags.DEFINE_integer("threads", 2, "Client threads.", lower_bound=1)
_DEADLINE = flags.DEFINE_float("deadline_secs", 900.0, "Stop after this long.")
_OUTPUT = flags.DEFINE_string("output", None, "Write the summary as JSON here.")

_v1 = tf.compat.v1
_TWICE = re.compile(r"From (/job:\S+):\s*The same RunGraph \(Worker\) request was received "
                    r"twice.*?request_id: (-?\d+)", re.S)


def expected_probability(runs: int, window: int = 100000) -> float:
  """P(at least one collision) after `runs` steps with 32-bit-seeded ids, `window` kept."""
  space = 2.0 ** 32
  inside = min(runs, window)
  exponent = inside * inside / 2.0 + (runs - inside) * window
  return 1.0 - math.exp(-exponent / space)


class _Counter:
  """Hands out run indices to the client threads and keeps the collisions."""

  def __init__(self, runs: int, deadline: float):
    self._next, self._runs, self._deadline = 0, runs, deadline
    self._lock = threading.Lock()
    self.collisions, self.other_errors = [], []

  def take(self) -> int:
    with self._lock:
      if self._next >= self._runs or time.monotonic() > self._deadline:
        return -1
      self._next += 1
      return self._next - 1

  def done(self) -> int:
    return self._next


def _client(session, fetch, counter: _Counter) -> None:
  while True:
    index = counter.take()
    if index < 0:
      return
    try:
      session.run(fetch)
    except tf.errors.OpError as e:  # AbortedError, or CancelledError if a cancel came first
      found = _TWICE.findall(str(e))
      if not found:
        counter.other_errors.append(f"run {index}: {type(e).__name__}: {str(e)[:300]}")
        continue
      entry = {"run": index, "raised": type(e).__name__,
               "rejected_by": sorted({task for task, _ in found}),
               "request_ids": sorted({rid for _, rid in found})}
      counter.collisions.append(entry)
      print(f"collision at run {index}: {json.dumps(entry)}", flush=True)


def _read_retrying(session, tensor, attempts: int = 100) -> int:
  """Reads `tensor`, again after a duplicate-request abort (a new step draws new ids)."""
  for attempt in range(attempts):
    try:
      return int(session.run(tensor))
    except (tf.errors.AbortedError, tf.errors.CancelledError):
      if attempt == attempts - 1:
        raise
  raise AssertionError("unreachable")


def main(argv):
  del argv
  _v1.disable_v2_behavior()
  cluster = tf.train.ClusterSpec({"ps": [f"localhost:{portpicker.pick_unused_port()}"],
                                  "worker": [f"localhost:{portpicker.pick_unused_port()}"]})
  config = _v1.ConfigProto(intra_op_parallelism_threads=1, inter_op_parallelism_threads=2)
  tf.distribute.Server(cluster, job_name="ps", task_index=0, config=config)
  worker = tf.distribute.Server(cluster, job_name="worker", task_index=0, config=config)
  with tf.Graph().as_default():
    with tf.device("/job:ps/task:0"):
      counter_var = _v1.get_variable("count", [], tf.int64, _v1.zeros_initializer())
      add = _v1.assign_add(counter_var, 1)
    with tf.device("/job:worker/task:0"):
      fetch = add * 2  # a partition on the worker too: a step has two RunGraphs
    with _v1.Session(worker.target, config=config) as session:
      session.run(_v1.global_variables_initializer())
      start = time.monotonic()
      counter = _Counter(_RUNS.value, start + _DEADLINE.value)
      threads = [threading.Thread(target=_client, args=(session, fetch, counter))
                 for _ in range(_THREADS.value)]
      for t in threads:
        t.start()
      for t in threads:
        t.join()
      secs = time.monotonic() - start
      applied = _read_retrying(session, counter_var)
  runs = counter.done()
  summary = {"runs": runs, "secs": round(secs, 1), "threads": _THREADS.value,
             "collisions": counter.collisions, "other_errors": counter.other_errors[:5],
             "increments_applied": applied, "load_avg_1m": round(os.getloadavg()[0], 2),
             "expected_p_at_least_one": round(expected_probability(runs), 3),
             "tensorflow": tf.__version__}
  print(json.dumps(summary, indent=1), flush=True)
  if _OUTPUT.value:
    with open(_OUTPUT.value, "w") as f:
      json.dump(summary, f, indent=1)


if __name__ == "__main__":
  app.run(main)
