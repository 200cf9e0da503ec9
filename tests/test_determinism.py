"""hooks.data.determinism: which tf.data stages can read a shard in another order on a rerun."""

import logging as std_logging
import os

import pytest
import tensorflow as tf

from hooks.data import determinism
from tests.tf_unit import graph, v1  # pylint: disable=unused-import; graph: fresh per test

_RANGE = lambda: tf.data.Dataset.range(20)


def _nondeterministic(dataset):
  return determinism.nondeterministic_stages(dataset)


def _one(stages, stage, reason):
  assert len(stages) == 1, stages
  assert stages[0].startswith(stage), stages
  assert stages[0].split(" '")[0] == stage.split(" '")[0], stages  # shuffle, not shuffle_and_...
  assert reason in stages[0], stages


def _options(**kwargs):
  options = tf.data.Options()
  for key, value in kwargs.items():
    setattr(options, key, value)
  return options


class TestShuffle:

  def test_unseeded_shuffle_is_flagged(self):
    _one(_nondeterministic(_RANGE().shuffle(20).batch(4)), "shuffle 'ShuffleDataset'",
         "unseeded")

  def test_unseeded_shuffle_without_reshuffle_is_flagged_too(self):
    _one(_nondeterministic(_RANGE().shuffle(20, reshuffle_each_iteration=False)), "shuffle",
         "unseeded")

  def test_an_op_seed_makes_it_deterministic(self):
    assert _nondeterministic(_RANGE().shuffle(20, seed=0)) == []
    assert _nondeterministic(_RANGE().shuffle(20, seed=7).batch(4)) == []

  def test_a_graph_seed_makes_it_deterministic(self):
    v1.set_random_seed(3)
    assert _nondeterministic(_RANGE().shuffle(20)) == []

  def test_a_graph_seed_set_after_building_does_not(self):
    dataset = _RANGE().shuffle(20)
    v1.set_random_seed(3)
    _one(_nondeterministic(dataset), "shuffle", "unseeded")

  def test_a_seeded_reshuffling_shuffle_repeats_its_order_on_every_fresh_iterator(self):
    """Why a seeded shuffle with reshuffle_each_iteration=True (the default) is not flagged.

    EpochInput re-initialises its iterator every epoch: the order is the same in every epoch
    and in a new session (a resume), so skipping by position is exact. If TensorFlow changed
    that, this test fails and the module must flag such a shuffle.
    """
    dataset = _RANGE().shuffle(20, seed=5)
    assert _nondeterministic(dataset) == []
    iterator = v1.data.make_initializable_iterator(dataset)
    element = iterator.get_next()
    orders = []
    for _ in range(2):  # Two sessions: a run and its resume.
      with v1.Session() as sess:
        for _ in range(3):  # Three epochs, each with a fresh iterator.
          sess.run(iterator.initializer)
          orders.append([int(sess.run(element)) for _ in range(20)])
    assert orders[0] != list(range(20))
    assert all(order == orders[0] for order in orders), orders

  def test_an_unseeded_shuffle_really_differs_on_a_rerun(self):
    dataset = _RANGE().shuffle(20)
    iterator = v1.data.make_initializable_iterator(dataset)
    element = iterator.get_next()
    orders = set()
    for _ in range(3):
      with v1.Session() as sess:
        sess.run(iterator.initializer)
        orders.add(tuple(int(sess.run(element)) for _ in range(20)))
    assert len(orders) > 1  # 3 draws of 20! orders: equal by chance with p < 1e-17

  def test_a_seed_tensor_is_deterministic_and_can_reshuffle_per_epoch(self):
    """E.g. seed=the epoch: another order each epoch, the same one on a rerun of that epoch."""
    epoch = v1.placeholder_with_default(tf.constant(0, tf.int64), [])
    dataset = _RANGE().shuffle(20, seed=epoch)
    assert _nondeterministic(dataset) == []
    iterator = v1.data.make_initializable_iterator(dataset)
    element = iterator.get_next()
    with v1.Session() as sess:
      orders = []
      for e in (0, 1, 0):
        sess.run(iterator.initializer, {epoch: e})
        orders.append([int(sess.run(element)) for _ in range(20)])
    assert orders[0] == orders[2] != orders[1]

  def test_list_files_shuffles_unseeded_by_default(self, tmp_path):
    pattern = os.path.join(tmp_path, "*.txt")
    _one(_nondeterministic(tf.data.Dataset.list_files(pattern)), "shuffle 'list_files/",
         "unseeded")
    assert _nondeterministic(tf.data.Dataset.list_files(pattern, shuffle=False)) == []
    assert _nondeterministic(tf.data.Dataset.list_files(pattern, seed=1)) == []

  def test_shuffle_and_repeat(self):
    fused = tf.data.experimental.shuffle_and_repeat(20, count=1)
    _one(_nondeterministic(_RANGE().apply(fused)), "shuffle_and_repeat", "unseeded")
    seeded = tf.data.experimental.shuffle_and_repeat(20, count=1, seed=2)
    assert _nondeterministic(_RANGE().apply(seeded)) == []

  def test_a_shuffle_inside_an_interleave_function_is_flagged(self):
    files = tf.data.Dataset.range(4)
    dataset = files.interleave(lambda x: tf.data.Dataset.range(x).shuffle(5), cycle_length=2)
    _one(_nondeterministic(dataset), "shuffle", "(in the function of 'InterleaveDataset')")
    seeded = files.interleave(lambda x: tf.data.Dataset.range(x).shuffle(5, seed=1),
                              cycle_length=2)
    assert _nondeterministic(seeded) == []

  def test_two_unseeded_shuffles_are_both_named(self):
    stages = _nondeterministic(_RANGE().shuffle(5).batch(2).shuffle(3))
    assert len(stages) == 2 and all(s.startswith("shuffle ") for s in stages), stages


