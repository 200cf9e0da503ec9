"""The chief's heartbeat while it creates its session and restores a checkpoint.

The training heartbeat (`hooks.faults.heartbeat.Heartbeat`) starts once a session exists. A
chief restoring a large checkpoint (a big embedding on a slow filesystem) spends that time
inside session creation, while the workers wait for its initialisation and then for it to
start the run: without a beat, a restore longer than `--epochsync_startup_timeout_secs` would
look like a stuck chief. So the chief's session creator writes its row of `epochsync/heartbeat`
on ps:0 as "restoring" once a second, over a session of its own (the training graph is not
built into a session yet), and the workers' start-up waits count time without that progress.

Typical usage:
  with restoring_beat(ps_target="grpc://ps0:2222", num_workers=3):   # the chief
    session = creator_that_restores()
  watch = start_up_watch(ps_target, worker_names)                       # a waiting worker
  stalled_secs = watch.observe([0])
"""

import contextlib
import threading
from typing import Iterator, Optional, Sequence

import tensorflow as tf

from hooks import log as logging
from hooks.faults import heartbeat
from hooks.faults.waiting import run_options

__all__ = ["restoring_beat", "start_up_watch"]

_v1 = tf.compat.v1
_RUN_SECS = 2.0  # Bound of one write (a busy ps skips a beat, the next one retries).
_RESTORING = heartbeat.ACTIVITIES.index("restoring")


@contextlib.contextmanager
def restoring_beat(ps_target: Optional[str], num_workers: int, worker_id: int = 0,
                   ps_device: str = "/job:ps/task:0") -> Iterator[None]:
  """Writes row `worker_id` as "restoring" every beat while inside; a no-op without a target.

  The session to the ps is created in the writer thread: it waits for a ps that is not up yet,
  an RPC no deadline bounds, so the thread is a daemon and the exit does not wait for it.
  """
  if not ps_target:
    yield
    return
  stop = threading.Event()
  thread = threading.Thread(target=_beat, args=(stop, ps_target, num_workers, worker_id,
                                                ps_device),
                            daemon=True, name="epochsync-restoring-beat")
  thread.start()
  try:
    yield
  finally:
    stop.set()
    thread.join(2 * _RUN_SECS)


def _beat(stop: threading.Event, ps_target: str, num_workers: int, worker_id: int,
          ps_device: str) -> None:
  graph = tf.Graph()
  with graph.as_default():
    var = heartbeat.variables(num_workers, ps_device)
    with _v1.device(var.device):
      row = _v1.placeholder(tf.int64, [heartbeat.STEP_AGE_MS + 1])
      initialized = _v1.is_variable_initialized(var)
      write = _v1.scatter_update(var, [worker_id], [row]).op
  session = _v1.Session(ps_target, graph=graph,
                        config=_v1.ConfigProto(device_filters=[ps_device]))
  beat = 0
  try:
    while not stop.is_set():
      beat += 1
      try:
        if not session.run(initialized, options=run_options(_RUN_SECS)):
          session.run(var.initializer, options=run_options(_RUN_SECS))
        session.run(write, {row: [beat, 0, 0, _RESTORING, 0]}, options=run_options(_RUN_SECS))
      except tf.errors.OpError as e:  # A busy or restarting ps: the next beat retries.
        logging.debug("restoring beat %d not written: %s", beat, e)
      stop.wait(heartbeat.BEAT_SECS)
  finally:
    session.close()


def start_up_watch(ps_target: Optional[str],
                   worker_names: Optional[Sequence[str]]) -> Optional[heartbeat.ProgressWatch]:
  """A ProgressWatch of every training task's row, read over a session of its own (None
  without a target or names: the wait then counts elapsed time)."""
  if not ps_target or not worker_names:
    return None
  return heartbeat.ProgressWatch(heartbeat.remote_reader(ps_target, len(worker_names)),
                                 worker_names)
