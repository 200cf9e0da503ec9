"""What the ps-side protocol costs with N workers: each piece driven by N light clients.

Real `tf.distribute.Server` ps tasks run in processes of their own (their CPU read from /proc);
two worker servers run in this process, and N simulated workers are threads, each with its own
session, running the project's own graph pieces back to back (a job's workers run them once per
step, per unit or per second: these are their costs at saturation). Per N:

  - `plain`, `queue_lock`, `batch_gate`, `admitted`: an asynchronous elastic step's ps-side
    part. Each step stages a gradient on a ps task and adds it to a variable there (`plain`);
    `queue_lock` adds the batch gate as it was built before this benchmark: one run of the work
    queue's lock on ps:0, shared by every step of every worker; `batch_gate` adds today's
    (hooks.workqueue.elastic_graph.gate: the worker's admission word, no lock); `admitted`
    applies once its worker's admission word admits it (apply_if_member, hooks.ElasticOptimizer).
    Steps/s, p50/p99 latency (ms), ps CPU per step (µs, every ps), and the part over `plain`.
  - `capacity`: what ps:0 sustains with no client in the way: one run carries N admissions
    (the queue's lock: serialized; the admission words: in parallel), admissions per second.
  - `claim`: a unit hand-off (hooks.workqueue.claims): latency, ps:0 CPU per claim.
  - `heartbeat`: a worker's heartbeat row written (once a second in a job) and all rows read (a
    waiting task's poll): ps:0 CPU per write and per read of N rows.
  - `barrier`: every worker arrives and the chief gathers and releases
    (hooks.epoch.barrier_graph): the release's latency after the last arrival, ps:0 CPU per
    barrier.
  - `probes`: the chief's liveness probes of N workers (hooks.faults.liveness): CPU per probe,
    and the chief's CPU per second at the probe period it uses for N
    (hooks.elastic.lost_workers.probe_period_secs).

The sustained rates are bounded by this machine (2 cores: the clients and the ps tasks share
them); the per-step CPU on the ps is the figure that carries to a cluster, and the batch gate's
serialized section caps its rate at 1 / (its lock's hold time) whatever the cores.

Typical usage:
  python -m bench.scale --workers=8,32,128,256 --output=bench/results/scale.json \
      --plot=bench/results/scale.png
"""

import functools
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from typing import Callable, Dict, List, Sequence

from absl import app
from absl import flags
import portpicker
import tensorflow as tf

from bench import common
from hooks import graph_keys
from hooks.elastic.lost_workers import probe_period_secs
from hooks.epoch import barrier_graph
from hooks.faults import heartbeat
from hooks.faults.liveness import LivenessMonitor
from hooks.workqueue import elastic_graph, queue_graph
from hooks.workqueue.claims import UnitClaims
from hooks.workqueue.state_ops import execute_unrecorded

_WORKERS = flags.DEFINE_list("workers", ["8", "32", "128", "256"], "Numbers of workers.")
_PS = flags.DEFINE_integer("num_ps", 2, "ps tasks (the model's variables over them).")
_SECS = flags.DEFINE_float("secs", 6.0, "How long each step variant runs per N.")
_PIECES = flags.DEFINE_list("pieces", ["steps", "capacity", "claim", "heartbeat", "barrier",
                                       "probes"],
                            "Which pieces to measure.")
_OUTPUT = flags.DEFINE_string("output", None, "Write the results as JSON here.")
_PLOT = flags.DEFINE_string("plot", None, "Write the cost-vs-N plot (PNG) here.")
_REPLOT = flags.DEFINE_string("replot", None, "Only draw --plot from this results JSON.")

_v1 = tf.compat.v1
_PS_MAIN = """
import sys, tensorflow as tf
spec = tf.train.ClusterSpec({"ps": sys.argv[1].split(","), "worker": sys.argv[2].split(",")})
tf.distribute.Server(spec, job_name="ps", task_index=int(sys.argv[3]), start=True).join()
"""
_GRAD = 16  # floats per step's gradient


