"""Feeds one pass over a worker's shard per epoch and drives the epoch hooks at its end.

`EpochInput` wraps a per-epoch `tf.data.Dataset` (one pass, not repeated). It keeps one
batch buffered ahead, so after each step it knows whether the shard has another batch:
the epoch's end is seen without an OutOfRangeError ever reaching MonitoredSession, and an
empty shard is seen before any step runs. Its `hook` then calls the epoch listeners (done
signal, barrier, chief save) in order, starts the next epoch with a fresh iterator, and
stops the session after `num_epochs`, all within one session.

Typical usage:
  epoch_input = EpochInput(shard_dataset, num_epochs=3, task_name="worker:1")
  features, labels = epoch_input.get_next()
  first = tf.equal(epoch_input.epoch_tensor, 0)  # e.g. count feature frequencies only then
  train_op = build_model(features, labels)
  with tf.compat.v1.train.MonitoredSession(..., hooks=[..., epoch_input.hook]) as sess:
    while not sess.should_stop(): sess.run(train_op)
"""

import dataclasses
import time
from typing import Any, Dict, List, Optional

import tensorflow as tf

from hooks import graph_keys
from hooks.data import input_graph
from hooks import log as logging
from hooks.data import lookahead
from hooks.data import step_gate
from hooks.config import preflight
from hooks.errors import ConfigError, EpochIncompleteError, raise_if_problems
from hooks.faults.waiting import run_options

__all__ = ["EpochInput", "EpochListener", "EpochStats"]

_v1 = tf.compat.v1
_RUN_TIMEOUT_SECS = 60.0  # The cardinality read: a local op that inspects the pipeline only.


@dataclasses.dataclass(frozen=True)
class EpochStats:
  """What one worker trained in one epoch (`started_at`/`ended_at` are time.time()).

  After a resume from a mid-epoch checkpoint `batches` and `examples` count the whole epoch:
  the `skipped_batches` (holding `skipped_examples`) that earlier attempts trained, then this
  attempt's. `started_at` and `ended_at` are this attempt's.
  """
  epoch: int
  batches: int
  examples: int
  started_at: float
  ended_at: float
  skipped_batches: int = 0
  skipped_examples: int = 0


class EpochListener:
  """Base of the hooks that act at epoch boundaries; lower `order` acts first.

  The driver (`EpochInput.hook`) calls `session_created` once, then for each epoch
  `epoch_started` before its first step and `epoch_ended` after its last one.
  """
  order = 50

  def session_created(self, session, start_epoch: int) -> None:
    """Called once with the first epoch this session trains (> 0 after a restart)."""

  def epoch_started(self, session, epoch: int) -> None:
    """Called before the first step of `epoch`, after its iterator read the first batch.

    What the epoch's dataset reads must be set earlier: in `epoch_ended` of the epoch before
    (after the barrier: `order` > 20) or in `session_created`.
    """

  def epoch_ended(self, session, stats: EpochStats) -> None:
    """Called after this worker's last step of `stats.epoch` (at once for an empty shard)."""

  def start_epoch(self, session) -> Optional[int]:
    """A listener that knows the first epoch to train (e.g. from a checkpoint) returns it."""
    return None

  def resume_batches(self, session, epoch: int) -> Optional[int]:
    """Batches of `epoch` (the session's first) trained before a restart: they are skipped."""
    return None


