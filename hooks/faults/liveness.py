"""Tells, within about a second, whether the tasks a wait depends on are still alive.

Every task's gRPC server answers TensorFlow's `WorkerService.GetStatus` with its devices
and their incarnation, a random number fixed for the life of the process. A task whose
server refuses or drops the connection (UNAVAILABLE) after it had answered once has died; one
that answers with another incarnation has restarted and lost its state (a ps its variables).
One probe is one tiny RPC (~0.2 ms) to that task, independent of the sessions' device
filters. Waits probe only the tasks they wait for, once per `period_secs`, and only after
waiting that long, so a normal step or barrier costs nothing.

Typical usage:
  monitor = monitor_for(config)                   # one per process and cluster
  monitor.wait_until_up(config.ps_names, deadline=time.monotonic() + 600, where="at start")
  monitor.check(["chief:0", "ps:1"], where='at barrier "epoch_end" in epoch 2')
"""

import dataclasses
import functools
import os
import threading
import time
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from hooks import log as logging
from hooks.errors import EpochSyncError, StartupTimeoutError, TaskDiedError

__all__ = ["LivenessMonitor", "Probe", "monitor_for", "explain_lost_session", "PERIOD_SECS"]

PERIOD_SECS = 1.0  # How often a waiting task probes the tasks it waits for.
_PROBE_TIMEOUT_SECS = 2.0  # A task that answers slower is busy, not dead.
_GET_STATUS = "/tensorflow.WorkerService/GetStatus"
# gRPC waits 1 s (growing to 120 s) before it reconnects a channel whose connection failed, and
# fails every call meanwhile: a task that comes up 10 ms after a failed probe would be seen up
# to a second late, at start-up, by every waiting task. Here 50 ms, at most 100 ms (gRPC only
# reconnects when a call is made: a dead task costs one connection attempt per probe).
_UP_POLL_SECS = 0.05  # wait_until_up's re-probe period (a refused connection fails at once).
_CHANNEL_OPTIONS = [("grpc.initial_reconnect_backoff_ms", 50),
                    ("grpc.min_reconnect_backoff_ms", 50),
                    ("grpc.max_reconnect_backoff_ms", 100)]
_UP, _DOWN, _BUSY = "up", "down", "busy"


@dataclasses.dataclass(frozen=True)
class Probe:
  """One answer: `state` is "up" (with the incarnation), "down" or "busy" (no answer in time)."""
  state: str
  incarnation: Optional[int] = None
  detail: str = ""


