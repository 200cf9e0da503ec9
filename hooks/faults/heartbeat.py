"""Each training task's heartbeat on ps:0, so that waits are bounded by progress, not elapsed time.

Every task writes its row of `epochsync/heartbeat` once a second from a thread of its own (one
tiny run; nothing is added to the step): a beat count, its epoch and batch, what it is doing
(training, or `busy("saving")` / "restoring" / "evaluating" around the chief's checkpoint work)
and how long ago its batch last moved. A waiting task reads the rows of the tasks it waits for
(`ProgressWatch`) and restarts its no-progress clock whenever one of them moves: a new batch, or
a new beat while it saves, restores or evaluates. A stopped or stuck task stops moving; a dead
one is found by `hooks.liveness` within seconds.

Typical usage:
  beat = Heartbeat(epoch_input, num_workers=2, worker_id=1)   # begin(): beat.build()
  beat.start(session)                                          # after_create_session
  with busy("saving"): saver.save(session, path)               # the chief, around a save
  watch = ProgressWatch(beat.reader(session), worker_names)
  stalled_secs = watch.observe([1])                            # each poll of a wait
"""

import atexit
import contextlib
import threading
import time
import weakref
from typing import Callable, Dict, Iterator, List, Optional, Sequence

import numpy as np
import tensorflow as tf

from hooks import graph_keys
from hooks import log as logging
from hooks.faults.waiting import run_options

__all__ = ["Heartbeat", "ProgressWatch", "busy", "variables", "rows_op", "session_reader",
           "remote_reader", "BEAT_SECS"]

_v1 = tf.compat.v1
BEAT_SECS = 1.0  # How often each task writes its row.
_RUN_SECS = 2.0  # Bound of one write or read (a ps that is slower is busy, the next beat retries).
BEAT, EPOCH, BATCHES, ACTIVITY, STEP_AGE_MS = range(5)
ACTIVITIES = ("training", "saving", "restoring", "evaluating")
_active: Dict[str, int] = {}  # This process's busy() activities (saves run in several threads).
_lock = threading.Lock()
_graphs: "weakref.WeakKeyDictionary[tf.Graph, tf.Variable]" = weakref.WeakKeyDictionary()
# Writers still beating: stopped at exit, so no daemon thread is inside a TensorFlow run when
# the interpreter ends (that aborts the process: "FATAL: exception not rethrown").
_running: "weakref.WeakSet[Heartbeat]" = weakref.WeakSet()


@atexit.register
def _stop_all() -> None:
  for beat in list(_running):
    beat.stop()


@contextlib.contextmanager
def busy(activity: str) -> Iterator[None]:
  """Marks this process as `activity` ("saving", "restoring", "evaluating") while inside."""
  if activity not in ACTIVITIES[1:]:
    raise ValueError(f"busy({activity!r}): use one of {ACTIVITIES[1:]}")
  with _lock:
    _active[activity] = _active.get(activity, 0) + 1
  try:
    yield
  finally:
    with _lock:
      _active[activity] -= 1


def _activity() -> int:
  with _lock:
    return next((i for i, a in enumerate(ACTIVITIES) if _active.get(a)), 0)


def variables(num_workers: int, ps_device: str = "/job:ps/task:0") -> tf.Variable:
  """The graph's `epochsync/heartbeat` [num_workers, 5] on `ps_device` (built once per graph).

  In no collection: never saved or restored. The chief clears it at the start of each run
  (`graph_keys.RESET_OPS`, or `Heartbeat.start` without a RunStartHook); readers see zeros
  until it exists.
  """
  graph = _v1.get_default_graph()
  if graph not in _graphs:
    # An absolute name: a reader in another graph (the evaluator's) finds it on the ps.
    with _v1.device(ps_device), _v1.name_scope("epochsync/"):
      _graphs[graph] = _v1.Variable(tf.zeros([num_workers, 5], tf.int64), trainable=False,
                                    collections=[], use_resource=False, name="heartbeat")
    _v1.add_to_collection(graph_keys.RESET_OPS, _graphs[graph].initializer)
  return _graphs[graph]


def rows_op(num_workers: int, ps_device: str = "/job:ps/task:0") -> tf.Tensor:
  """A read of every task's row ([num_workers, 5]); zeros while the variable does not exist."""
  var = variables(num_workers, ps_device)
  with _v1.device(var.device), tf.name_scope("epochsync_heartbeat"):
    return tf.cond(_v1.is_variable_initialized(var), var.read_value,
                   lambda: tf.zeros([num_workers, 5], tf.int64))


