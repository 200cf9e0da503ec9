"""Cluster test task: examples.train plus injected faults (slow steps, a stalled worker).

  --step_sleep_secs=0.2             every step sleeps (so a test can kill mid-epoch)
  --slowdown=5                      this task's steps sleep 5x --step_sleep_secs (per task)
  --stall_worker=2 --stall_epoch=1  worker id 2 never reaches the barrier of epoch 1
  --start_delay_secs=8              this task starts 8 s late (a pod scheduled late: its server
                                    comes up then)
  --chief_init_delay_secs=3         the chief creates its session (initialises) 3 s late, its
                                    server already up: every worker asks for the model first
  --save_sleep_secs=20              each epoch checkpoint of the chief takes 20 s longer (a
                                    CheckpointSaverListener sleeps in before_save)
  --mid_epoch_save_sleep_secs=8     each mid-epoch checkpoint of the chief takes 8 s longer
  --restore_sleep_secs=12           each checkpoint restore takes 12 s longer
  --hang_worker=2 --hang_step=5     worker id 2's 5th step never comes back from session.run (it
                                    also fetches a dequeue from an empty queue: a run TensorFlow
                                    lost, as after a duplicate RunGraph whose cancellation was lost)
  --lose_step=5                     --hang_worker's 5th step is a run TensorFlow lost: its
                                    session.run never returns and runs nothing (as a RunGraph
                                    rejected on this task whose cancellation the others never
                                    got); the step's run again is normal
  --lose_aggregation=4              the chief's 4th aggregation run is lost the same way
  --record_steps_dir=/tmp/steps     (synchronous) each worker appends a line per step to
                                    steps-worker-N.jsonl: the epoch and the step its batch went
                                    into (the token less one), for the oracle of an elastic job
"""

import faulthandler
import json
import os
import signal
import threading
import time

from absl import app
from absl import flags
import tensorflow as tf

from examples import train
from hooks import graph_keys
from hooks.data.epoch_input import EpochListener

_STEP_SLEEP = flags.DEFINE_float("step_sleep_secs", 0.0, "Sleep after every step.")
_SLOWDOWN = flags.DEFINE_float("slowdown", 1.0, "This task's steps sleep this many times "
                                "--step_sleep_secs (give it to one task: a slow worker).",
                                lower_bound=0.0)
_STALL_WORKER = flags.DEFINE_integer("stall_worker", -1, "Worker id that stalls.")
_STALL_EPOCH = flags.DEFINE_integer("stall_epoch", 0, "Epoch at whose end it stalls.")
_START_DELAY = flags.DEFINE_float("start_delay_secs", 0.0, "This task starts this late.",
                                  lower_bound=0.0)
_CHIEF_DELAY = flags.DEFINE_float("chief_init_delay_secs", 0.0,
                                   "The chief initialises the model this late.")
_SAVE_SLEEP = flags.DEFINE_float("save_sleep_secs", 0.0,
                                 "Each epoch checkpoint of the chief takes this much longer.")
_MID_SAVE_SLEEP = flags.DEFINE_float(
    "mid_epoch_save_sleep_secs", 0.0, "Each mid-epoch checkpoint of the chief takes this long more.")
_HANG_WORKER = flags.DEFINE_integer("hang_worker", -1, "Worker id whose step never returns.")
_LOSE_STEP = flags.DEFINE_integer("lose_step", 0, "--hang_worker's step (from 1) whose first "
                                  "run is lost: it never returns and runs nothing.")
_LOSE_AGGREGATION = flags.DEFINE_integer("lose_aggregation", 0, "The chief's aggregation run "
                                         "(from 1) that is lost: never returns, runs nothing.")
_HANG_STEP = flags.DEFINE_integer("hang_step", 5, "Which step of --hang_worker hangs (from 1).")
_RECORD_STEPS = flags.DEFINE_string("record_steps_dir", "", "Where each worker records the "
                                    "synchronous step of each of its batches.")
_RESTORE_SLEEP = flags.DEFINE_float("restore_sleep_secs", 0.0,
                                    "Each checkpoint restore takes this much longer.")


def _slow_restores():
  """Saver.restore sleeps first (a large model on a slow filesystem)."""
  restore = tf.compat.v1.train.Saver.restore

  def slow_restore(self, sess, save_path):
    print(f"slow restore: sleeping {_RESTORE_SLEEP.value} s", flush=True)
    time.sleep(_RESTORE_SLEEP.value)
    return restore(self, sess, save_path)

  tf.compat.v1.train.Saver.restore = slow_restore


def _slow_mid_epoch_saves():
  """Saver.save sleeps first when it writes a mid-epoch checkpoint."""
  save = tf.compat.v1.train.Saver.save

  def slow_save(self, sess, save_path, *args, **kwargs):
    if "mid_epoch" in save_path:
      print(f"slow mid-epoch save: sleeping {_MID_SAVE_SLEEP.value} s", flush=True)
      time.sleep(_MID_SAVE_SLEEP.value)
    return save(self, sess, save_path, *args, **kwargs)

  tf.compat.v1.train.Saver.save = slow_save


class _SlowSave(tf.compat.v1.train.CheckpointSaverListener):

  def before_save(self, session, global_step_value):
    print(f"slow save: sleeping {_SAVE_SLEEP.value} s before the save", flush=True)
    time.sleep(_SAVE_SLEEP.value)


class _SlowSteps(tf.compat.v1.train.SessionRunHook):

  def after_run(self, run_context, run_values):
    time.sleep(_STEP_SLEEP.value * _SLOWDOWN.value)