class LivenessMonitor:
  """Probes tasks by name and remembers the incarnation each one first answered with.

    monitor = LivenessMonitor({"ps:0": "h0:2222", "worker:1": "h1:2222"}, "worker:0")
    monitor.check(["ps:0", "worker:1"], where="at step 12 in epoch 0")   # or TaskDiedError

  Args:
    addresses: task name ("ps:0", "chief:0", "worker:3") -> "host:port".
    task_name: this task, for messages.
    period_secs: `float`, `check()` probes at most this often (per set of names).
    probe: `Callable[[str, float], Probe]`, (address, timeout) -> Probe; tests inject one.
    clock: `Callable[[], float]`, monotonic seconds.
  """

  def __init__(self, addresses: Mapping[str, str], task_name: str,
               period_secs: float = PERIOD_SECS,
               probe: Optional[Callable[[str, float], Probe]] = None,
               clock: Callable[[], float] = time.monotonic):
    self.addresses = dict(addresses)
    self.given = frozenset(self.addresses)  # the tasks the cluster gave an address (not learnt)
    self.task_name = task_name
    self.period_secs = period_secs
    self._probe = probe or _GrpcProbe().probe
    self._clock = clock
    self._lock = threading.Lock()
    self._incarnations: Dict[str, int] = {}
    self._busy_since: Dict[str, float] = {}  # name -> when its probes stopped being answered
    self._last_check: Dict[Tuple[str, ...], float] = {}
    # Tasks whose death is no error here (elastic training: the other workers, whose loss the
    # chief handles); check() and raise_if_any_died() pass over them, dead() does not.
    self.expendable: frozenset = frozenset()

  def probe(self, names: Sequence[str]) -> Dict[str, Probe]:
    """Probes each task once now; records the incarnation of the first answer of each."""
    answers = {name: self._probe(self.addresses[name], _PROBE_TIMEOUT_SECS) for name in names}
    with self._lock:
      for name, answer in answers.items():
        if answer.state == _UP:
          self._incarnations.setdefault(name, answer.incarnation)
    return answers

  def dead(self, names: Sequence[str], known_up: Sequence[str] = (),
           stalled_after_secs: Optional[float] = None) -> List[Tuple[str, str]]:
    """(name, why) of each task that answered before and now is gone or restarted, or (with
    `stalled_after_secs`) has answered no probe for that long: frozen or cut off.

    A task in `known_up` (e.g. one a session already reached) that is down counts as dead
    even if this process never saw its first answer.
    """
    out = []
    for name, answer in self.probe(names).items():
      first = self._incarnations.get(name)
      silent = self._silent_for(name, answer.state == _BUSY)
      if (stalled_after_secs is not None and silent >= stalled_after_secs
          and first is not None):
        out.append((name, f"it has answered no probe for {silent:.0f} s: the process is frozen "
                          "(SIGSTOP, a long pause) or cut off from this task"))
      elif answer.state == _DOWN and (first is not None or name in known_up):
        out.append((name, f"its server at {self.addresses[name]} is gone: {answer.detail}"))
      elif answer.state == _UP and answer.incarnation != first:
        out.append((name, f"it restarted (a new process answers at {self.addresses[name]}; "
                          "the old one's state is lost)"))
    return out

  def _silent_for(self, name: str, busy: bool) -> float:
    """Seconds since `name`'s first unanswered probe of the current run of them (0: answered)."""
    with self._lock:
      if not busy:
        self._busy_since.pop(name, None)
        return 0.0
      return self._clock() - self._busy_since.setdefault(name, self._clock())

  def forget(self, name: str) -> None:
    """Forgets `name`'s incarnation: its next answer is its first (elastic: a rejoined worker's
    new process)."""
    with self._lock:
      self._incarnations.pop(name, None)
      self._busy_since.pop(name, None)

  def learn_address(self, name: str, address: str) -> None:
    """Probes `name` at `address` from now on (a worker beyond the launch's cluster, which gave
    it none); `forget`s it. The mapping is replaced, not changed: a reader iterating it is safe."""
    self.forget(name)
    with self._lock:
      self.addresses = {**self.addresses, name: address}

  def never_answered(self, names: Sequence[str]) -> List[str]:
    """The tasks among `names` that no probe of this process has found up yet."""
    with self._lock:
      return [name for name in names if name not in self._incarnations]

  def check(self, names: Sequence[str], where: str, force: bool = False) -> None:
    """Raises TaskDiedError if one of `names` died; probes at most once per period.

    Args:
      names: the tasks this task waits for.
      where: where it waits, for the message (e.g. 'at barrier "epoch_end" in epoch 2').
      force: probe now even if the last check of these names was less than a period ago.
    """
    names = [n for n in names if n not in self.expendable]
    key, now = tuple(names), self._clock()
    with self._lock:
      if not force and now - self._last_check.get(key, -float("inf")) < self.period_secs:
        return
      self._last_check[key] = now
    self._raise_first(self.dead(names), where)

  def _raise_first(self, dead: List[Tuple[str, str]], where: str) -> None:
    """Raises TaskDiedError for the root cause among `dead`: a ps first (its death makes the
    others exit), naming the other dead tasks too."""
    if not dead:
      return
    dead = sorted(dead, key=lambda d: not d[0].startswith("ps:"))
    (name, why), others = dead[0], [n for n, _ in dead[1:]]
    raise self.died(name, why + (f" (also gone: {', '.join(others)})" if others else ""), where)

  def died(self, name: str, why: str, where: str) -> TaskDiedError:
    """The TaskDiedError (logged) for task `name`, gone for reason `why`."""
    error = TaskDiedError(
        f"{name} died while {self.task_name} waited for it {where}: {why}. Restart the whole "
        "job (every task) from the same model_dir: it resumes from its newest checkpoint",
        name, where)
    logging.error("%s", error)
    return error

  def wait_until_up(self, names: Sequence[str], deadline: float, where: str,
                    flag: str = "--epochsync_startup_timeout_secs") -> Dict[str, Probe]:
    """Blocks until every task in `names` answered once; StartupTimeoutError at the deadline.

    Returns each task's first answer that found it up (its incarnation included).
    """
    pending, up = list(names), {}
    while pending:
      answers = self.probe(pending)
      up.update((n, a) for n, a in answers.items() if a.state == _UP)
      pending = [n for n in pending if n not in up]
      if not pending:
        return up
      if self._clock() >= deadline:
        details = "; ".join(f"{n} at {self.addresses[n]}: {answers[n].detail}" for n in pending)
        error = StartupTimeoutError(
            f"{self.task_name} gave up {where}: {', '.join(pending)} never came up ({details}); "
            f"start them, check the addresses in TF_CONFIG, or raise {flag}", pending)
        logging.error("%s", error)
        raise error
      logging.log_every_n_seconds(logging.INFO, "%s waiting %s for %s to come up", 10,
                                  self.task_name, where, ", ".join(pending))
      time.sleep(min(_UP_POLL_SECS, max(0.0, deadline - self._clock())))

  def raise_if_any_died(self, where: str) -> None:
    """Probes every task of the cluster now; raises TaskDiedError if one is gone (a ps first)."""
    self._raise_first(self.dead(sorted(set(self.addresses) - self.expendable)), where)