def session_reader(session, rows: tf.Tensor) -> Callable[[], Optional[np.ndarray]]:
  """fn() -> `rows` (`rows_op`) read on `session` within 2 s, or None if the ps did not answer."""
  def read() -> Optional[np.ndarray]:
    try:
      return session.run(rows, options=run_options(_RUN_SECS))
    except tf.errors.OpError:
      return None
  return read


def remote_reader(ps_target: str, num_workers: int, ps_device: str = "/job:ps/task:0"
                  ) -> Callable[[], Optional[np.ndarray]]:
  """fn() -> every task's row, read over a session of its own to the ps at `ps_target`
  (`grpc://host:port`), for a task outside the training session (the evaluator, a worker
  waiting for the chief); None when the ps does not answer within 2 s. Each run goes on in a
  daemon thread (the first creates the session, an RPC no deadline bounds), read() waits for
  it at most 2 s, and while one is in flight no other starts.
  """
  graph = tf.Graph()
  with graph.as_default():
    rows = rows_op(num_workers, ps_device)
  session = _v1.Session(ps_target, graph=graph,
                        config=_v1.ConfigProto(device_filters=[ps_device]))
  in_flight: List[Dict[str, object]] = []

  def run(box: Dict[str, object]) -> None:
    try:
      box["rows"] = session.run(rows, options=run_options(_RUN_SECS))
    except tf.errors.OpError:
      box["rows"] = None
    finally:
      box["done"].set()  # type: ignore[attr-defined]

  def read() -> Optional[np.ndarray]:
    if not in_flight:
      box: Dict[str, object] = {"done": threading.Event()}
      threading.Thread(target=run, args=(box,), daemon=True,
                       name="epochsync-heartbeat-read").start()
      in_flight.append(box)
    if not in_flight[0]["done"].wait(_RUN_SECS):  # type: ignore[attr-defined]
      return None
    return in_flight.pop()["rows"]  # type: ignore[return-value]
  return read


class Heartbeat:
  """This task's writer of its heartbeat row, and the reader of every task's rows.

    beat = Heartbeat(epoch_input, num_workers=2, worker_id=1)
    beat.build()             # in begin()
    beat.start(session)      # in after_create_session; beat.stop() in end()

  Args:
    epoch_input: the task's `EpochInput` (its `hook.epoch` and `hook.batches` are the progress).
    num_workers, worker_id: the training tasks and this task's index among them (0: chief).
    ps_device: where the rows live.
    beat_secs: `float`, the period of the writes.
  """

  def __init__(self, epoch_input, num_workers: int, worker_id: int,
               ps_device: str = "/job:ps/task:0", beat_secs: float = BEAT_SECS):
    self._input, self._n, self._id = epoch_input, num_workers, worker_id
    self._ps, self._beat_secs = ps_device, beat_secs
    self._stop = threading.Event()
    self._thread: Optional[threading.Thread] = None

  def build(self) -> None:
    var = variables(self._n, self._ps)
    with _v1.device(var.device), tf.name_scope("epochsync_heartbeat"):
      self._row = _v1.placeholder(tf.int64, [5], "row")
      self._write = _v1.scatter_update(var, [self._id], [self._row]).op
      self._init = var.initializer
      self._initialized = _v1.is_variable_initialized(var)
    self._read = rows_op(self._n, self._ps)

  def start(self, session) -> None:
    """Starts the writer thread (the chief first clears every row)."""
    self.stop()
    if self._id == 0 and not session.run(self._initialized, options=run_options(60.0)):
      session.run(self._init, options=run_options(60.0))
    self._stop.clear()
    self._thread = threading.Thread(target=self._beat, args=(session,), daemon=True,
                                    name="epochsync-heartbeat")
    self._thread.start()
    _running.add(self)

  def stop(self) -> None:
    """Stops the writer (after one last write of this task's row); a no-op when stopped."""
    self._stop.set()
    _running.discard(self)
    if self._thread is not None:
      self._thread.join(2 * _RUN_SECS)
      self._thread = None

  def reader(self, session) -> Callable[[], Optional[np.ndarray]]:
    """fn() -> every task's row ([num_workers, 5]), or None if the ps did not answer."""
    return session_reader(session, self._read)

  def _beat(self, session) -> None:
    """Writes this task's row every beat, and once more when stopped (its last position)."""
    beat, last, moved_at = 0, None, time.monotonic()
    initialized = False  # Never write the variable before it exists.
    while True:
      driver = self._input.hook
      now, position = time.monotonic(), (driver.epoch, driver.batches)
      if position != last:
        last, moved_at = position, now
      beat += 1
      row = [beat, max(position[0], 0), position[1], _activity(), int((now - moved_at) * 1000)]
      try:
        if not initialized:
          initialized = bool(session.run(self._initialized, options=run_options(_RUN_SECS)))
        if initialized:
          session.run(self._write, {self._row: row}, options=run_options(_RUN_SECS))
      except Exception as e:  # pylint: disable=broad-except; the session is closing or failed
        logging.debug("heartbeat of task %d not written: %s", self._id, e)
        if getattr(session, "_closed", False):
          return
      if self._stop.is_set():
        return
      self._stop.wait(self._beat_secs)  # Set: one more write, then return.


