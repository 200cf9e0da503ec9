"""The chief saves exactly one checkpoint per epoch, after every worker finished it.

The save runs as a chief action of the epoch barrier: after all workers arrived at the
end of epoch e and before any of them is released into epoch e+1. The epoch is stored
in the checkpoint (`epochsync/completed_epochs`) and in the file name
(`model.ckpt-epoch0002-<global_step>`), and CheckpointSaverListeners hang off each save.

Typical usage:
  save = ChiefSaveAfterBarrierHook(barrier, checkpoint_dir=model_dir)
  hooks = [barrier, epoch_input.hook] + ([save] if config.is_chief else [])
"""

import os
import threading
import time
from typing import Dict, Optional, Sequence

import tensorflow as tf

from hooks.faults import heartbeat
from hooks.faults import step_retry
from hooks import log as logging
from hooks.config import preflight
from hooks.epoch.barrier import EpochBarrierHook
from hooks.errors import ConfigError, raise_if_problems

__all__ = ["ChiefSaveAfterBarrierHook", "epoch_checkpoint_prefix"]

_v1 = tf.compat.v1
_GRAPH_WRITE_SECS = 60.0  # How long the first save or end() waits for the graph files.


def epoch_checkpoint_prefix(checkpoint_dir: str, epoch: int, basename: str = "model.ckpt"):
  """The path prefix of epoch `epoch`'s checkpoint (the global step is appended)."""
  return os.path.join(checkpoint_dir, f"{basename}-epoch{epoch:04d}")