class TestParallelStages:

  @pytest.mark.parametrize("build,stage", [
      (lambda d: d.map(lambda x: x, num_parallel_calls=2, deterministic=False), "map"),
      (lambda d: d.interleave(tf.data.Dataset.from_tensors, cycle_length=2,
                              num_parallel_calls=2, deterministic=False), "interleave"),
      (lambda d: d.batch(4, num_parallel_calls=2, deterministic=False), "batch"),
  ])
  def test_deterministic_false(self, build, stage):
    _one(_nondeterministic(build(_RANGE()).prefetch(1)), stage, "deterministic=False")

  @pytest.mark.parametrize("build", [
      lambda d: d.map(lambda x: x, num_parallel_calls=2),
      lambda d: d.map(lambda x: x, num_parallel_calls=2, deterministic=True),
      lambda d: d.interleave(tf.data.Dataset.from_tensors, cycle_length=2, num_parallel_calls=2),
      lambda d: d.batch(4, num_parallel_calls=2),
      lambda d: d.map(lambda x: x, num_parallel_calls=tf.data.AUTOTUNE),
  ])
  def test_parallel_stages_left_deterministic(self, build):
    assert _nondeterministic(build(_RANGE())) == []

  def test_sloppy_parallel_interleave(self):
    sloppy = tf.data.experimental.parallel_interleave(tf.data.Dataset.from_tensors,
                                                      cycle_length=2, sloppy=True)
    _one(_nondeterministic(_RANGE().apply(sloppy)), "parallel_interleave", "deterministic=False")
    ordered = tf.data.experimental.parallel_interleave(tf.data.Dataset.from_tensors,
                                                       cycle_length=2)
    assert _nondeterministic(_RANGE().apply(ordered)) == []

  @pytest.mark.parametrize("name", ["deterministic", "experimental_deterministic"])
  def test_options_deterministic_false_flags_default_stages(self, name):
    dataset = _RANGE().map(lambda x: x, num_parallel_calls=2).batch(4)
    _one(_nondeterministic(dataset.with_options(_options(**{name: False}))), "map",
         "tf.data.Options.deterministic=False")

  def test_options_deterministic_false_spares_explicit_and_sequential_stages(self):
    dataset = _RANGE().map(lambda x: x, num_parallel_calls=2, deterministic=True).map(
        lambda x: x + 1).batch(4)
    assert _nondeterministic(dataset.with_options(_options(deterministic=False))) == []

  def test_the_outermost_options_decide(self):
    dataset = _RANGE().map(lambda x: x, num_parallel_calls=2)
    twice = dataset.with_options(_options(deterministic=False)).with_options(
        _options(deterministic=True))
    assert _nondeterministic(twice) == []
    twice = dataset.with_options(_options(deterministic=True)).with_options(
        _options(deterministic=False))
    _one(_nondeterministic(twice), "map", "Options.deterministic=False")


