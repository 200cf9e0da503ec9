"""One task of the barrier benchmark: a straggler trains while the others wait, epoch by epoch.

Every task runs the full epoch-sync stack (asynchronous SGD, EpochInput, epoch_sync_hooks). The
last worker is the straggler: its shard has --straggler_steps batches, every other shard one.
After the warm-up the epochs cycle through three ways the other N-1 workers wait for it:

  idle:     they sleep --idle_secs (no RPC at all), then pass tf-epochsync's barrier; the
            straggler's steps meanwhile are the reference for its slowdown
  baseline: the source's polling barrier (one int32 counter per worker on ps:0, incremented
            by its worker; every counter read in turn with session.run, 10 ms sleep between
            reads of one that has not arrived); the source literally sleeps 10 s
            (time.sleep(sleep_time_ms) with sleep_time_ms=10), here the intended 10 ms
  ours:     tf-epochsync's EpochBarrierHook (the hook the user gets)

In every epoch the straggler starts training only once the other N-1 finished their batch and
are about to wait (it polls a counter on ps:0 before its first step), so all of its steps run
while they wait. Epochs 0 and 1 warm both barriers up (a fetch's first run registers its graph: slow). Before
epoch 0 every worker, one after the other, times --rtt_reads trivial session.run reads
of a scalar on ps:0. Each task writes <output_dir>/<task>.json with, per epoch, when it
arrived at and left the barrier, its session.run calls and liveness probes (to ps:0 and all)
in between (and the time of each), its idle window, and (the straggler) every step's start and end.

Typical usage (what bench.barrier starts on every task of a LocalCluster):
  python -m bench.barrier_task --repetitions=5 --straggler_steps=150 --output_dir=/tmp/o
"""

import json
import os
import threading
import time
from typing import Dict, List

from absl import app
from absl import flags
import tensorflow as tf

from bench import task_common
from bench.common import generated_batches
from hooks.faults import liveness
from hooks.session import creators as session_lib
from hooks.epoch.barrier import EpochBarrierHook
from hooks.data.epoch_input import EpochInput, EpochListener, EpochStats
from hooks.session.wiring import epoch_sync_hooks

__all__ = ["PollingBarrier", "schedule"]

_REPETITIONS = flags.DEFINE_integer("repetitions", 5, "Epochs of each variant.")
_STRAGGLER_STEPS = flags.DEFINE_integer("straggler_steps", 300, "The straggler's batches.")
_IDLE_SECS = flags.DEFINE_float("idle_secs", 4.0, "How long the others sleep in idle epochs.")
_POLL_MS = flags.DEFINE_float("poll_ms", 10.0, "The polling barrier's sleep between reads.")
_RTT_READS = flags.DEFINE_integer("rtt_reads", 40, "Trivial reads per worker for the RTT.")
_OUTPUT_DIR = flags.DEFINE_string("output_dir", None, "Where each task writes its record.")

_v1 = tf.compat.v1
_WIDTH, _HIDDEN, _BATCH = 256, 512, 32
_VARIANTS = ("idle", "baseline", "ours")


def schedule(repetitions: int) -> List[str]:
  """The barrier of each epoch: two warm-ups (each barrier's runs once), then idle, baseline,
  ours, idle, baseline, ..."""
  return ["warmup-baseline", "warmup-ours"] + list(_VARIANTS) * repetitions