class ProgressWatch:
  """Tells how long the tasks a wait depends on have made no progress, and how far they are.

    watch = ProgressWatch(beat.reader(session), ["chief:0", "worker:1"])
    stalled = watch.observe([1])    # seconds since worker:1 last moved (or the watch started)
    watch.describe([1])             # "worker:1 epoch 0 batch 1200, 40.0 batches/s"

  Args:
    read: fn() -> the rows ([num_workers, 5]) or None (`Heartbeat.reader`).
    names: task names by worker id.
    clock: `Callable[[], float]`, monotonic seconds.
  """

  def __init__(self, read: Callable[[], Optional[np.ndarray]], names: Sequence[str],
               clock: Callable[[], float] = time.monotonic):
    self._read, self._names, self._clock = read, list(names), clock
    self._start = self._moved_at = clock()
    self._rows: Optional[np.ndarray] = read()
    self._first = None if self._rows is None else self._rows.copy()
    self._beat_seen_at = [self._start] * len(self._names)

  @property
  def moved_at(self) -> float:
    """When (on `clock`) an awaited task last moved, or the watch started."""
    return self._moved_at

  def observe(self, awaited: Sequence[int]) -> float:
    """Reads the rows; returns the seconds since one of `awaited` last moved (or since start)."""
    rows, now = self._read(), self._clock()
    if rows is not None:
      old = self._rows if self._rows is not None else rows
      for i in range(len(self._names)):
        if rows[i][BEAT] != old[i][BEAT]:
          self._beat_seen_at[i] = now
        if i in awaited and _moved(old[i], rows[i]):
          self._moved_at = now
      if self._first is None:
        self._first = rows.copy()
      self._rows = rows
    return now - self._moved_at

  def describe(self, awaited: Sequence[int]) -> str:
    """How far each awaited task is: its batch and rate, or what it is busy with."""
    if self._rows is None:
      return "their progress is unknown (the ps did not answer)"
    return "; ".join(self._describe(i) for i in awaited)

  def _describe(self, i: int) -> str:
    row, name = self._rows[i], self._names[i]
    if not row[BEAT]:
      return f"{name} has not started"
    if row[ACTIVITY]:
      return f"{name} {ACTIVITIES[row[ACTIVITY]]} (epoch {row[EPOCH]} batch {row[BATCHES]})"
    first, secs = self._first[i], self._clock() - self._start
    rate = ((row[BATCHES] - first[BATCHES]) / secs
            if secs > 0 and first[EPOCH] == row[EPOCH] else 0.0)
    return f"{name} epoch {row[EPOCH]} batch {row[BATCHES]}, {rate:.1f} batches/s"

  def stuck(self, names: Sequence[str]) -> List[str]:
    """Of `names`, each with how long since its last step: "worker:1 (no step for 17 s, ...)"."""
    out = []
    for name in names:
      i = self._names.index(name)
      row = None if self._rows is None else self._rows[i]
      if row is None or not row[BEAT]:
        out.append(f"{name} (not started: no heartbeat)")
        continue
      age = row[STEP_AGE_MS] / 1000 + self._clock() - self._beat_seen_at[i]
      state = ACTIVITIES[row[ACTIVITY]]
      out.append(f"{name} (no step for {age:.0f} s, at batch {row[BATCHES]} of epoch "
                 f"{row[EPOCH]}, {state})")
    return out


def _moved(old: np.ndarray, new: np.ndarray) -> bool:
  """A new batch (or epoch), or a new beat while saving, restoring or evaluating."""
  if (old[EPOCH], old[BATCHES]) != (new[EPOCH], new[BATCHES]):
    return bool(new[BEAT])
  return bool(new[ACTIVITY]) and old[BEAT] != new[BEAT]
