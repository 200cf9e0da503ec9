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

from typing import Any, Dict, List, Optional

import tensorflow as tf

from hooks.data import input_graph
from hooks.data import lookahead
from hooks.data.epoch_driver import EpochDriverHook
from hooks.data.epoch_listener import EpochListener, EpochStats
from hooks.data.passes import PassSource
from hooks.errors import ConfigError

__all__ = ["EpochInput", "EpochListener", "EpochStats"]

_v1 = tf.compat.v1


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
    passes: `PassSource`, where each epoch's passes over `dataset` come from; default one
      pass (the static shard). hooks.workqueue.work_queue_input gives one per unit it hands
      this worker.

  Raises:
    ConfigError: if `num_epochs` < 1 or `dataset` is not a tf.data.Dataset; from the hook, before
      any step: the session's hooks hold a StopAtStepHook or a CheckpointSaverHook, or lack the
      SafeSyncTokensHook of a WorkerDoneSyncReplicasOptimizer (`begin()`), or the dataset is
      infinite (tf.data cardinality INFINITE, when the session is created).
  """

  def __init__(self, dataset: tf.data.Dataset, num_epochs: int, task_name: str = "worker",
               passes: Optional[PassSource] = None):
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
    self.passes = passes or PassSource()
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
      gate = self.passes.batch_gate(self._lookahead.dequeue_op)
      if gate is not None:  # (an elastic work queue) The batch reaches the model through it.
        with tf.control_dependencies([gate]):
          self._next = tf.nest.map_structure(tf.identity, self._next, expand_composites=True)
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
    self.hook = EpochDriverHook(self)

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

  def count_examples(self, session, feeds: Dict[Any, Any], batches: int) -> int:
    """The examples of the first `batches` batches of the pass `feeds` select (a work queue's
    unit; {} for the static shard): a read over them, e.g. of batches an earlier attempt
    trained."""
    if not batches:
      return 0
    return int(session.run(self._skipped_examples, {self._skip: batches, **feeds}))

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


@tf.autograph.experimental.do_not_convert
def _add_batch_size(examples: tf.Tensor, batch: Any) -> tf.Tensor:
  return examples + lookahead.batch_size(batch)