class PollingBarrier:
  """The source's barrier: one counter per worker on ps:0, polled with session.run + sleep.

    barrier = PollingBarrier(num_workers=4, sleep_secs=0.01)
    barrier.wait(session, worker_id=1, target=1)   # the k-th use waits for counters >= k

  Faithful to the blog's Barrier.barrier(): walk the counters in order; at its own, increment
  it (assign_add, use_locking=True); read each with session.run and, while it is below the
  target, sleep and read it again. (The source compares with `epoch`, starting at 0, so its
  first barrier never waits; here the k-th use waits for k, which is what the text says.)
  """

  def __init__(self, num_workers: int, sleep_secs: float):
    self.num_workers, self.sleep_secs = num_workers, sleep_secs
    with _v1.device("/job:ps/task:0"), tf.name_scope("polling_barrier"):
      self.counters = [_v1.get_variable(f"counter-1_{j}", (), tf.int32,
                                        initializer=_v1.zeros_initializer())
                       for j in range(num_workers)]
      self.adds = [c.assign_add(1, use_locking=True) for c in self.counters]
      self.reads = [c.read_value() for c in self.counters]

  def wait(self, session, worker_id: int, target: int, deadline_secs: float = 600.0) -> None:
    deadline = time.monotonic() + deadline_secs
    for task_index in range(self.num_workers):
      if task_index == worker_id:
        session.run(self.adds[worker_id])
      count = session.run(self.reads[task_index])
      while count < target:
        if time.monotonic() > deadline:
          raise TimeoutError(f"polling barrier: worker {task_index} missing after "
                             f"{deadline_secs} s")
        time.sleep(self.sleep_secs)
        count = session.run(self.reads[task_index])


class _Counters:
  """Counts the barriers' session.run calls (through `session()`) and this process's liveness
  probes (to ps:0 and to anyone)."""

  def __init__(self, ps0_address: str):
    self.runs = self.probes = self.ps0_probes = 0
    self.times: Dict[str, List[float]] = {"runs": [], "probes": [], "ps0_probes": [],
                                          "run_ends": []}
    self._lock = threading.Lock()
    counters = self
    probe = liveness._GrpcProbe.probe  # pylint: disable=protected-access

    def counted_probe(prober, address, timeout):
      with counters._lock:
        counters.probes += 1
        counters.times["probes"].append(time.time())
        if address == ps0_address:
          counters.ps0_probes += 1
          counters.times["ps0_probes"].append(time.time())
      return probe(prober, address, timeout)

    liveness._GrpcProbe.probe = counted_probe  # pylint: disable=protected-access

  def session(self, session) -> "_CountingSession":
    return _CountingSession(session, self)

  def count_run(self) -> None:
    with self._lock:
      self.runs += 1
      self.times["runs"].append(time.time())

  def snapshot(self) -> Dict[str, int]:
    with self._lock:
      return {"runs": self.runs, "probes": self.probes, "ps0_probes": self.ps0_probes}


class _CountingSession:
  """`session`, whose run() calls are counted (BackgroundRun's threads included)."""

  def __init__(self, session, counters: _Counters):
    self._session, self._counters = session, counters

  def __getattr__(self, name):
    return getattr(self._session, name)

  def run(self, *args, **kwargs):
    self._counters.count_run()
    try:
      return self._session.run(*args, **kwargs)
    finally:
      self._counters.times["run_ends"].append(time.time())



