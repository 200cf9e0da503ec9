"""EpochInput's session hook: sees each epoch's end after a step and drives the listeners.

After every step that read a batch it knows from the look-ahead whether the shard has another
one; at the end it calls the listeners' `epoch_ended` (done signal, barrier, chief save),
starts the next epoch with a fresh iterator (skipping empty shards' epochs at once), and stops
the session after `num_epochs`. A resumed epoch skips the batches a mid-epoch checkpoint holds.

Typical usage (EpochInput builds it; give `epoch_input.hook` to the session):
  hook = EpochDriverHook(epoch_input)
  with tf.compat.v1.train.MonitoredSession(..., hooks=[..., hook]) as sess: ...
"""

import time
from typing import Any, Dict, List

import tensorflow as tf

from hooks import graph_keys
from hooks import log as logging
from hooks.config import preflight
from hooks.data import input_graph
from hooks.data import step_gate
from hooks.data.epoch_listener import EpochStats
from hooks.data.passes import PassEnd, PassStart
from hooks.errors import EpochIncompleteError, raise_if_problems
from hooks.faults import step_retry
from hooks.faults.waiting import run_options

__all__ = ["EpochDriverHook"]

_v1 = tf.compat.v1
_RUN_TIMEOUT_SECS = 60.0  # The cardinality read: a local op that inspects the pipeline only.


class EpochDriverHook(_v1.train.SessionRunHook):
  """Detects each epoch's end after a step and runs the listeners; see EpochInput."""

  def __init__(self, epoch_input: "EpochInput"):
    self._input = epoch_input
    self._consumers: Dict[Any, bool] = {}
    self._epoch = 0
    self._finished = False
    self._batches = self._examples = self._skip = self._skipped = self._skipped_examples = 0
    self._step_feeds = None  # (begin) the passes' feeds of every step that takes a batch
    self._pass_batches = self._pass_examples = 0
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
    with tf.name_scope("epochsync_input/next_pass"):  # A pass after the epoch's first one.
      self._start_pass = self._input._lookahead.start([self._input._iterator.initializer])
    self._step_feeds = self._input.passes.step_feeds() or None  # (the graph is built now)
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
      by_pass = self._input.passes.skips_by_pass
      self._skipped_examples = 0 if by_pass else self._count_skipped(session, {}, self._skipped)
      self._batches, self._examples = self._skipped, self._skipped_examples
      start = self._input.passes.first_pass(session, self._epoch, self._batches)
      skip = self._skipped if start.skip is None else start.skip
      has_value = self._run_start(session, self._start_and_preload, {
          self._input._epoch_value: self._epoch, self._input._skip: skip, **start.feeds})
      self._pass_started(session, start)
      for listener in self._input.listeners:
        listener.epoch_started(session, self._epoch)
      if has_value or self._next_pass_with_data(session):
        return False
      logging.info("%s: shard is empty in epoch %d%s", self._input.task_name, self._epoch,
                   f" after the {self._skipped} batches skipped" if self._skipped else "")
      self._end_epoch(session)
    self._finished = True
    return True

  def _next_pass_with_data(self, session) -> bool:
    """Starts the epoch's next passes until one has a batch; False when the source has none.
    Bounded by the source: each pass it gives is a new one (a work queue: a new unit)."""
    while True:
      ended = PassEnd(self._pass_batches, self._pass_examples, self._batches)
      start = self._input.passes.next_pass(session, self._epoch, ended)
      if start is None:
        return False
      has_next = self._run_start(session, self._start_pass,
                                 {self._input._skip: start.skip or 0, **start.feeds})
      self._pass_started(session, start)
      if has_next:
        return True

  def _run_start(self, session, fetches, feeds) -> bool:
    """Runs a pass's start; whether it has a batch. Its stateful ops are all on this task and
    its read waits for the step gate's ps parts, so a run any task rejected as a duplicate
    request ran none of them and runs again (the session's own retry takes only a ps's)."""
    return step_retry.run_rerunnable(
        lambda: session.run(fetches, feeds), f"the start of epoch {self._epoch}'s pass",
        self._input.task_name)["has_next"]

  def _pass_started(self, session, start: PassStart) -> None:
    """A pass resumed after `start.skip` batches: they count in the pass, not in the steps."""
    skip = start.skip or 0
    self._pass_batches = skip
    self._pass_examples = self._count_skipped(session, start.feeds, skip) if skip else 0

  def _count_skipped(self, session, feeds: Dict[Any, Any], skip: int) -> int:
    """The examples of the `skip` first batches of a pass (0 when none are skipped): batches an
    earlier attempt trained."""
    if not skip:
      return 0
    start = time.monotonic()
    examples = self._input.count_examples(session, feeds, skip)
    logging.info("%s: the %d batches of epoch %d trained before the resume hold %d examples "
                 "(counted in %.2f s)", self._input.task_name, skip, self._epoch,
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
      return _v1.train.SessionRunArgs({**fetches, "step_ops": ops} if ops else fetches,
                                      feed_dict=self._step_feeds)
    return None

  def after_run(self, run_context, run_values):
    if run_values.results is None:
      return
    examples = self._input._lookahead.examples(run_values.results)
    self._batches += 1
    self._examples += examples
    self._pass_batches += 1
    self._pass_examples += examples
    if run_values.results["has_next"] or self._next_pass_with_data(run_context.session):
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