class EpochInput:
  """One pass over `dataset` per epoch, with the epoch's end visible to the hooks.

  Build it inside the worker's graph (under `replica_device_setter`); every epoch
  re-initialises the iterator, so an unseeded `shuffle()` in the dataset reshuffles per
  epoch, while a seeded one starts from its seed again and repeats its order. tf.data
  autotuning is turned off unless the dataset's options set it (with it, TensorFlow 2.15
  can hold each epoch's re-initialisation up to 60 s).

    epoch_input = EpochInput(dataset, num_epochs=3, task_name=config.task_name)
    features, labels = epoch_input.get_next()
    in_first_epoch = tf.equal(epoch_input.epoch_tensor, 0)   # int64 scalar: this epoch
    hooks = [EpochBarrierHook(epoch_input, ...), epoch_input.hook]

  Args:
    dataset: `tf.data.Dataset`, this worker's shard for one epoch (not repeated); may be empty.
      Any element passes (nested dicts/tuples, SparseTensor, RaggedTensor; hooks.data.lookahead);
      examples are counted from the first batched component in tf.nest order.
    num_epochs: `int`, epochs to train; the session stops after the last one.
    task_name: `str`, e.g. "worker:1", used in logs.

  Raises:
    ConfigError: if `num_epochs` < 1 or `dataset` is not a tf.data.Dataset; from the hook, before
      any step: the session's hooks hold a StopAtStepHook or a CheckpointSaverHook, or lack the
      SafeSyncTokensHook of a WorkerDoneSyncReplicasOptimizer (`begin()`), or the dataset is
      infinite (tf.data cardinality INFINITE, when the session is created).
  """

  def __init__(self, dataset: tf.data.Dataset, num_epochs: int, task_name: str = "worker"):
    problems = []
    if not isinstance(num_epochs, int) or num_epochs < 1:
      problems.append(f"num_epochs={num_epochs!r} must be an int >= 1 "
                      "(set --epochsync_num_epochs)")
    if not isinstance(dataset, tf.data.Dataset):
      problems.append(f"dataset={type(dataset).__name__} must be a tf.data.Dataset holding one "
                      "pass over this worker's shard")
    if problems:
      raise ConfigError("; ".join(problems))
    self.num_epochs = num_epochs
    self.task_name = task_name
    dataset = self._dataset = input_graph.without_autotune_stall(dataset, task_name)
    with tf.name_scope("epochsync_input"):
      self._cardinality = dataset.cardinality()  # INFINITE is refused at session creation
      # Batches to skip: fed at the first epoch's start after a mid-epoch resume, else 0.
      self._skip = _v1.placeholder_with_default(tf.constant(0, tf.int64), [], "skip_batches")
      self._iterator = _v1.data.make_initializable_iterator(dataset.skip(self._skip))
      # The examples of the batches skipped (run once per resume: a pass over them).
      self._skipped_examples = dataset.take(self._skip).reduce(
          tf.constant(0, tf.int64), _add_batch_size)
      self._lookahead = lookahead.LookAhead(self._iterator, dataset.element_spec)
      self._next = self._lookahead.batch
      # This worker's epoch, set by the hook before each epoch's first step. A local variable
      # on this worker (colocated with a worker op: replica_device_setter would put a variable
      # on a ps task, shared by every worker).
      anchor = tf.no_op(name="epoch_anchor")
      with _v1.get_default_graph().colocate_with(anchor):
        epoch = _v1.Variable(0, trainable=False, dtype=tf.int64, name="epoch",
                             collections=[_v1.GraphKeys.LOCAL_VARIABLES])
        self._epoch_value = _v1.placeholder(tf.int64, [], "epoch_value")
        self._set_epoch = epoch.assign(self._epoch_value)
        self._epoch_tensor = tf.identity(epoch, name="current_epoch")
    self._listeners: List[EpochListener] = []
    self._step_ops: List[tf.Operation] = []
    self.hook = _EpochDriverHook(self)

  @property
  def dataset(self) -> tf.data.Dataset:
    """The dataset of one epoch, as given (with autotuning turned off unless it set it)."""
    return self._dataset

  def get_next(self) -> Any:
    """The current batch with the dataset's element_spec (dicts, tuples, SparseTensors,
    RaggedTensors, static shapes); consuming it advances the epoch."""
    return self._next

  @property
  def batches_per_epoch_tensor(self) -> tf.Tensor:
    """The dataset's cardinality (int64): batches per epoch, or -2 unknown, -1 infinite."""
    return self._cardinality

  @property
  def epoch_tensor(self) -> tf.Tensor:
    """This worker's current epoch (0-based) as an int64 scalar, for tf.cond / tf.where.

    It holds the epoch of the batch `get_next()` returns in the same step, also after a
    restart (it starts at the first epoch not yet saved). E.g. count feature frequencies in
    the first epoch only: `tf.cond(tf.equal(epoch_input.epoch_tensor, 0), count, no_count)`.
    """
    return self._epoch_tensor

  def add_listener(self, listener: EpochListener) -> None:
    """Registers a hook to be called at session start and at every epoch boundary."""
    self._listeners.append(listener)
    self._listeners.sort(key=lambda l: l.order)

  def add_step_op(self, op: tf.Operation) -> None:
    """Runs `op` in every run that consumes a batch (e.g. counts it), after the batch is taken
    (so never in a step that TensorFlow rejected: hooks.data.step_gate); call before the
    session."""
    op._add_control_inputs([self._lookahead.dequeue_op])  # pylint: disable=protected-access
    self._step_ops.append(op)

  @property
  def listeners(self) -> List[EpochListener]:
    return list(self._listeners)