class _Switch(EpochListener):
  """Takes EpochBarrierHook's place among the listeners and picks each epoch's barrier."""
  order = 20

  def __init__(self, barrier: EpochBarrierHook, polling: PollingBarrier, ps_read, ready,
               worker_id: int, straggler: bool, counters: _Counters):
    self._barrier, self._polling, self._ps_read = barrier, polling, ps_read
    self._ready_add, self._ready_read = ready
    self._worker_id, self._straggler, self._counters = worker_id, straggler, counters
    self._schedule = schedule(_REPETITIONS.value)
    self._polls = 0
    self._trained_from = 0.0
    self.epochs: List[dict] = []
    self.rtt_secs: List[float] = []

  def start_epoch(self, session):
    return self._barrier.start_epoch(session)

  def session_created(self, session, start_epoch: int) -> None:
    self._barrier.session_created(session, start_epoch)  # the real start barrier
    time.sleep(0.3 * self._worker_id)  # one worker at a time
    for _ in range(_RTT_READS.value):
      start = time.perf_counter()
      session.run(self._ps_read)
      self.rtt_secs.append(time.perf_counter() - start)
    time.sleep(0.3 * (self._polling.num_workers - self._worker_id))

  def epoch_started(self, session, epoch: int) -> None:
    """The straggler trains only once the others are waiting (or asleep): polls "ready"."""
    if not self._straggler:
      return
    deadline, others = time.monotonic() + 120, self._polling.num_workers - 1
    while session.run(self._ready_read) < others * (epoch + 1):
      if time.monotonic() > deadline:
        raise TimeoutError(f"the other workers did not finish epoch {epoch} within 120 s")
      time.sleep(0.02)
    self._trained_from = time.time()

  def epoch_ended(self, session, stats: EpochStats) -> None:
    variant = self._schedule[stats.epoch]
    record = {"epoch": stats.epoch, "variant": variant, "trained_from": self._trained_from}
    if not self._straggler:
      session.run(self._ready_add)  # Before waiting: the straggler may start its epoch.
    if variant == "idle" and not self._straggler:
      record["idle"] = [time.time()]
      time.sleep(_IDLE_SECS.value)
      record["idle"].append(time.time())
    before = self._counters.snapshot()
    record["arrived"] = time.time()
    session = self._counters.session(session)
    if variant.endswith("baseline"):
      self._polls += 1
      self._polling.wait(session, self._worker_id, self._polls)
    else:
      self._barrier.epoch_ended(session, stats)
    record["released"] = time.time()
    after = self._counters.snapshot()
    record.update({k: after[k] - before[k] for k in after})
    self.epochs.append(record)


def main(argv):
  del argv
  config, settings, server = task_common.start_task()
  counters = _Counters(config.cluster["ps"][0])
  n, me = config.num_workers, config.worker_id
  straggler = me == n - 1
  num_epochs = len(schedule(_REPETITIONS.value))
  with _v1.device(_v1.train.replica_device_setter(
      worker_device=config.job_device, cluster=config.cluster_spec())):
    global_step = _v1.train.get_or_create_global_step()
    epoch_input = EpochInput(
        generated_batches(_STRAGGLER_STEPS.value if straggler else 1, _BATCH, _WIDTH, me),
        num_epochs, config.task_name)
    x, y = epoch_input.get_next()
    h = _v1.layers.dense(x, _HIDDEN, activation=tf.nn.relu, name="hidden")
    loss = tf.reduce_mean(tf.square(_v1.layers.dense(h, _WIDTH, name="out") - y))
    train_op = _v1.train.GradientDescentOptimizer(0.01).minimize(loss, global_step=global_step)
    polling = PollingBarrier(n, _POLL_MS.value / 1000)
    with _v1.device("/job:ps/task:0"):
      ps_read = tf.identity(global_step)
      ready = _v1.get_variable("bench_ready", (), tf.int64, initializer=_v1.zeros_initializer(),
                               trainable=False)
      ready = (ready.assign_add(1, use_locking=True), ready.read_value())
  hooks = epoch_sync_hooks(config, epoch_input, settings)
  barrier = next(h for h in hooks if isinstance(h, EpochBarrierHook))
  epoch_input._listeners.remove(barrier)  # pylint: disable=protected-access; bench only
  switch = _Switch(barrier, polling, ps_read, ready, me, straggler, counters)
  epoch_input.add_listener(switch)
  steps = task_common.StepTimes()
  creator = session_lib.session_creator(config, master=server.target)
  with _v1.train.MonitoredSession(session_creator=creator, hooks=[steps] + hooks) as sess:
    while not sess.should_stop():
      sess.run(train_op)
  path = os.path.join(_OUTPUT_DIR.value, config.task_name.replace(":", "-") + ".json")
  with open(path, "w") as f:
    json.dump({"task": config.task_name, "straggler": straggler, "epochs": switch.epochs,
               "call_times": counters.times,
               "rtt_secs": switch.rtt_secs, "steps": steps.steps}, f)


if __name__ == "__main__":
  app.run(main)
