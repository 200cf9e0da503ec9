"""EpochInput's look-ahead: the iterator's next element held one step ahead, of any structure.

The buffer is a queue of `tf.data` Optionals (one variant scalar each), not of the element's
components: whatever a Dataset can yield (nested dicts and tuples of dense tensors,
SparseTensors, RaggedTensors, of any dtype) passes unchanged, with the structure, dtypes and
static shapes of `dataset.element_spec`, and the end of the pass is an Optional without a value
instead of an OutOfRangeError. A step takes this step's Optional, decodes its batch and buffers
the next one; the model's ops on this batch and the read of the next one run in parallel.

Typical usage (inside EpochInput):
  lookahead = LookAhead(iterator, dataset.element_spec)
  batch = lookahead.batch                # the model's input
  fetches = lookahead.step_fetches       # the hook fetches these with every step reading it
  lookahead.examples(results)            # the examples of that step's batch
  session.run(lookahead.start(start_ops))["has_next"]  # per epoch: fresh iterator, 1st batch
"""

from typing import Any, Dict, Optional, Sequence, Tuple

import tensorflow as tf
from tensorflow.python.data.ops import optional_ops  # pylint: disable=g-direct-tensorflow-import

__all__ = ["LookAhead", "batch_size"]

_v1 = tf.compat.v1


class LookAhead:
  """The ops of a one-batch look-ahead over `iterator` (built in the caller's name scope).

  Per step on the worker, 8 ops for a dense batch (the queue's and the iterator's handles, the
  dequeue, the next Optional, its has-value, the enqueue, the decoding, the batch's Shape); a
  sparse one needs no Shape but its decoding. The hook derives the batch size in Python.

  Args:
    iterator: an initializable tf.compat.v1 iterator over one pass of the data.
    spec: `dataset.element_spec`.
  """

  def __init__(self, iterator, spec: Any):
    self._iterator, self._spec = iterator, spec
    # Holds at most 2: this step's Optional and the next one, enqueued in the same step. On the
    # iterator's device whatever the device function says: an Optional stays in its process.
    with _v1.get_default_graph().colocate_with(iterator._iterator_resource.op):  # pylint: disable=protected-access
      self._buffer = _v1.FIFOQueue(2, [tf.variant], shapes=[[]], name="buffer")
    taken = self._buffer.dequeue(name="take")
    self.dequeue_op = taken.op
    has_next, enqueue = self._buffer_next()
    # The step's stateful reads: this step's batch and the next one (hooks.data.step_gate).
    self.read_ops = [self.dequeue_op, enqueue.inputs[1].op]
    with tf.control_dependencies([enqueue]):  # reading a batch always buffers the next
      self.batch = optional_ops._OptionalImpl(taken, spec).get_value()  # pylint: disable=protected-access
    size, self._offset = _batch_size_source(self.batch)
    # The hook fetches these with every step that reads the batch.
    self.step_fetches = {"has_next": has_next, "buffered": enqueue}
    if size is not None:
      self.step_fetches["size"] = size

  def _buffer_next(self):
    """(whether the iterator's next Optional holds a batch, the op that buffers it)."""
    optional = self._iterator.get_next_as_optional()
    enqueue = self._buffer.enqueue([optional._variant_tensor])  # pylint: disable=protected-access
    return optional.has_value(), enqueue

  def examples(self, results: Dict[str, Any]) -> int:
    """Examples in the batch of the step that returned `results` (of `step_fetches`)."""
    return self._offset + (int(results["size"][0]) if "size" in results else 0)

  def start(self, start_ops: Sequence[Any]) -> Dict[str, Any]:
    """Fetches of the one run that starts a pass: empty the buffer (the end-of-pass Optional
    of the last pass, or anything an earlier session left), run `start_ops` (the iterator's
    initializer among them), then buffer the first batch. "has_next": whether there is one."""
    drain = self._buffer.dequeue_many(self._buffer.size(), name="drain")
    with tf.control_dependencies([drain.op]):
      with tf.control_dependencies([tf.group(*start_ops)]):
        has_next, enqueue = self._buffer_next()
    return {"has_next": has_next, "buffered": enqueue}


def _batch_size_source(batch: Any) -> Tuple[Optional[tf.Tensor], int]:
  """(tensor, offset): the examples in `batch` are tensor[0] + offset, from the outer dimension
  of its first batched component (dense: its shape, sparse: dense_shape, ragged: its row
  splits' length - 1); (None, n) when that is static, (None, 1) when nothing is batched."""
  for component in tf.nest.flatten(batch):
    if isinstance(component, tf.SparseTensor):
      return component.dense_shape, 0  # an output of the decoding: no op of its own
    if isinstance(component, tf.RaggedTensor):
      return tf.shape(component.row_splits, out_type=tf.int64), -1
    if isinstance(component, tf.Tensor) and component.shape.rank != 0:
      static = tf.compat.dimension_value(component.shape[0])
      if static is not None:  # e.g. batch(..., drop_remainder=True)
        return None, static
      return tf.shape(component, out_type=tf.int64), 0
  return None, 1


def batch_size(batch: Any) -> tf.Tensor:
  """Examples in `batch` (an int64 scalar), as `LookAhead` counts them."""
  size, offset = _batch_size_source(batch)
  if size is None:
    return tf.constant(offset, tf.int64)
  return size[0] + offset