class _EpochDriverHook(_v1.train.SessionRunHook):
  """Detects each epoch's end after a step and runs the listeners; see EpochInput."""

  def __init__(self, epoch_input: EpochInput):
    self._input = epoch_input
    self._consumers: Dict[Any, bool] = {}
    self._epoch = 0
    self._finished = False
    self._batches = self._examples = self._skip = self._skipped = self._skipped_examples = 0
    self._started_at = 0.0
    self.history: List[EpochStats] = []

  @property
  def epoch(self) -> int:
    return self._epoch

  @property
  def batches(self) -> int:
    """Batches this worker trained so far in the current epoch."""
    return self._batches

  @property
  def examples(self) -> int:
    """Examples this worker trained so far in the current epoch."""
    return self._examples

  @property
  def epoch_started_at(self) -> float:
    """time.time() when the current epoch started on this worker."""
    return self._started_at

  def begin(self):
    self._graph = _v1.get_default_graph()
    lookahead_ops = self._input._lookahead
    step_gate.install(lookahead_ops.read_ops, lookahead_ops.dequeue_op.device)
    start_ops = [self._input._iterator.initializer, self._input._set_epoch] + (
        _v1.get_collection(graph_keys.EPOCH_START_OPS))
    # One run starts an epoch: a fresh iterator, the epoch tensor, e.g. the sync optimizer's
    # local step, and then the look-ahead's first batch (whether the shard is empty).
    with tf.name_scope("epochsync_input/start"):
      self._start_and_preload = self._input._lookahead.start(start_ops)
    name = self._input.task_name
    hooks = preflight.hooks_of_calling_session(self)
    if hooks is None:
      logging.warning("%s: could not see the session's hooks, so a StopAtStepHook, a "
                      "CheckpointSaverHook or a missing SafeSyncTokensHook is not refused "
                      "before the first step", name)
    else:
      raise_if_problems(preflight.session_hooks_problems(hooks, name), f"session hooks of {name}")

  def after_create_session(self, session, coord):
    name = self._input.task_name
    cardinality = session.run(self._input._cardinality, options=run_options(_RUN_TIMEOUT_SECS))
    raise_if_problems(preflight.finite_dataset_problems(cardinality, name),
                      f"dataset of {name}")
    listeners = self._input.listeners
    start = max([s for s in (l.start_epoch(session) for l in listeners) if s is not None],
                default=0)
    self._epoch = start
    self._skip = max([k for k in (l.resume_batches(session, start) for l in listeners)
                      if k is not None], default=0)
    for listener in listeners:
      listener.session_created(session, start)
    if start >= self._input.num_epochs:
      logging.info("%s: all %d epochs were already trained; nothing to do",
                   self._input.task_name, self._input.num_epochs)
    if self._start_epochs_until_data(session):
      coord.request_stop()

  def _start_epochs_until_data(self, session) -> bool:
    """Starts the next epoch; ends at once epochs where the shard is empty. True when done."""
    while self._epoch < self._input.num_epochs:
      self._started_at = time.time()
      self._skipped, self._skip = self._skip, 0  # Counted in the epoch's batches.
      self._skipped_examples = self._count_skipped_examples(session)
      self._batches, self._examples = self._skipped, self._skipped_examples
      has_value = session.run(self._start_and_preload, {
          self._input._epoch_value: self._epoch, self._input._skip: self._skipped})["has_next"]
      for listener in self._input.listeners:
        listener.epoch_started(session, self._epoch)
      if has_value:
        return False
      logging.info("%s: shard is empty in epoch %d%s", self._input.task_name, self._epoch,
                   f" after the {self._skipped} batches skipped" if self._skipped else "")
      self._end_epoch(session)
    self._finished = True
    return True

  def _count_skipped_examples(self, session) -> int:
    """The examples of the batches an earlier attempt trained (0 when none are skipped)."""
    if not self._skipped:
      return 0
    start = time.monotonic()
    examples = int(session.run(self._input._skipped_examples,
                               {self._input._skip: self._skipped}))
    logging.info("%s: the %d batches of epoch %d trained before the resume hold %d examples "
                 "(counted in %.2f s)", self._input.task_name, self._skipped, self._epoch,
                 examples, time.monotonic() - start)
    return examples

  def _end_epoch(self, session) -> None:
    """Runs the listeners for the epoch this worker just finished."""
    stats = EpochStats(self._epoch, self._batches, self._examples, self._started_at,
                       time.time(), self._skipped, self._skipped_examples)
    if not any(getattr(l, "logs_epoch_end", False) for l in self._input.listeners):
      logging.info("%s: epoch %d done: %d batches, %d examples in %.2f s", self._input.task_name,
                   stats.epoch, stats.batches, stats.examples, stats.ended_at - stats.started_at)
    for listener in self._input.listeners:
      listener.epoch_ended(session, stats)
    self.history.append(stats)
    self._epoch += 1

  def _consumes_input(self, fetches) -> bool:
    """True if running `fetches` dequeues a batch (cached per fetch structure)."""
    fetches = tf.nest.flatten(fetches, expand_composites=True)  # SparseTensor -> components
    key = tuple(getattr(f, "name", f) for f in fetches)
    if key not in self._consumers:
      ops = [self._graph.as_graph_element(f) for f in fetches]
      ops = [o if isinstance(o, tf.Operation) else o.op for o in ops]
      self._consumers[key] = input_graph.reaches(ops, self._input._lookahead.dequeue_op)
    return self._consumers[key]

  def before_run(self, run_context):
    if self._consumes_input(run_context.original_args.fetches):
      fetches = self._input._lookahead.step_fetches
      ops = self._input._step_ops
      return _v1.train.SessionRunArgs({**fetches, "step_ops": ops} if ops else fetches)
    return None

  def after_run(self, run_context, run_values):
    if run_values.results is None:
      return
    self._batches += 1
    self._examples += self._input._lookahead.examples(run_values.results)
    if run_values.results["has_next"]:
      return
    self._end_epoch(run_context.session)
    if self._start_epochs_until_data(run_context.session):
      run_context.request_stop()

  def end(self, session):
    if not self._finished:
      raise EpochIncompleteError(
          f"{self._input.task_name}: the session ended during epoch {self._epoch} of "
          f"{self._input.num_epochs} (after {self._batches} batches of it): something stopped "
          "it early, e.g. an OutOfRangeError that did not come from the EpochInput, or a "
          "max_steps/StopAtStepHook; epoch-synchronized training needs neither")


@tf.autograph.experimental.do_not_convert
def _add_batch_size(examples: tf.Tensor, batch: Any) -> tf.Tensor:
  return examples + lookahead.batch_size(batch)