def _cpu_secs(pid: int) -> float:
  with open(f"/proc/{pid}/stat") as f:
    fields = f.read().rsplit(")", 1)[1].split()
  return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class _Cluster:
  """`num_ps` ps processes and two worker servers in this process."""

  def __init__(self, num_ps: int):
    ps = [f"localhost:{portpicker.pick_unused_port()}" for _ in range(num_ps)]
    workers = [f"localhost:{portpicker.pick_unused_port()}" for _ in range(2)]
    self.procs = [subprocess.Popen([sys.executable, "-c", _PS_MAIN, ",".join(ps),
                                    ",".join(workers), str(i)],
                                   start_new_session=True, stderr=subprocess.DEVNULL)
                  for i in range(num_ps)]
    spec = tf.train.ClusterSpec({"ps": ps, "worker": workers})
    self.servers = [tf.distribute.Server(spec, job_name="worker", task_index=i, start=True)
                    for i in range(2)]
    self.worker_addresses = workers

  def ps_cpu(self) -> List[float]:
    return [_cpu_secs(p.pid) for p in self.procs]

  def sessions(self, graph: tf.Graph, n: int) -> List[_v1.Session]:
    return [_v1.Session(self.servers[w % 2].target, graph=graph) for w in range(n)]

  def close(self) -> None:
    for proc in self.procs:
      os.killpg(proc.pid, signal.SIGKILL)
      proc.wait()


def _quantiles(secs: Sequence[float]) -> Dict[str, float]:
  ms = sorted(1000 * x for x in secs)
  pick = lambda q: round(ms[min(len(ms) - 1, int(q * len(ms)))], 3)
  return {"p50_ms": pick(0.5), "p99_ms": pick(0.99), "mean_ms": round(statistics.mean(ms), 3)}


def _hammer(sessions, runs: Sequence[Callable], secs: float, cluster: _Cluster) -> Dict:
  """Each thread i runs runs[i](sessions[i]) back to back for `secs` (after one warm-up run):
  the runs, their latencies, and every ps's CPU over the measured span."""
  for session, run in zip(sessions, runs):
    run(session)  # registers the graph on the ps tasks: not measured
  latencies: List[List[float]] = [[] for _ in sessions]
  start = threading.Barrier(len(sessions) + 1)
  stop = threading.Event()

  def loop(i: int) -> None:
    start.wait()
    while not stop.is_set():
      t = time.perf_counter()
      try:
        runs[i](sessions[i])
      except tf.errors.AbortedError:  # a RunGraph TensorFlow saw twice (its retry): not counted
        continue
      latencies[i].append(time.perf_counter() - t)

  threads = [threading.Thread(target=loop, args=(i,), daemon=True) for i in range(len(sessions))]
  for t in threads:
    t.start()
  start.wait()
  cpu0, t0 = cluster.ps_cpu(), time.perf_counter()
  time.sleep(secs)
  cpu1, wall = cluster.ps_cpu(), time.perf_counter() - t0
  stop.set()
  for t in threads:
    t.join(60)
  flat = [x for xs in latencies for x in xs]
  count = len(flat)
  return {"runs": count, "per_sec": round(count / wall, 1),
          "ps_cpu_us": [round(1e6 * (b - a) / count, 1) for a, b in zip(cpu0, cpu1)],
          **_quantiles(flat)}


_VARIANTS = ("plain", "queue_lock", "batch_gate", "admitted")