class TestSampling:

  def test_sample_from_datasets(self):
    mixed = tf.data.Dataset.sample_from_datasets([_RANGE(), _RANGE()], weights=[0.5, 0.5])
    _one(_nondeterministic(mixed), "random", "unseeded")
    seeded = tf.data.Dataset.sample_from_datasets([_RANGE(), _RANGE()], seed=4)
    assert _nondeterministic(seeded) == []

  def test_dataset_random(self):
    _one(_nondeterministic(tf.data.Dataset.random().take(5)), "random", "unseeded")
    assert _nondeterministic(tf.data.Dataset.random(seed=3).take(5)) == []

  def test_choose_from_datasets_with_a_fixed_choice_is_deterministic(self):
    choice = tf.data.Dataset.range(2).repeat(3)
    assert _nondeterministic(tf.data.Dataset.choose_from_datasets([_RANGE(), _RANGE()],
                                                                  choice)) == []


def _write_records(tmp_path, files=3, per_file=4):
  paths = []
  for i in range(files):
    path = os.path.join(tmp_path, f"part-{i}.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
      for j in range(per_file):
        writer.write(f"{i}-{j}".encode())
    paths.append(path)
  return paths


def test_a_deterministic_ctr_style_pipeline_is_not_flagged(tmp_path):
  paths = _write_records(tmp_path)
  dataset = (tf.data.TFRecordDataset(paths, num_parallel_reads=2)
             .shuffle(8, seed=11)
             .map(tf.strings.length, num_parallel_calls=2)
             .batch(4, drop_remainder=False)
             .map(lambda x: x * 2, num_parallel_calls=tf.data.AUTOTUNE)
             .prefetch(2))
  assert _nondeterministic(dataset) == []
  files = tf.data.Dataset.from_tensor_slices(paths).interleave(
      tf.data.TFRecordDataset, cycle_length=2, num_parallel_calls=2)
  assert _nondeterministic(files.shard(2, 0).batch(2).cache().prefetch(1)) == []
  assert _nondeterministic(tf.data.Dataset.zip((_RANGE(), _RANGE())).repeat(2)) == []


def test_the_functions_are_found_without_the_graphs_private_lookup_too(graph, monkeypatch):
  """The fallback reads the GraphDef's library (public, but it copies the graph)."""
  dataset = _RANGE().interleave(lambda x: tf.data.Dataset.range(x).shuffle(5), cycle_length=2)
  fast = _nondeterministic(dataset)
  monkeypatch.setattr(type(graph), "_get_function", lambda self, name: None)
  copies = []
  real = type(graph).as_graph_def
  monkeypatch.setattr(type(graph), "as_graph_def",
                      lambda self, *a, **k: copies.append(1) or real(self, *a, **k))
  assert _nondeterministic(dataset) == fast and len(fast) == 1 and copies == [1]


def test_the_graph_is_not_copied_when_its_functions_can_be_looked_up(graph, monkeypatch):
  monkeypatch.setattr(type(graph), "as_graph_def", lambda *a, **k: pytest.fail("copied"))
  dataset = _RANGE().map(lambda x: x, num_parallel_calls=2, deterministic=False).interleave(
      lambda x: tf.data.Dataset.range(x).shuffle(5), cycle_length=2)
  assert len(_nondeterministic(dataset)) == 2


class TestWarnIfNondeterministic:

  def _warnings(self, caplog, dataset):
    caplog.set_level(std_logging.WARNING)
    caplog.clear()
    stages = determinism.warn_if_nondeterministic(dataset, "worker:1")
    return stages, [r for r in caplog.records if r.levelno >= std_logging.WARNING]

  def test_one_warning_naming_every_stage_and_the_fix(self, caplog):
    dataset = _RANGE().shuffle(20).map(lambda x: x, num_parallel_calls=2,
                                       deterministic=False)
    stages, records = self._warnings(caplog, dataset)
    assert len(stages) == 2 and len(records) == 1, (stages, records)
    message = records[0].getMessage()
    assert message.startswith("worker:1: the input pipeline can read its shard in another order")
    assert all(stage in message for stage in stages)
    assert "mid-epoch checkpoint skips the batches" in message
    assert "seed the shuffle" in message and "deterministic" in message

  def test_a_pipeline_it_cannot_read_is_an_info_line_not_an_error(self, caplog, monkeypatch):
    def broken(dataset):
      raise ValueError("GraphDef cannot be larger than 2GB")
    monkeypatch.setattr(determinism, "nondeterministic_stages", broken)
    caplog.set_level(std_logging.INFO)
    assert determinism.warn_if_nondeterministic(_RANGE().shuffle(3), "worker:1") == []
    assert [r.levelno for r in caplog.records] == [std_logging.INFO]
    assert "could not inspect the input pipeline's order (ValueError: GraphDef" in (
        caplog.records[0].getMessage())

  def test_silent_for_a_deterministic_pipeline(self, caplog):
    stages, records = self._warnings(caplog, _RANGE().shuffle(20, seed=1).batch(4))
    assert stages == [] and records == []
