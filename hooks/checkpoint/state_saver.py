"""The chief's Scaffold saver: TensorFlow's default, except that per-worker state of another
worker count restores as fresh instead of failing.

tf-epochsync keeps per-worker state (`graph_keys.STATE_VARIABLES`: arrivals, done counters,
the mid-epoch positions, the sync optimizer's progress) in vectors sized to the job's workers.
TensorFlow's default Saver restores a checkpoint of 4 workers into a graph of 3 with
`Assign requires shapes of both tensors to match. lhs shape= [3] rhs shape= [4]`, so a job
under TensorFlow's own `MonitoredTrainingSession` could not be relaunched with another worker
count. This saver saves every variable under its usual name (checkpoints stay what a stock
Saver writes and reads) and restores each state variable by shape: the checkpoint's value
when the shapes match, else the variable's initial value, which is what tf-epochsync's own
chief session creator does (`hooks.checkpoint.partial_restore`). Model variables restore as
in stock, a mismatch there is TensorFlow's usual error.

Typical usage (the chief's `StateSaverHook`, wired by `hooks.epoch_sync_hooks`, does this in
`begin()`, before the Scaffold picks the saver of the SAVERS collection):
  if not tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.SAVERS):
    tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.SAVERS, StateResizingSaver())
"""

from typing import List, Optional

import tensorflow as tf
from tensorflow.python.training.saving import saveable_object  # pylint: disable=g-direct-tensorflow-import

from hooks import graph_keys
from hooks import log as logging
from hooks.checkpoint import partial_restore

__all__ = ["StateResizingSaver", "StateSaverHook"]

_v1 = tf.compat.v1


class _FreshIfResized(saveable_object.SaveableObject):
  """A reference variable saved as usual, restored only when the checkpoint's shape is its own
  (else to its initial value)."""

  def __init__(self, var: tf.Variable):
    self._var = var
    name = var.op.name
    spec = saveable_object.SaveSpec(var, "", name, dtype=var.dtype.base_dtype)
    super().__init__(var, [spec], name)

  def restore(self, restored_tensors, restored_shapes):
    del restored_shapes  # (a Saver's reshape=True; never set here)
    restored, shape = restored_tensors[0], self._var.shape.as_list()
    with tf.name_scope("fresh_if_resized"):
      actual = tf.shape(restored, out_type=tf.int64)
      expected = tf.constant(shape, tf.int64, shape=[len(shape)])
      same_rank = tf.equal(tf.size(actual, out_type=tf.int64), len(shape))
      same = tf.cond(same_rank, lambda: tf.reduce_all(tf.equal(actual, expected)),
                     lambda: tf.constant(False))
      value = tf.cond(same, lambda: tf.reshape(restored, shape),
                      lambda: tf.identity(self._var.initial_value))
      return _v1.assign(self._var, value, validate_shape=True)


class StateResizingSaver(_v1.train.Saver):
  """TensorFlow's default Scaffold saver whose tf-epochsync state restores by shape.

  Built when the Scaffold finalizes the graph (every hook's `begin()` has run), over what a
  default Saver covers then: the global variables and the SAVEABLE_OBJECTS collection, sharded.

    tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.SAVERS, StateResizingSaver())
  """

  def __init__(self):
    super().__init__(sharded=True, allow_empty=True, defer_build=True)

  def build(self):
    # TensorFlow's Saver builds over `self._var_list`, or over every saveable of the graph
    # when it is None (saver.py, 2.15 to 2.21): this one sets it at build time.
    self._var_list = saveables(_v1.get_default_graph())  # pylint: disable=attribute-defined-outside-init
    super().build()


def saveables(graph: tf.Graph) -> List:
  """What a default Saver of `graph` saves, each state variable as a `_FreshIfResized`."""
  state = {id(v) for v in graph.get_collection(graph_keys.STATE_VARIABLES)}
  found = graph.get_collection(_v1.GraphKeys.GLOBAL_VARIABLES)
  found += graph.get_collection(_v1.GraphKeys.SAVEABLE_OBJECTS)
  return [_FreshIfResized(v) if id(v) in state else v for v in found]


class StateSaverHook(_v1.train.SessionRunHook):
  """The chief: the Scaffold saves and restores through a `StateResizingSaver`.

  A session creator that restores a checkpoint of another worker count (TensorFlow's own
  ChiefSessionCreator included) then starts tf-epochsync's per-worker state fresh, and epoch
  counting goes on. A saver the job already put in the SAVERS collection (or passed in its
  Scaffold) is left as it is.

    hooks = [guard, StateSaverHook(model_dir), restore, run_start, ...]

  Args:
    checkpoint_dir: `str`, where the session creator restores from (to say what it will do).
  """

  def __init__(self, checkpoint_dir: Optional[str]):
    self._dir, self._graph = checkpoint_dir, None

  def begin(self):
    graph = _v1.get_default_graph()
    if graph.get_collection(_v1.GraphKeys.SAVERS):
      return  # The job's own saver (or an Estimator's): its choice, and it says nothing.
    graph.add_to_collection(_v1.GraphKeys.SAVERS, StateResizingSaver())
    self._graph = graph

  def after_create_session(self, session, coord):
    del session, coord  # unused
    path = self._graph and self._dir and tf.train.latest_checkpoint(self._dir)
    if not path:
      return
    stored = dict(tf.train.list_variables(path))
    resized = [f"{name} {stored[name]} there, {shape} here"
               for name, shape in map(partial_restore.checkpoint_key,
                                      self._graph.get_collection(graph_keys.STATE_VARIABLES))
               if name in stored and list(stored[name]) != shape]
    if resized:
      logging.info("%s was written with another number of workers (%s): tf-epochsync's "
                   "per-worker state starts fresh when it is restored, and epoch counting goes "
                   "on from it", path, "; ".join(resized))