def _step_graph(variant: str, w: int, n: int, num_ps: int):
  """Worker `w`'s own graph (as a real worker's: its ops only) for one step variant; the
  fetch, and (worker 0) the initialization and the run's start."""
  graph = tf.Graph()
  with graph.as_default():
    ops = queue_graph.build(4 * n, n, 0, False, "/job:ps/task:0", elastic=True)
    variables = []
    for p in range(num_ps):
      with _v1.device(f"/job:ps/task:{p}"):
        variables.append(_v1.get_variable(f"v{p}", [_GRAD], initializer=_v1.zeros_initializer(),
                                          use_resource=False))
    var, identity = variables[w % num_ps], tf.constant(0, tf.int64)
    with _v1.device(f"/job:worker/task:{w % 2}"):
      grad = tf.fill([_GRAD], 1e-6)
    with _v1.device(var.device):
      staged = tf.identity(grad)
    add = lambda: _v1.assign_add(var, staged, use_locking=True).op
    if variant == "plain":
      fetch = add()
    elif variant == "queue_lock":  # the batch gate until this benchmark: the queue's one lock
      with _v1.device("/job:ps/task:0"):
        passed = execute_unrecorded(ops.lock, functools.partial(elastic_graph.admit, ops, w))
      with tf.control_dependencies([elastic_graph.refuse_fenced(passed, w)]):
        fetch = add()
    elif variant == "batch_gate":
      with tf.control_dependencies([elastic_graph.gate(ops, w, tf.no_op(), identity)]):
        fetch = add()
    else:
      fetch = elastic_graph.apply_if_member(ops, w, identity, [staged], add)
    start = None
    if w == 0:  # as the chief's graph (its LostWorkerWatch): every worker's admission word
      for other in range(n):
        elastic_graph.admission_word(ops, other)
      start = [_v1.global_variables_initializer(), graph.get_collection(graph_keys.RESET_OPS)]
  return graph, fetch, start


def _steps(cluster: _Cluster, n: int, secs: float) -> Dict[str, Dict]:
  """plain, queue_lock, batch_gate, admitted: N workers' steps, one variant after another, each
  worker with a graph and a session of its own."""
  num_ps, out = len(cluster.procs), {}
  for variant in _VARIANTS:
    built = [_step_graph(variant, w, n, num_ps) for w in range(n)]
    sessions = [_v1.Session(cluster.servers[w % 2].target, graph=g) for w, (g, _, _) in
                enumerate(built)]
    init, reset = built[0][2]
    sessions[0].run(init)
    sessions[0].run(reset)
    out[variant] = _hammer(sessions, [lambda s, op=op: s.run(op) for _, op, _ in built], secs,
                           cluster)
    for session in sessions:
      session.close()
    del built, sessions
  for name in _VARIANTS[1:]:
    out[name]["over_plain_ps_cpu_us"] = round(sum(out[name]["ps_cpu_us"]) -
                                              sum(out["plain"]["ps_cpu_us"]), 1)
  return out


def _capacity(cluster: _Cluster, n: int, rounds: int = 20, per_run: int = 512) -> Dict[str, Dict]:
  """What ps:0 itself sustains, without the clients: one run carries `per_run` admissions of
  the N workers in turn (the queue's lock, serialized; or the admission words, in parallel) on
  ps:0; admissions per second = per_run / the run's wall time, the median of `rounds` runs."""
  graph = tf.Graph()
  with graph.as_default():
    ops = queue_graph.build(4 * n, n, 0, False, "/job:ps/task:0", elastic=True)
    identity = tf.constant(0, tf.int64)
    runs = {"queue_lock": [], "batch_gate": []}
    with _v1.device("/job:ps/task:0"):
      for w in (i % n for i in range(per_run)):
        runs["queue_lock"].append(execute_unrecorded(
            ops.lock, functools.partial(elastic_graph.admit, ops, w)))
        runs["batch_gate"].append(elastic_graph.gate(ops, w, tf.no_op(), identity))
    fetch = {k: tf.group(*v) for k, v in runs.items()}
    for other in range(n):
      elastic_graph.admission_word(ops, other)
    start = [_v1.global_variables_initializer(), graph.get_collection(graph_keys.RESET_OPS)]
  with _v1.Session(cluster.servers[0].target, graph=graph) as session:
    session.run(start)
    out = {}
    for name, op in fetch.items():
      session.run(op)  # registers the graph
      walls, cpu0 = [], cluster.ps_cpu()[0]
      for _ in range(rounds):
        t = time.perf_counter()
        session.run(op)
        walls.append(time.perf_counter() - t)
      cpu = cluster.ps_cpu()[0] - cpu0
      out[name] = {"admissions_per_sec": round(per_run / statistics.median(walls)),
                   "run_ms": round(1000 * statistics.median(walls), 2),
                   "ps0_cpu_us_per_admission": round(1e6 * cpu / (rounds * per_run), 1)}
  out["ratio"] = round(out["batch_gate"]["admissions_per_sec"] /
                       out["queue_lock"]["admissions_per_sec"], 1)
  return out


