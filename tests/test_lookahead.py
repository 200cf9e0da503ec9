"""Tests for hooks/data/lookahead.py: every element a Dataset yields passes through EpochInput unchanged.

In-process: each test reads its dataset once with a plain iterator (the reference) and then
through EpochInput for several epochs, and compares every batch component by component
(SparseTensor indices/values/dense_shape, RaggedTensor values and row splits), the structure,
dtypes and static shapes, and the examples counted per epoch.
"""

import numpy as np
import pytest
import tensorflow as tf

from hooks.data import lookahead as lookahead_lib
from hooks.data.epoch_input import EpochInput
from tf_unit import graph, v1  # noqa: F401  (graph: a fresh graph per test)
from tf_unit import train as _train

# Variable-length features of 7 examples: rows of length 0, and with batches of 3 a last batch
# of 1, and a middle batch (examples 3-5) in which "tags" has no value at all.
IDS = [[3, 1], [], [7, 7, 2], [9], [], [4, 5], [8]]
TAGS = [["a"], ["b", "c"], [], [], [], [], ["d", "e", "f"]]
WEIGHTS = [[0.5, 1.5], [], [2.0, 0.0, 1.0], [3.0], [], [1.0, 1.0], [0.25]]
PRICE = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]


def _examples(n=len(IDS)):
  """Serialized tf.Example protos of the first `n` examples."""
  out = []
  for i in range(n):
    feature = {
        "ids": tf.train.Feature(int64_list=tf.train.Int64List(value=IDS[i])),
        "tags": tf.train.Feature(bytes_list=tf.train.BytesList(value=[t.encode() for t in TAGS[i]])),
        "weights": tf.train.Feature(float_list=tf.train.FloatList(value=WEIGHTS[i])),
        "price": tf.train.Feature(float_list=tf.train.FloatList(value=[PRICE[i]])),
    }
    out.append(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
  return out


_SPEC = {"ids": tf.io.VarLenFeature(tf.int64), "tags": tf.io.VarLenFeature(tf.string),
         "weights": tf.io.VarLenFeature(tf.float32),
         "price": tf.io.FixedLenFeature([1], tf.float32)}


def _parsed(n=len(IDS), batch=3):
  """tf.Example records parsed as a CTR job does: a dict of SparseTensors and a dense feature."""
  records = tf.data.Dataset.from_tensor_slices(tf.constant(_examples(n) or [""], tf.string))
  records = records.take(n)
  return records.batch(batch).map(lambda r: tf.io.parse_example(r, _SPEC))


def _ragged(batch=3):
  """A dict of RaggedTensors (ragged_rank 1 of int64 and string, ragged_rank 2 of float32)."""
  nested = [[[1.0], [2.0, 3.0]], [], [[4.0, 5.0, 6.0]], [[], [7.0]], [[8.0]], [], [[9.0], []]]
  return tf.data.Dataset.from_tensor_slices({
      "ids": tf.ragged.constant(IDS, tf.int64),
      "tags": tf.ragged.constant(TAGS, tf.string, row_splits_dtype=tf.int32),
      "nested": tf.ragged.constant(nested, tf.float32),
      "price": tf.constant(PRICE),
  }).batch(batch)


def _reference(dataset):
  """Every batch of one pass, read with a plain iterator in a session of its own."""
  batch = v1.data.make_one_shot_iterator(dataset).get_next()
  out = []
  with v1.Session() as session:
    for _ in range(100):
      try:
        out.append(session.run(batch))
      except tf.errors.OutOfRangeError:
        return out
  raise AssertionError("the reference pass never ended")


def _through_epoch_input(dataset, num_epochs):
  """(batches read through EpochInput in a MonitoredSession, the batch tensors, the input)."""
  epoch_input = EpochInput(dataset, num_epochs=num_epochs, task_name="worker:1")
  batch = epoch_input.get_next()
  got = []
  with v1.train.MonitoredSession(hooks=[epoch_input.hook]) as sess:
    while not sess.should_stop():
      assert len(got) < 100, "the session never stopped"
      got.append(sess.run(batch))
  return got, batch, epoch_input


def _assert_same(got, want, path="batch"):
  """Component by component: same structure, values, dtypes, sparse/ragged layout."""
  if isinstance(want, dict):
    assert sorted(got) == sorted(want), path
    for key in want:
      _assert_same(got[key], want[key], f"{path}[{key!r}]")
  elif isinstance(want, tuple):
    assert isinstance(got, tuple) and len(got) == len(want), path
    for i, (g, w) in enumerate(zip(got, want)):
      _assert_same(g, w, f"{path}[{i}]")
  elif isinstance(want, v1.SparseTensorValue):
    assert isinstance(got, v1.SparseTensorValue), path
    for field in ("indices", "values", "dense_shape"):
      g, w = getattr(got, field), getattr(want, field)
      assert g.dtype == w.dtype and g.shape == w.shape, f"{path}.{field}"
      np.testing.assert_array_equal(g, w, err_msg=f"{path}.{field}")
  elif isinstance(want, tf.compat.v1.ragged.RaggedTensorValue):
    assert isinstance(got, tf.compat.v1.ragged.RaggedTensorValue), path
    assert got.to_list() == want.to_list(), path
    assert len(got.nested_row_splits) == len(want.nested_row_splits), path
    for g, w in zip(got.nested_row_splits, want.nested_row_splits):
      assert g.dtype == w.dtype, path
      np.testing.assert_array_equal(g, w, err_msg=path)
    assert got.flat_values.dtype == want.flat_values.dtype, path
  else:
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape, path
    np.testing.assert_array_equal(got, want, err_msg=path)


class _ReadAtEnd(v1.train.SessionRunHook):

  def __init__(self, fetches):
    self._fetches, self.values = fetches, None

  def end(self, session):
    self.values = session.run(self._fetches)


def _specs(batch):
  return tf.nest.map_structure(tf.type_spec_from_value, batch)


def _round_trip(dataset, num_epochs=2):
  """Asserts that every epoch through EpochInput equals one plain pass; returns the input."""
  want = _reference(dataset)
  got, batch, epoch_input = _through_epoch_input(dataset, num_epochs)
  assert _specs(batch) == dataset.element_spec  # structure, dtypes, static shapes
  assert len(got) == num_epochs * len(want)
  for step, value in enumerate(got):
    _assert_same(value, want[step % len(want)], f"step {step}")
  return epoch_input, want


def test_exports():
  assert sorted(lookahead_lib.__all__) == ["LookAhead", "batch_size"]


def _epochs(epoch_input):
  return [(s.epoch, s.batches, s.examples) for s in epoch_input.hook.history]


class TestSparseFeatures:

  def test_parsed_examples_round_trip_with_empty_rows_empty_batch_and_short_last_batch(self):
    epoch_input, want = _round_trip(_parsed())
    assert [len(b["price"]) for b in want] == [3, 3, 1]  # the last batch is smaller
    assert want[1]["tags"].values.size == 0 and list(want[1]["tags"].dense_shape) == [3, 0]
    assert want[0]["ids"].values.dtype == np.int64 and want[0]["tags"].values.dtype == object
    assert want[0]["weights"].values.dtype == np.float32
    # The first component in nest order ("ids") is sparse: examples from its dense_shape[0].
    assert _epochs(epoch_input) == [(0, 3, 7), (1, 3, 7)]

  def test_batches_where_every_sparse_feature_is_empty(self):
    dataset = _parsed().map(lambda f: {"ids": tf.sparse.retain(f["ids"], f["ids"].values < 0),
                                       "tags": f["tags"]})
    epoch_input, want = _round_trip(dataset)
    assert all(b["ids"].values.size == 0 for b in want)
    assert _epochs(epoch_input) == [(0, 3, 7), (1, 3, 7)]

  def test_examples_are_counted_from_a_sparse_first_component(self):
    dataset = _parsed().map(lambda f: {"a": f["tags"], "b": tf.shape(f["price"])[0]})
    epoch_input, _ = _round_trip(dataset, num_epochs=1)
    assert _epochs(epoch_input) == [(0, 3, 7)]

  def test_empty_shard_runs_no_step(self):
    epoch_input, want = _round_trip(_parsed(n=0), num_epochs=3)
    assert want == []
    assert _epochs(epoch_input) == [(0, 0, 0), (1, 0, 0), (2, 0, 0)]

  def test_make_batched_features_dataset_round_trips(self, tmp_path):
    """The other reader of CTR jobs (docs/mts.md): one pass, files in order, an empty file."""
    from examples import ctr_data  # pylint: disable=g-import-not-at-top
    paths = ctr_data.write_files(str(tmp_path), [5, 0, 3])
    dataset = tf.data.experimental.make_batched_features_dataset(
        paths, 2, ctr_data.parse_spec(ctr_data.linear_columns()), label_key=ctr_data.LABEL,
        num_epochs=1, shuffle=False)
    epoch_input, want = _round_trip(dataset)
    features, _ = epoch_input.get_next()
    assert all(isinstance(features[k], tf.SparseTensor) for k in ("site", "query", "ad"))
    assert [len(b[1]) for b in want] == [2, 2, 2, 2]
    assert _epochs(epoch_input) == [(0, 4, 8), (1, 4, 8)]

  def test_sparse_static_shape_is_kept(self):
    dataset = tf.data.Dataset.from_tensor_slices(np.eye(6, dtype=np.float32)).batch(
        3, drop_remainder=True).map(tf.sparse.from_dense)
    epoch_input, _ = _round_trip(dataset)
    assert epoch_input.get_next().shape.as_list() == [3, 6]
    assert _epochs(epoch_input) == [(0, 2, 6), (1, 2, 6)]


class TestRaggedFeatures:

  def test_ragged_rank_1_and_2_round_trip(self):
    dataset = _ragged()
    assert dataset.element_spec["nested"].ragged_rank == 2
    assert dataset.element_spec["tags"].row_splits_dtype == tf.int32
    epoch_input, want = _round_trip(dataset, num_epochs=3)
    assert [len(b["price"]) for b in want] == [3, 3, 1]
    # The first component in nest order ("ids") is ragged: examples from its nrows.
    assert _epochs(epoch_input) == [(e, 3, 7) for e in range(3)]

  def test_examples_are_counted_from_a_ragged_first_component(self):
    dataset = _ragged(batch=2).map(lambda f: (f["nested"], tf.size(f["price"])))
    epoch_input, _ = _round_trip(dataset, num_epochs=1)
    assert _epochs(epoch_input) == [(0, 4, 7)]

  def test_empty_shard(self):
    epoch_input, want = _round_trip(_ragged().take(0), num_epochs=2)
    assert want == [] and _epochs(epoch_input) == [(0, 0, 0), (1, 0, 0)]


class TestNestedStructures:

  def test_nested_dicts_and_tuples_of_mixed_components(self):
    parsed = _parsed()
    ragged = _ragged()
    dataset = tf.data.Dataset.zip((parsed, ragged)).map(lambda p, r: (
        {"user": {"ids": p["ids"], "history": r["nested"]},
         "context": (p["tags"], r["tags"], {"price": p["price"]})},
        tf.cast(p["price"][:, 0] > 3.0, tf.int64)))
    epoch_input, _ = _round_trip(dataset, num_epochs=2)
    features, labels = epoch_input.get_next()
    assert isinstance(features["context"], tuple) and isinstance(features["user"], dict)
    assert isinstance(features["user"]["ids"], tf.SparseTensor)
    assert isinstance(features["user"]["history"], tf.RaggedTensor)
    assert features["context"][2]["price"].shape.as_list() == [None, 1]
    assert labels.dtype == tf.int64
    assert _epochs(epoch_input) == [(0, 3, 7), (1, 3, 7)]

  def test_a_model_on_sparse_features_trains_each_example_once_per_epoch(self):
    dataset = _parsed()
    epoch_input = EpochInput(dataset, num_epochs=3)
    features = epoch_input.get_next()
    table = v1.get_variable("table", [10, 1], tf.float32, v1.ones_initializer(),
                            use_resource=False)
    total = v1.get_variable("total", [], tf.float32, v1.zeros_initializer(), use_resource=False)
    looked_up = tf.nn.safe_embedding_lookup_sparse(table, features["ids"], features["weights"],
                                                   combiner="sum")
    train_op = v1.assign_add(total, tf.reduce_sum(looked_up))
    read = _ReadAtEnd(total)
    assert _train([epoch_input.hook, read], train_op) == 9
    assert read.values == pytest.approx(3 * sum(sum(w) for w in WEIGHTS))


class TestOtherElements:

  def test_nested_datasets_of_window_pass_too(self):
    dataset = tf.data.Dataset.range(5).window(2)  # elements are datasets (DatasetSpec)
    epoch_input = EpochInput(dataset, num_epochs=2)
    window = tf.data.experimental.get_single_element(epoch_input.get_next().batch(10))
    got = []
    with v1.train.MonitoredSession(hooks=[epoch_input.hook]) as sess:
      while not sess.should_stop():
        assert len(got) < 20
        got.append(list(sess.run(window)))
    assert got == [[0, 1], [2, 3], [4]] * 2
    assert _epochs(epoch_input) == [(0, 3, 3), (1, 3, 3)]  # no batched tensor: 1 per element


class TestBatchSize:

  def test_unbatched_scalars_count_one(self):
    with tf.Graph().as_default(), v1.Session() as session:
      assert session.run(lookahead_lib.batch_size({"a": tf.constant(3)})) == 1

  def test_static_batch_dimension_is_a_constant(self):
    size = lookahead_lib.batch_size(tf.zeros([4, 2]))
    assert size.op.type == "Const"


class TestOpsPerStep:
  """Counted, not timed: the look-ahead's ops that run in one traced training step."""

  @staticmethod
  def _lookahead_ops(dataset, use):
    epoch_input = EpochInput(dataset, num_epochs=1)
    global_step = v1.train.get_or_create_global_step()
    train_op = v1.assign_add(global_step, tf.cast(use(epoch_input.get_next()), tf.int64))
    metadata = v1.RunMetadata()
    with v1.train.MonitoredSession(hooks=[epoch_input.hook]) as sess:
      sess.run(train_op)
      sess.run(train_op, options=v1.RunOptions(trace_level=v1.RunOptions.FULL_TRACE),
               run_metadata=metadata)
      while not sess.should_stop():
        sess.run(train_op)
    return sorted(n.node_name for d in metadata.step_stats.dev_stats for n in d.node_stats
                  if n.node_name.startswith("epochsync_input/"))

  def test_dense_batch(self):
    dataset = tf.data.Dataset.range(40).batch(8)
    ops = self._lookahead_ops(dataset, lambda x: tf.reduce_max(x) * 0 + 1)
    # The queue's dequeue and enqueue, the next Optional and its has-value, the batch's
    # decoding, the batch size's Shape, the iterator's and the queue's handles (was 19).
    assert len(ops) == 8, ops

  def test_sparse_batch_adds_only_its_decoding(self):
    dataset = tf.data.Dataset.range(40).batch(8).map(
        lambda x: tf.sparse.from_dense(tf.reshape(x, [-1, 1])))
    ops = self._lookahead_ops(dataset, lambda x: tf.reduce_max(x.values) * 0 + 1)
    decoding = [op for op in ops if op.startswith("epochsync_input/OptionalGetValue/")]
    assert len(ops) - len(decoding) == 7, ops  # dense_shape is fetched as it is: no Shape op


class TestPlacement:

  def test_the_buffer_stays_with_the_iterator_whatever_the_device_function(self):
    """An Optional lives in its worker's process: a queue on a ps task could not hold it."""
    def to_ps(op):
      return "/job:ps/task:0" if op.type.startswith("FIFOQueue") else ""
    with v1.device("/job:worker/task:1"), v1.device(to_ps):
      EpochInput(tf.data.Dataset.range(4).batch(2), num_epochs=1)
    ops = {op.type: op for op in v1.get_default_graph().get_operations()}
    assert ops["FIFOQueueV2"].device == ops["IteratorV2"].device == "/job:worker/task:1"