def explain_lost_session(error: Exception, monitor: Optional[LivenessMonitor], task_name: str,
                         where: str) -> Exception:
  """The error to raise instead of TensorFlow's UNAVAILABLE/ABORTED `error` from our own run.

  MonitoredSession answers those two by re-creating the session, which cannot resume an
  epoch-synchronized job on one task alone. So they become a TaskDiedError naming the task
  that died (if a probe finds it) or an EpochSyncError, neither of which it retries.
  """
  if monitor is not None:
    try:
      monitor.raise_if_any_died(where)
    except TaskDiedError as died:
      return died
  return EpochSyncError(
      f"{task_name} lost its session {where}: {type(error).__name__}: "
      f"{getattr(error, 'message', error)}. A task or the network failed; restart the whole job "
      "(every task) from the same model_dir: it resumes from its newest checkpoint")


class _GrpcProbe:
  """WorkerService.GetStatus over one cached insecure channel per address."""

  def __init__(self):
    self._calls: Dict[str, Callable] = {}
    self._lock = threading.Lock()

  def probe(self, address: str, timeout: float) -> Probe:
    import grpc  # pylint: disable=g-import-not-at-top; TensorFlow's own dependency
    with self._lock:
      if address not in self._calls:
        channel = grpc.insecure_channel(address, options=_CHANNEL_OPTIONS)
        self._calls[address] = channel.unary_unary(_GET_STATUS)
      call = self._calls[address]
    try:
      return Probe(_UP, _incarnation(call(b"", timeout=timeout)))
    except grpc.RpcError as e:
      state = _BUSY if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED else _DOWN
      return Probe(state, None, f"{e.code().name}: {e.details()}")


def _incarnation(response: bytes) -> int:
  """The first device's incarnation in a serialized GetStatusResponse."""
  from tensorflow.core.framework import device_attributes_pb2  # pylint: disable=g-import-not-at-top
  fields = _length_delimited_fields(response)
  if not fields:
    return 0
  return device_attributes_pb2.DeviceAttributes.FromString(fields[0]).incarnation


def _length_delimited_fields(buf: bytes) -> List[bytes]:
  """The length-delimited fields of a protobuf message (GetStatusResponse has only those)."""
  out, i = [], 0
  while i < len(buf):
    key, i = _varint(buf, i)
    if key & 7 != 2:
      raise ValueError(f"unexpected protobuf wire type {key & 7} in GetStatusResponse")
    length, i = _varint(buf, i)
    out.append(buf[i:i + length])
    i += length
  return out


def _varint(buf: bytes, i: int) -> Tuple[int, int]:
  value, shift = 0, 0
  for shift in range(0, 64, 7):
    byte = buf[i]
    i += 1
    value |= (byte & 0x7F) << shift
    if not byte & 0x80:
      return value, i
  raise ValueError("malformed varint in GetStatusResponse")


@functools.lru_cache(maxsize=None)
def _cached_monitor(task_name: str, addresses: Tuple[Tuple[str, str], ...]) -> LivenessMonitor:
  return LivenessMonitor(dict(addresses), task_name)


def monitor_for(config) -> LivenessMonitor:
  """This process's LivenessMonitor of `config`'s cluster (the same object on every call).

  The evaluator is left out: training never waits for it. It also sets GRPC_FAIL_FAST=true
  (unless the environment sets it): TensorFlow's default lets some RPCs to a dead task wait
  for it forever (e.g. closing a session that has a graph on a dead ps), so a job whose task
  died would hang in `close()` after naming the dead task.
  """
  os.environ.setdefault("GRPC_FAIL_FAST", "true")
  addresses = tuple((f"{job}:{i}", addr) for job, addrs in sorted(config.cluster.items())
                    if job != "evaluator" for i, addr in enumerate(addrs))
  return _cached_monitor(config.task_name, addresses)