def _claims(cluster: _Cluster, n: int, secs: float) -> Dict:
  """N workers claiming back to back (a unit each, forever: the queue has many units)."""
  graph = tf.Graph()
  with graph.as_default():
    ops = queue_graph.build(1024, n, 0, True, "/job:ps/task:0")
    init = _v1.global_variables_initializer()
  sessions = cluster.sessions(graph, n)
  sessions[0].run(init)
  claims = [UnitClaims(ops, w, f"worker:{w}", timeout_secs=120) for w in range(n)]
  state = [[None, 0] for _ in range(n)]  # (unit in hand, batches)

  def claim(w: int, session) -> None:
    unit, batches = state[w]
    epoch = 1 + batches // 10**6
    finished = (unit, 1, 1) if unit is not None and unit >= 0 else None
    got = claims[w].claim(session, epoch, batches, finished).unit
    state[w] = [got if got >= 0 else None, batches + 1]

  result = _hammer(sessions, [lambda s, w=w: claim(w, s) for w in range(n)], secs, cluster)
  for session in sessions:
    session.close()
  return result


def _heartbeats(cluster: _Cluster, n: int, secs: float) -> Dict:
  graph = tf.Graph()
  with graph.as_default():
    var = heartbeat.variables(n)
    row = _v1.placeholder(tf.int64, [5])
    who = _v1.placeholder(tf.int32, [])
    write = _v1.scatter_update(var, tf.reshape(who, [1]), tf.reshape(row, [1, 5])).op
    rows = heartbeat.rows_op(n)
  sessions = cluster.sessions(graph, n)
  sessions[0].run(var.initializer)
  out = {"write": _hammer(sessions, [lambda s, w=w: s.run(write, {row: [1, 0, 0, 0, 0], who: w})
                                     for w in range(n)], secs, cluster)}
  out["read_all_rows"] = _hammer(sessions[:2], [lambda s: s.run(rows)] * 2, secs / 2, cluster)
  for session in sessions:
    session.close()
  return out


def _barriers(cluster: _Cluster, n: int, rounds: int = 12) -> Dict:
  """N workers (the chief among them) arrive; the chief gathers and releases in one run."""
  graphs, barriers = [], []
  for w in range(n):
    graph = tf.Graph()
    with graph.as_default():
      barriers.append(barrier_graph.build(n, w, 1000, "/job:ps/task:0"))
      if w == 0:
        init = _v1.global_variables_initializer()
    graphs.append(graph)
  sessions = [_v1.Session(cluster.servers[w % 2].target, graph=graphs[w]) for w in range(n)]
  sessions[0].run(init)
  released_after: List[float] = []
  cpu = []
  for seq in range(rounds + 1):  # round 0 registers the graphs: not measured
    done, times = threading.Barrier(n), [0.0] * n

    def worker(w: int) -> None:
      ops = barriers[w]
      feed = {ops.seq: seq, ops.stats: [1, 1], ops.times: [0.0, 0.0]}
      if w == 0:
        done.wait()  # every other worker is in its arrival run (or about to be)
        times[0] = time.perf_counter()
        sessions[0].run(ops.gather_and_release, {**feed, ops.new_completed: 0, ops.zero: 0})
      else:
        done.wait()
        sessions[w].run(ops.arrive_and_wait, feed)
      times[w] = max(times[w], time.perf_counter())

    cpu0 = cluster.ps_cpu()[0]
    threads = [threading.Thread(target=worker, args=(w,)) for w in range(n)]
    for t in threads:
      t.start()
    for t in threads:
      t.join(120)
    if seq:
      released_after.append(max(times[1:] or [times[0]]) - times[0])
      cpu.append(cluster.ps_cpu()[0] - cpu0)
  for session in sessions:
    session.close()
  return {"rounds": rounds, **_quantiles(released_after),
          "ps0_cpu_ms_per_barrier": round(1000 * statistics.mean(cpu), 3)}