class _Stall(EpochListener):
  order = 15  # after the done signal, before the barrier

  def epoch_ended(self, session, stats):
    if stats.epoch == _STALL_EPOCH.value:
      print(f"stalling before the barrier of epoch {stats.epoch}", flush=True)
      time.sleep(10_000)


class _HangStep(tf.compat.v1.train.SessionRunHook):
  """Every step also dequeues from a queue that holds --hang_step - 1 elements: that step never
  ends (every step fetches the same, so the hanging one is of a kind run before)."""

  def begin(self):
    self._steps = 0
    with tf.name_scope("test_hang"):
      queue = tf.queue.FIFOQueue(_HANG_STEP.value, tf.int32)
      self._fill = queue.enqueue_many([tf.range(_HANG_STEP.value - 1)])
      self._never = queue.dequeue()

  def after_create_session(self, session, coord):
    session.run(self._fill)

  def before_run(self, run_context):
    self._steps += 1
    if self._steps == _HANG_STEP.value:
      print(f"step {self._steps}: hanging in session.run", flush=True)
    return tf.compat.v1.train.SessionRunArgs(self._never)


def _lose_a_step(number: int) -> None:
  """The first run of this task's step `number` never returns and runs nothing: session.run
  (below tf-epochsync's wrappers) blocks before TensorFlow sees it. The step is found by the
  StuckStepWatchdog's marker feed, which carries the step's number."""
  run, lost = tf.compat.v1.Session.run, []

  def losing_run(self, fetches, feed_dict=None, options=None, run_metadata=None):
    marked = [v for k, v in (feed_dict or {}).items()
              if getattr(k, "name", "") == "epochsync_step_marker/step:0"]
    if marked == [number] and not lost:
      lost.append(number)
      print(f"step {number}: lost in session.run", flush=True)
      threading.Event().wait(3600)  # "for ever": the watchdog leaves this thread behind
    return run(self, fetches, feed_dict, options, run_metadata)
  tf.compat.v1.Session.run = losing_run


def _lose_an_aggregation(number: int) -> None:
  """The chief's aggregation run `number` never returns and runs nothing (its run, below the
  loop's retry, blocks before TensorFlow sees it); run again, it is normal."""
  from hooks.sync import aggregation_loop  # pylint: disable=g-import-not-at-top
  run, calls = aggregation_loop.AggregationLoop._run, [0]  # pylint: disable=protected-access

  def losing_run(self, generation, fn, what):
    if what == aggregation_loop._AGGREGATE:  # pylint: disable=protected-access
      calls[0] += 1
      if calls[0] == number:
        def fn():  # pylint: disable=function-redefined
          print(f"aggregation {number}: lost in session.run", flush=True)
          threading.Event().wait(3600)  # "for ever": the watchdog leaves this thread behind
    return run(self, generation, fn, what)
  aggregation_loop.AggregationLoop._run = losing_run  # pylint: disable=protected-access


class _RecordSteps(tf.compat.v1.train.SessionRunHook):
  """Appends {"epoch", "step", "pid"} before each synchronous step: the step its batch goes
  into (the worker's local step), read before the run, so a killed worker's batch in the model
  always has its line (the oracle ignores lines past the batches the audit says the model holds,
  and a process's line of its run in flight: tests/elastic_checks.recorded_steps)."""

  def __init__(self, epoch_input, path: str):
    self._epoch, self._path = epoch_input.epoch_tensor, path

  def begin(self):
    graph = tf.compat.v1.get_default_graph()
    self._train = tf.compat.v1.get_collection(graph_keys.SYNC_TRAIN_OPS)[0]
    self._local = [op.outputs[0] for op in graph.get_operations()
                   if op.name.endswith("_local_step_set_by_SafeSyncTokensHook")][0]
    self._file = open(self._path, "a")

  def before_run(self, run_context):
    fetches = tf.nest.flatten(run_context.original_args.fetches)
    if any(getattr(f, "name", None) == self._train.name for f in fetches):
      epoch, step = run_context.session.run([self._epoch, self._local])
      self._file.write(json.dumps({"epoch": int(epoch), "step": int(step),
                                   "pid": os.getpid()}) + "\n")
      self._file.flush()


class _DelayBegin(tf.compat.v1.train.SessionRunHook):
  """Sleeps in begin(): after the graph and the server exist, before the session is created."""

  def begin(self):
    time.sleep(_CHIEF_DELAY.value)


def _extra_hooks(config, epoch_input):
  hooks = [_SlowSteps()] if _STEP_SLEEP.value > 0 else []
  if config.is_chief and _CHIEF_DELAY.value > 0:
    hooks.append(_DelayBegin())
  if config.is_chief and _LOSE_AGGREGATION.value:
    _lose_an_aggregation(_LOSE_AGGREGATION.value)
  if config.worker_id == _HANG_WORKER.value:
    if _LOSE_STEP.value:
      _lose_a_step(_LOSE_STEP.value)
    else:
      hooks.append(_HangStep())
  if config.worker_id == _STALL_WORKER.value:
    epoch_input.add_listener(_Stall())
  if _RECORD_STEPS.value:
    path = os.path.join(_RECORD_STEPS.value, f"steps-worker-{config.worker_id}.jsonl")
    hooks.append(_RecordSteps(epoch_input, path))
  return hooks


def main(argv):
  del argv
  faulthandler.register(signal.SIGTERM, chain=True)  # a task killed at a deadline shows where
  time.sleep(_START_DELAY.value)
  if _MID_SAVE_SLEEP.value > 0:
    _slow_mid_epoch_saves()
  if _RESTORE_SLEEP.value > 0:
    _slow_restores()
  train.train(_extra_hooks, listeners=[_SlowSave()] if _SAVE_SLEEP.value > 0 else [])


if __name__ == "__main__":
  app.run(main)
