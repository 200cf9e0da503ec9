"""The cost of one unit hand-off: a claim's latency and ps:0's CPU per claim, at 2, 8, 32 claimers.

A real gRPC cluster: ps:0 in a process of its own (its CPU read from /proc), two worker servers
in this process, and N claimer threads (worker ids 0..N-1, alternating between the two
servers), each with its own session and UnitClaims, claiming back to back: the worst case, every
worker finishing a unit at once. Each epoch has 16 units per claimer; a claimer that finds the
queue empty waits for the others (the epoch barrier) before the next epoch; the first epoch
warms up (each session's first claim registers its graph on the ps: seconds) and is not
counted. Per N: the claims'
latency (p50, p90, p99, ms) and ps:0's CPU per claim (ms). A real job claims once per unit
(seconds to minutes of training), so the figures bound what the queue adds per unit.

Typical usage:
  python -m bench.claim_cost --claimers=2,8,32 --epochs=4 --output=bench/results/claim_cost.json
"""

import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from typing import Dict, List

from absl import app
from absl import flags
import portpicker
import tensorflow as tf

from bench import common
from hooks.workqueue import queue_graph
from hooks.workqueue.claims import UnitClaims

_CLAIMERS = flags.DEFINE_list("claimers", ["2", "8", "32"], "Numbers of claimers to run.")
_EPOCHS = flags.DEFINE_integer("epochs", 4, "Epochs per run (16 units per claimer each).")
_OUTPUT = flags.DEFINE_string("output", None, "Write the results as JSON here.")

_v1 = tf.compat.v1
_UNITS_PER_CLAIMER = 16
_PS = """
import sys, tensorflow as tf
spec = tf.train.ClusterSpec({"ps": [sys.argv[1]], "worker": sys.argv[2].split(",")})
tf.distribute.Server(spec, job_name="ps", task_index=0, start=True).join()
"""


def _cpu_secs(pid: int) -> float:
  with open(f"/proc/{pid}/stat") as f:
    fields = f.read().rsplit(")", 1)[1].split()
  return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _run(claimers: int, epochs: int) -> Dict[str, float]:
  ps, workers = portpicker.pick_unused_port(), [portpicker.pick_unused_port() for _ in range(2)]
  addresses = [f"localhost:{p}" for p in workers]
  ps_proc = subprocess.Popen([sys.executable, "-c", _PS, f"localhost:{ps}", ",".join(addresses)],
                             start_new_session=True, stderr=subprocess.DEVNULL)
  try:
    spec = tf.train.ClusterSpec({"ps": [f"localhost:{ps}"], "worker": addresses})
    servers = [tf.distribute.Server(spec, job_name="worker", task_index=i, start=True)
               for i in range(2)]
    units = _UNITS_PER_CLAIMER * claimers
    graph = tf.Graph()
    with graph.as_default():
      ops = queue_graph.build(units, claimers, 0, True, "/job:ps/task:0")
      init = _v1.global_variables_initializer()
    sessions = [_v1.Session(servers[w % 2].target, graph=graph) for w in range(claimers)]
    sessions[0].run(init)
    latencies: List[float] = []
    marks = []  # (wall, ps CPU) as each epoch starts: the measured part starts at epoch 2's
    barrier = threading.Barrier(
        claimers, action=lambda: marks.append((time.perf_counter(), _cpu_secs(ps_proc.pid))))
    lock = threading.Lock()

    def claimer(worker_id: int) -> None:
      claims = UnitClaims(ops, worker_id, f"worker:{worker_id}", timeout_secs=120)
      mine = []
      for epoch in range(1, epochs + 2):  # Epoch 1 warms up.
        barrier.wait()
        unit, batches = None, 0
        while unit is None or unit >= 0:
          start = time.perf_counter()
          finished = (unit, 1, 1) if unit is not None else None
          unit = claims.claim(sessions[worker_id], epoch, batches, finished).unit
          if epoch > 1:
            mine.append(time.perf_counter() - start)
          batches += 1
      with lock:
        latencies.extend(mine)

    threads = [threading.Thread(target=claimer, args=(w,)) for w in range(claimers)]
    for t in threads:
      t.start()
    for t in threads:
      t.join(600)
    wall, cpu = time.perf_counter() - marks[1][0], _cpu_secs(ps_proc.pid) - marks[1][1]
    for session in sessions:
      session.close()
    ms = sorted(1000 * x for x in latencies)
    quantile = lambda q: round(ms[min(len(ms) - 1, int(q * len(ms)))], 3)
    return {"claimers": claimers, "claims": len(ms), "p50_ms": quantile(0.5),
            "p90_ms": quantile(0.9), "p99_ms": quantile(0.99),
            "mean_ms": round(statistics.mean(ms), 3), "claims_per_sec": round(len(ms) / wall, 1),
            "ps_cpu_ms_per_claim": round(1000 * cpu / len(ms), 3)}
  finally:
    os.killpg(ps_proc.pid, signal.SIGKILL)
    ps_proc.wait()


def main(argv):
  del argv
  rows = []
  for claimers in map(int, _CLAIMERS.value):
    load = common.load_average()
    row = _run(claimers, _EPOCHS.value)
    row.update(load_before=load, load_after=common.load_average())
    rows.append(row)
    print(row, flush=True)
  common.write_results(_OUTPUT.value, {"runs": rows}, sys.argv, epochs=_EPOCHS.value,
                       units_per_claimer=_UNITS_PER_CLAIMER)


if __name__ == "__main__":
  app.run(main)