def _probes(cluster: _Cluster, n: int, cycles: int = 10) -> Dict:
  names = {f"worker:{w}": cluster.worker_addresses[w % 2] for w in range(1, n + 1)}
  monitor = LivenessMonitor(names, "chief:0")
  monitor.dead(list(names))  # the first answers (incarnations)
  cpu0, t0 = time.process_time(), time.perf_counter()
  for _ in range(cycles):
    monitor.dead(list(names))
  cpu, wall = time.process_time() - cpu0, time.perf_counter() - t0
  per_probe = cpu / (cycles * n)
  period = probe_period_secs(n + 1)
  return {"cpu_us_per_probe": round(1e6 * per_probe, 1),
          "cycle_ms": round(1000 * wall / cycles, 2), "period_secs": round(period, 3),
          "chief_cpu_share": round(per_probe * n / period, 4)}


def _plot(rows: List[Dict], path: str) -> None:
  pyplot = common.plt()
  fig, axes = pyplot.subplots(1, 3, figsize=(14, 4))
  ns = [r["workers"] for r in rows]
  if "steps" in rows[0]:
    for name in ("plain", "queue_lock", "batch_gate", "admitted"):
      axes[0].plot(ns, [sum(r["steps"][name]["ps_cpu_us"]) for r in rows], marker="o",
                   label=name)
    axes[0].set(title="ps CPU per step (all ps), µs", xlabel="workers", xscale="log")
    axes[0].legend()
  if "capacity" in rows[0]:
    for name in ("queue_lock", "batch_gate"):
      axes[1].plot(ns, [r["capacity"][name]["admissions_per_sec"] for r in rows], marker="o",
                   label=name)
    axes[1].set(title="admissions/s ps:0 sustains (no client in the way)", xlabel="workers",
                xscale="log", ylim=(0, None))
    axes[1].legend()
  series = [("claim", lambda r: sum(r["claim"]["ps_cpu_us"])),
            ("heartbeat write", lambda r: sum(r["heartbeat"]["write"]["ps_cpu_us"])),
            ("heartbeat read (N rows)", lambda r: sum(r["heartbeat"]["read_all_rows"]["ps_cpu_us"])),
            ("barrier / 10 (ps:0)", lambda r: 100 * r["barrier"]["ps0_cpu_ms_per_barrier"]),
            ("probe (chief)", lambda r: r["probes"]["cpu_us_per_probe"])]
  for label, value in series:
    key = label.split()[0]
    if key in rows[0] or (key == "probe" and "probes" in rows[0]):
      axes[2].plot(ns, [value(r) for r in rows], marker="o", label=label)
  axes[2].set(title="CPU per operation, µs", xlabel="workers", xscale="log", yscale="log")
  axes[2].legend(fontsize=8)
  common.save_plot(fig, path)


def main(argv):
  del argv
  if _REPLOT.value:
    with open(_REPLOT.value) as f:
      _plot(json.load(f)["results"]["runs"], _PLOT.value)
    return
  rows = []
  for n in map(int, _WORKERS.value):
    row = {"workers": n, "load_before": common.load_average()}
    cluster = _Cluster(_PS.value)
    try:
      if "steps" in _PIECES.value:
        row["steps"] = _steps(cluster, n, _SECS.value)
      if "capacity" in _PIECES.value:
        row["capacity"] = _capacity(cluster, n)
      if "claim" in _PIECES.value:
        row["claim"] = _claims(cluster, n, _SECS.value)
      if "heartbeat" in _PIECES.value:
        row["heartbeat"] = _heartbeats(cluster, n, _SECS.value)
      if "barrier" in _PIECES.value:
        row["barrier"] = _barriers(cluster, n)
      if "probes" in _PIECES.value:
        row["probes"] = _probes(cluster, n)
    finally:
      cluster.close()
    row["load_after"] = common.load_average()
    rows.append(row)
    print(row, flush=True)
  common.write_results(_OUTPUT.value, {"runs": rows}, sys.argv, num_ps=_PS.value,
                       secs=_SECS.value)
  if _PLOT.value:
    _plot(rows, _PLOT.value)


if __name__ == "__main__":
  app.run(main)