class ChiefSaveAfterBarrierHook(_v1.train.SessionRunHook):
  """Saves a checkpoint on the chief once per epoch, between the barrier's gather and release.

    barrier = EpochBarrierHook(epoch_input, num_workers=3, worker_id=0)
    save = ChiefSaveAfterBarrierHook(barrier, model_dir, listeners=[export_listener])
    with tf.compat.v1.train.MonitoredSession(session_creator=creator,
                                             hooks=[barrier, save, epoch_input.hook]) as s:
      while not s.should_stop(): s.run(train_op)

  Turn off other periodic savers (MonitoredTrainingSession's save_checkpoint_secs=None
  and save_checkpoint_steps=None): a mid-epoch checkpoint would make a restart re-train
  part of an epoch.

  Args:
    barrier: the chief's `EpochBarrierHook` (worker_id 0).
    checkpoint_dir: `str`, where checkpoints go; the chief restores from here on restart.
    saver: a `tf.compat.v1.train.Saver`; default: the Scaffold's saver (SAVERS collection).
    listeners: `CheckpointSaverListener`s called around each save.
    checkpoint_basename: `str`, file name stem.
    save_graph_def: `bool`, as CheckpointSaverHook's: write `graph.pbtxt` and the graph for
      TensorBoard once the session exists, and a `.meta` file with every checkpoint.

  Raises:
    ConfigError: if `barrier` is not the chief's or `checkpoint_dir` is empty; in `begin()`, if
      the chief cannot create `checkpoint_dir` or write into it.
  """

  def __init__(self, barrier: EpochBarrierHook, checkpoint_dir: str,
               saver: Optional[_v1.train.Saver] = None,
               listeners: Sequence[_v1.train.CheckpointSaverListener] = (),
               checkpoint_basename: str = "model.ckpt", save_graph_def: bool = True):
    if not checkpoint_dir:
      raise ConfigError("ChiefSaveAfterBarrierHook: checkpoint_dir is empty; pass the model_dir")
    if not barrier.is_chief:
      raise ConfigError(f"ChiefSaveAfterBarrierHook runs on the chief only, but the barrier is "
                        f"{barrier.task_name}'s; add it to chief_only_hooks")
    self._dir, self._basename = checkpoint_dir, checkpoint_basename
    self._task_name = barrier.task_name
    self._saver, self._listeners = saver, list(listeners)
    self._save_graph_def = bool(save_graph_def)
    self._graph_writer: Optional[threading.Thread] = None
    self._graph_error: Optional[BaseException] = None
    self.saved: Dict[int, str] = {}
    barrier.add_chief_action(self._save)

  def begin(self):
    self._global_step = _v1.train.get_global_step()
    if self._global_step is None:
      raise RuntimeError("ChiefSaveAfterBarrierHook needs a global step: call "
                         "tf.compat.v1.train.get_or_create_global_step() when building the model")
    raise_if_problems(preflight.writable_dir_problems(self._dir, self._task_name),
                      f"checkpoint directory of {self._task_name}")
    for listener in self._listeners:
      listener.begin()

  def after_create_session(self, session, coord):
    if not self._save_graph_def:
      return
    # As CheckpointSaverHook (after every hook's begin(), when the graph is final), but in a
    # thread started at the first step: nothing before the first save needs the files, and
    # writing them (Python-bound: text format) took the chief 0.2-0.7 s on its way to the start
    # barrier, or slowed its other hooks there as a thread. The first save and end() wait.
    self._graph_writer = threading.Thread(
        target=self._write_graph, args=(_v1.get_default_graph(), self._get_saver().saver_def),
        daemon=True, name="epochsync-graph-writer")

  def before_run(self, run_context):
    if self._graph_writer is not None and self._graph_writer.ident is None:
      self._graph_writer.start()  # After the start barrier: the chief's first step.

  def _write_graph(self, graph, saver_def) -> None:
    try:
      with graph.as_default():  # A new thread is eager (TF2 behaviour): export needs graph mode.
        graph_def = graph.as_graph_def(add_shapes=True)
        tf.io.write_graph(graph_def, self._dir, "graph.pbtxt")
        writer = _v1.summary.FileWriterCache.get(self._dir)
        writer.add_graph(graph)
        writer.add_meta_graph(_v1.train.export_meta_graph(graph_def=graph_def,
                                                          saver_def=saver_def))
    except BaseException as e:  # pylint: disable=broad-except; raised by _graph_written()
      self._graph_error = e

  def _graph_written(self) -> None:
    """Waits (bounded) for the graph files; raises what writing them raised."""
    writer, self._graph_writer = self._graph_writer, None
    if writer is not None and writer.ident is None:  # No step ran: write it here.
      writer.run()
    elif writer is not None:
      writer.join(_GRAPH_WRITE_SECS)
      if writer.is_alive():
        logging.warning("%s: writing graph.pbtxt to %s took over %.0f s; going on without "
                        "waiting for it", self._task_name, self._dir, _GRAPH_WRITE_SECS)
    if self._graph_error is not None:
      error, self._graph_error = self._graph_error, None
      raise error

  def _get_saver(self) -> _v1.train.Saver:
    if self._saver is None:
      savers = _v1.get_collection(_v1.GraphKeys.SAVERS)
      if len(savers) != 1:
        raise RuntimeError(f"found {len(savers)} savers in the SAVERS collection; pass saver=")
      self._saver = savers[0]
    return self._saver

  def _save(self, session, epoch: int, arrivals) -> Dict[str, object]:
    with heartbeat.busy("saving"):  # The waiting workers see progress, however long it takes.
      return self._save_now(session, epoch, arrivals)

  def _save_now(self, session, epoch: int, arrivals) -> Dict[str, object]:
    self._graph_written()
    step = int(session.run(self._global_step))
    for listener in self._listeners:
      listener.before_save(session, step)
    start = time.monotonic()
    tf.io.gfile.makedirs(self._dir)
    path = step_retry.run_rerunnable(lambda: self._get_saver().save(
        session, epoch_checkpoint_prefix(self._dir, epoch, self._basename), global_step=step,
        write_meta_graph=self._save_graph_def), f"the save of epoch {epoch}", self._task_name)
    saved_at = time.time()
    logging.info("chief saved epoch %d (global_step %d, %d workers done) to %s in %.2f s",
                 epoch, step, len(arrivals), path, time.monotonic() - start)
    for listener in self._listeners:
      listener.after_save(session, step)
    self.saved[epoch] = path
    return {"checkpoint": path, "saved_at": saved_at}

  def end(self, session):
    self._graph_written()
    step = int(session.run(self._global_step))
    for listener in self._listeners:
      listener.end(session, step)
