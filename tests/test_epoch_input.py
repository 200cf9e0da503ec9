"""Tests for hooks/data/epoch_input.py: EpochInput, its driver hook and the EpochListener calls.

In-process: one local session, a fresh graph per test, no cluster.
"""

import numpy as np
import pytest
import tensorflow as tf

from hooks.data import epoch_input as epoch_input_lib
from hooks.data.epoch_input import EpochInput, EpochListener, EpochStats
from hooks.errors import ConfigError, EpochIncompleteError
from tf_unit import graph, v1  # noqa: F401  (graph: a fresh graph per test)
from tf_unit import train as _train


SHARD = np.arange(10, dtype=np.float32)  # 10 examples, batches of 4 -> 3 batches (4, 4, 2)


def _model(values=SHARD, batch_size=4, num_epochs=3, task_name="worker:0"):
  """EpochInput over `values`, and a train_op adding the batch's sum into `total`."""
  dataset = tf.data.Dataset.from_tensor_slices(np.asarray(values, np.float32))
  if batch_size:
    dataset = dataset.batch(batch_size)
  epoch_input = EpochInput(dataset, num_epochs=num_epochs, task_name=task_name)
  global_step = v1.train.get_or_create_global_step()
  total = v1.get_variable("total", [], tf.float32, v1.zeros_initializer(), use_resource=False)
  train_op = tf.group(v1.assign_add(total, tf.reduce_sum(epoch_input.get_next()), use_locking=True),
                      v1.assign_add(global_step, 1))
  return epoch_input, train_op, total, global_step


class _Recorder(EpochListener):
  """Records every callback into a shared `log`, reading `total` at each epoch boundary."""

  def __init__(self, name, order, log, total=None, start=None):
    self.name, self.order, self.log, self._total, self._start = name, order, log, total, start

  def start_epoch(self, session):
    return self._start

  def session_created(self, session, start_epoch):
    self.log.append((self.name, "session_created", start_epoch))

  def epoch_started(self, session, epoch):
    value = None if self._total is None else float(session.run(self._total))
    self.log.append((self.name, "epoch_started", epoch, value))

  def epoch_ended(self, session, stats):
    value = None if self._total is None else float(session.run(self._total))
    self.log.append((self.name, "epoch_ended", stats.epoch, stats.batches, stats.examples, value))


class _ReadAtEnd(v1.train.SessionRunHook):
  """Reads `fetches` in `end()` (MonitoredSession.run refuses to run once it should stop)."""

  def __init__(self, fetches):
    self._fetches, self.values = fetches, None

  def end(self, session):
    self.values = session.run(self._fetches)


class _StopAfter(v1.train.SessionRunHook):
  """Requests a stop after `steps` runs, as a step limit of the user's own would."""

  def __init__(self, steps):
    self._left = steps

  def after_run(self, run_context, run_values):
    self._left -= 1
    if self._left <= 0:
      run_context.request_stop()


def test_exports():
  assert sorted(epoch_input_lib.__all__) == ["EpochInput", "EpochListener", "EpochStats"]


class TestEpochInputValidation:

  @pytest.mark.parametrize("num_epochs", [0, -1, 2.0, None])
  def test_rejects_bad_num_epochs(self, num_epochs):
    dataset = tf.data.Dataset.range(3)
    with pytest.raises(ConfigError, match=rf"num_epochs={num_epochs!r} must be an int >= 1 "
                                          r"\(set --epochsync_num_epochs\)"):
      EpochInput(dataset, num_epochs=num_epochs)

  def test_rejects_a_non_dataset(self):
    with pytest.raises(ConfigError, match=r"dataset=list must be a tf\.data\.Dataset holding one "
                                          r"pass over this worker's shard"):
      EpochInput([1, 2, 3], num_epochs=1)

  def test_reports_both_problems_together(self):
    with pytest.raises(ConfigError) as info:
      EpochInput(np.arange(3), num_epochs=0)
    assert "num_epochs=0" in str(info.value) and "dataset=ndarray" in str(info.value)

  def test_config_error_is_a_value_error(self):
    with pytest.raises(ValueError):
      EpochInput("not a dataset", num_epochs=1)

  def test_accepts_one_epoch_and_builds_no_session(self):
    epoch_input = EpochInput(tf.data.Dataset.range(3), num_epochs=1, task_name="chief:0")
    assert (epoch_input.num_epochs, epoch_input.task_name) == (1, "chief:0")
    assert epoch_input.listeners == []


class TestEpochDriver:

  def test_trains_each_example_exactly_once_per_epoch(self):
    epoch_input, train_op, total, global_step = _model()
    log = []
    epoch_input.add_listener(_Recorder("r", 50, log, total=total))
    steps = _train([epoch_input.hook], train_op)
    assert steps == 9
    history = epoch_input.hook.history
    assert [(s.epoch, s.batches, s.examples) for s in history] == [(0, 3, 10), (1, 3, 10),
                                                                    (2, 3, 10)]
    assert all(isinstance(s, EpochStats) and s.started_at <= s.ended_at for s in history)
    assert epoch_input.hook.epoch == 3
    # The running sum at each boundary proves that every example was used once per epoch.
    ended = [entry for entry in log if entry[1] == "epoch_ended"]
    assert ended == [("r", "epoch_ended", e, 3, 10, 45.0 * (e + 1)) for e in range(3)]
    started = [entry for entry in log if entry[1] == "epoch_started"]
    assert started == [("r", "epoch_started", e, 45.0 * e) for e in range(3)]

  def test_final_variables(self):
    epoch_input, train_op, total, global_step = _model()
    final = _ReadAtEnd([total, global_step])
    _train([epoch_input.hook, final], train_op)
    assert final.values == [3 * sum(range(10)), 9]

  def test_unbatched_scalars_count_one_example_per_batch(self):
    epoch_input, train_op, total, _ = _model(values=[1, 2, 3, 4, 5], batch_size=None,
                                             num_epochs=2)
    assert _train([epoch_input.hook], train_op) == 10
    assert [(s.batches, s.examples) for s in epoch_input.hook.history] == [(5, 5), (5, 5)]

  def test_batch_size_divides_the_shard(self):
    epoch_input, train_op, _, _ = _model(values=np.arange(8), batch_size=4, num_epochs=2)
    assert _train([epoch_input.hook], train_op) == 4
    assert [(s.batches, s.examples) for s in epoch_input.hook.history] == [(2, 8), (2, 8)]

  def test_single_batch_shard(self):
    epoch_input, train_op, _, _ = _model(values=[7.0], batch_size=4, num_epochs=3)
    assert _train([epoch_input.hook], train_op) == 3
    assert [(s.batches, s.examples) for s in epoch_input.hook.history] == [(1, 1)] * 3

  def test_empty_shard_runs_no_step_and_ends_every_epoch(self):
    epoch_input, train_op, total, global_step = _model(values=np.zeros([0], np.float32))
    log = []
    epoch_input.add_listener(_Recorder("r", 50, log))
    final = _ReadAtEnd([total, global_step])
    with v1.train.MonitoredSession(hooks=[epoch_input.hook, final]) as sess:
      assert sess.should_stop()
    assert final.values == [0, 0]
    assert [(s.epoch, s.batches, s.examples) for s in epoch_input.hook.history] == [
        (0, 0, 0), (1, 0, 0), (2, 0, 0)]
    assert log == [("r", "session_created", 0)] + [
        entry for e in range(3) for entry in (("r", "epoch_started", e, None),
                                              ("r", "epoch_ended", e, 0, 0, None))]

  def test_a_run_that_does_not_read_input_consumes_no_batch(self):
    epoch_input, train_op, total, global_step = _model()
    final = _ReadAtEnd(total)
    steps, totals = 0, []
    with v1.train.MonitoredSession(hooks=[epoch_input.hook, final]) as sess:
      while not sess.should_stop():
        assert steps < 100
        sess.run(train_op)
        steps += 1
        if sess.should_stop():
          break
        # Runs that read variables only, between two training steps.
        assert sess.run(global_step) == steps
        totals.append(sess.run({"step": global_step, "total": total})["total"])
    assert steps == 9
    assert [s.batches for s in epoch_input.hook.history] == [3, 3, 3]
    assert final.values == 3 * sum(range(10))
    assert totals[:3] == [6.0, 28.0, 45.0]  # batches 0-3, 4-7, 8-9

  def test_fetching_the_features_directly_consumes_a_batch(self):
    epoch_input, _, _, _ = _model(num_epochs=2)
    features = epoch_input.get_next()
    seen = []
    with v1.train.MonitoredSession(hooks=[epoch_input.hook]) as sess:
      while not sess.should_stop():
        assert len(seen) < 100
        seen.append(list(sess.run(features)))
    assert seen == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]] * 2

  def test_dict_elements_keep_structure_and_static_shapes(self):
    dataset = tf.data.Dataset.from_tensor_slices({
        "x": np.arange(30, dtype=np.float32).reshape(10, 3),
        "y": np.arange(10, dtype=np.int64),
        "name": np.array([b"e%d" % i for i in range(10)]),
    }).batch(4)
    epoch_input = EpochInput(dataset, num_epochs=2)
    batch = epoch_input.get_next()
    assert sorted(batch) == ["name", "x", "y"]
    assert batch["x"].shape.as_list() == [None, 3] and batch["x"].dtype == tf.float32
    assert batch["y"].shape.as_list() == [None] and batch["y"].dtype == tf.int64
    assert batch["name"].shape.as_list() == [None] and batch["name"].dtype == tf.string
    got = []
    with v1.train.MonitoredSession(hooks=[epoch_input.hook]) as sess:
      while not sess.should_stop():
        assert len(got) < 100
        got.append(sess.run(batch))
    assert len(got) == 6
    ys = np.concatenate([b["y"] for b in got[:3]])
    np.testing.assert_array_equal(ys, np.arange(10))
    for b in got:  # the components of one element stay together
      np.testing.assert_array_equal(b["x"][:, 0], 3 * b["y"])
      assert list(b["name"]) == [b"e%d" % y for y in b["y"]]
    assert [(s.batches, s.examples) for s in epoch_input.hook.history] == [(3, 10), (3, 10)]

  def test_nested_tuple_elements_keep_structure_and_static_shapes(self):
    features = np.arange(20, dtype=np.float32).reshape(10, 2)
    ids = np.arange(10, dtype=np.int32)
    labels = np.arange(10, dtype=np.float64) * 10
    dataset = tf.data.Dataset.from_tensor_slices(((features, ids), labels)).batch(4)
    epoch_input = EpochInput(dataset, num_epochs=1)
    batch = epoch_input.get_next()
    assert isinstance(batch, tuple) and len(batch) == 2 and isinstance(batch[0], tuple)
    (f, i), label = batch
    assert f.shape.as_list() == [None, 2] and f.dtype == tf.float32
    assert i.shape.as_list() == [None] and i.dtype == tf.int32
    assert label.shape.as_list() == [None] and label.dtype == tf.float64
    got = []
    with v1.train.MonitoredSession(hooks=[epoch_input.hook]) as sess:
      while not sess.should_stop():
        assert len(got) < 100
        got.append(sess.run(batch))
    np.testing.assert_array_equal(np.concatenate([b[0][1] for b in got]), ids)
    for (f_val, i_val), l_val in got:
      np.testing.assert_array_equal(f_val[:, 0], 2 * i_val)
      np.testing.assert_array_equal(l_val, 10 * i_val)

  def test_examples_are_counted_from_the_batched_components(self):
    dataset = tf.data.Dataset.range(10).batch(4).map(
        lambda x: {"batch_size": tf.shape(x)[0], "x": x})
    epoch_input = EpochInput(dataset, num_epochs=1)
    batch = epoch_input.get_next()
    with v1.train.MonitoredSession(hooks=[epoch_input.hook]) as sess:
      while not sess.should_stop():
        sess.run(batch)
    assert [(s.batches, s.examples) for s in epoch_input.hook.history] == [(3, 10)]

  def test_fixed_batch_shape_is_kept(self):
    dataset = tf.data.Dataset.from_tensor_slices(np.zeros([8, 5], np.float32)).batch(
        4, drop_remainder=True)
    batch = EpochInput(dataset, num_epochs=1).get_next()
    assert batch.shape.as_list() == [4, 5]

  @staticmethod
  def _shuffled_epochs(seed):
    dataset = tf.data.Dataset.from_tensor_slices(np.arange(20, dtype=np.int64)).shuffle(
        20, seed=seed, reshuffle_each_iteration=True).batch(20)
    epoch_input = EpochInput(dataset, num_epochs=3)
    batch = epoch_input.get_next()
    got = []
    with v1.train.MonitoredSession(hooks=[epoch_input.hook]) as sess:
      while not sess.should_stop():
        assert len(got) < 10
        got.append(tuple(sess.run(batch)))
    assert len(got) == 3
    assert all(sorted(epoch) == list(range(20)) for epoch in got)
    return got

  def test_each_epoch_reinitialises_the_iterator_so_shuffle_reshuffles(self):
    # 3 identical orders of 20 shuffled examples by chance: probability ~(1/20!)^2.
    assert len(set(self._shuffled_epochs(seed=None))) > 1

  def test_seeded_shuffle_repeats_its_order_as_documented(self):
    assert len(set(self._shuffled_epochs(seed=1))) == 1


class TestAutotuneStall:
  """TensorFlow 2.15 may re-initialise an autotuned iterator only at the end of the autotune
  thread's period, which doubles up to 60 s (a race: seen 4-5 s after 6 s epochs on one or two
  of three workers per epoch). The stall itself is caught by the slow-worker cluster test
  (tests/test_faults.py), whose barrier waits it skews by seconds."""

  def test_autotuning_is_turned_off_when_the_dataset_leaves_it_unset(self):
    epoch_input, _, _, _ = _model()
    assert epoch_input._dataset.options().autotune.enabled is False

  @pytest.mark.parametrize("enabled", [True, False])
  def test_the_users_own_choice_is_kept(self, enabled):
    options = tf.data.Options()
    options.autotune.enabled = enabled
    dataset = tf.data.Dataset.range(3).with_options(options)
    assert EpochInput(dataset, num_epochs=1)._dataset.options().autotune.enabled is enabled


class TestEpochListener:

  def test_base_listener_is_a_no_op(self):
    listener = EpochListener()
    assert listener.order == 50
    assert listener.start_epoch(None) is None
    assert listener.session_created(None, 0) is None
    assert listener.epoch_started(None, 0) is None
    stats = EpochStats(0, 1, 2, 3.0, 4.0)
    assert listener.epoch_ended(None, stats) is None

  def test_listeners_are_called_in_order(self):
    epoch_input, train_op, _, _ = _model(num_epochs=2)
    log = []
    late, early, middle = _Recorder("late", 60, log), _Recorder("early", 5, log), _Recorder(
        "middle", 50, log)
    for listener in (late, early, middle):
      epoch_input.add_listener(listener)
    assert epoch_input.listeners == [early, middle, late]
    assert _train([epoch_input.hook], train_op) == 6
    expected = []
    for event in [("session_created", 0), ("epoch_started", 0, None),
                  ("epoch_ended", 0, 3, 10, None), ("epoch_started", 1, None),
                  ("epoch_ended", 1, 3, 10, None)]:
      expected += [(name,) + event for name in ("early", "middle", "late")]
    assert log == expected

  def test_listeners_property_is_a_copy(self):
    epoch_input, _, _, _ = _model()
    epoch_input.listeners.append(EpochListener())
    assert epoch_input.listeners == []

  def test_start_epoch_from_a_listener_skips_trained_epochs(self):
    epoch_input, train_op, total, _ = _model(num_epochs=3)
    log = []
    epoch_input.add_listener(_Recorder("a", 10, log, start=None))
    epoch_input.add_listener(_Recorder("b", 20, log, start=2))
    assert _train([epoch_input.hook], train_op) == 3
    assert [s.epoch for s in epoch_input.hook.history] == [2]
    assert log[:2] == [("a", "session_created", 2), ("b", "session_created", 2)]
    assert [entry[2] for entry in log if entry[1] == "epoch_started"] == [2, 2]

  def test_start_epoch_is_the_largest_one_reported(self):
    epoch_input, train_op, _, _ = _model(num_epochs=3)
    epoch_input.add_listener(_Recorder("a", 10, [], start=2))
    epoch_input.add_listener(_Recorder("b", 20, [], start=1))
    _train([epoch_input.hook], train_op)
    assert [s.epoch for s in epoch_input.hook.history] == [2]

  def test_all_epochs_already_trained_stops_at_once(self):
    epoch_input, train_op, _, _ = _model(num_epochs=3)
    log = []
    epoch_input.add_listener(_Recorder("r", 10, log, start=3))
    assert _train([epoch_input.hook], train_op) == 0
    assert epoch_input.hook.history == []
    assert log == [("r", "session_created", 3)]


class TestEpochIncomplete:

  def test_breaking_out_of_the_loop_raises_naming_the_epoch(self):
    epoch_input, train_op, _, _ = _model(num_epochs=3, task_name="worker:7")
    with pytest.raises(EpochIncompleteError,
                       match=r"^worker:7: the session ended during epoch 1 of 3 \(after 1 "
                             r"batches of it\)"):
      with v1.train.MonitoredSession(hooks=[epoch_input.hook]) as sess:
        for _ in range(4):  # epoch 0 has 3 batches; the 4th step is in epoch 1
          sess.run(train_op)
    assert [s.epoch for s in epoch_input.hook.history] == [0]

  def test_breaking_out_before_any_step_raises(self):
    epoch_input, _, _, _ = _model(num_epochs=2)
    with pytest.raises(EpochIncompleteError, match=r"during epoch 0 of 2 \(after 0 batches"):
      with v1.train.MonitoredSession(hooks=[epoch_input.hook]):
        pass

  def test_a_stop_requested_by_another_hook_is_named_as_a_likely_cause(self):
    epoch_input, train_op, _, _ = _model(num_epochs=3)
    hooks = [_StopAfter(5), epoch_input.hook]  # a StopAtStepHook is refused at begin()
    with pytest.raises(EpochIncompleteError, match=r"epoch 1 of 3 .*max_steps/StopAtStepHook"):
      _train(hooks, train_op)

  def test_completing_every_epoch_does_not_raise(self):
    epoch_input, train_op, _, _ = _model(num_epochs=1)
    assert _train([epoch_input.hook], train_op) == 3  # end() would raise if not finished

  def test_an_exception_in_the_loop_is_not_masked(self):
    epoch_input, train_op, _, _ = _model(num_epochs=3)
    with pytest.raises(KeyError, match="user error"):
      with v1.train.MonitoredSession(hooks=[epoch_input.hook]) as sess:
        sess.run(train_op)
        raise KeyError("user error")


class TestEpochTensor:
  """epoch_input.epoch_tensor: the epoch of the batch trained in the same step."""

  def _counting_model(self, num_epochs=3, start=None):
    """EpochInput over SHARD and a counter of examples seen in the first epoch only."""
    epoch_input, train_op, total, _ = _model(num_epochs=num_epochs)
    first = v1.get_variable("first_epoch_examples", [], tf.int64, v1.zeros_initializer(),
                            use_resource=False)
    batch = epoch_input.get_next()
    count = tf.cond(tf.equal(epoch_input.epoch_tensor, 0),
                    lambda: v1.assign_add(first, tf.size(batch, out_type=tf.int64)),
                    lambda: tf.identity(first))
    log = []
    epoch_input.add_listener(_Recorder("start", 5, log, start=start))
    return epoch_input, tf.group(train_op, count), first

  def test_is_an_int64_scalar_local_to_the_worker(self):
    epoch_input, _, _ = self._counting_model()
    assert epoch_input.epoch_tensor.dtype == tf.int64
    assert epoch_input.epoch_tensor.shape.rank == 0
    local = [v.op.name for v in v1.local_variables()]
    assert "epochsync_input/epoch" in local
    assert "epochsync_input/epoch" not in [v.op.name for v in v1.global_variables()]

  def _epoch_of_each_step(self, start=0):
    """(epoch_tensor's value at every step, the first-epoch counter at the end)."""
    epoch_input, train_op, first = self._counting_model(start=start)
    epochs, read = [], _ReadAtEnd(first)
    with v1.train.MonitoredSession(v1.train.ChiefSessionCreator(),
                                   hooks=[read, epoch_input.hook]) as sess:
      while not sess.should_stop():
        assert len(epochs) < 20
        epochs.append(int(sess.run([epoch_input.epoch_tensor, train_op])[0]))
    return epochs, read.values

  def test_holds_the_epoch_of_each_step(self):
    epochs, counted = self._epoch_of_each_step()
    assert epochs == [0, 0, 0, 1, 1, 1, 2, 2, 2]  # 3 batches per epoch
    assert counted == 10  # the first epoch's 10 examples, counted once

  def test_starts_at_the_restored_epoch_after_a_restart(self):
    epochs, counted = self._epoch_of_each_step(start=1)
    assert epochs == [1, 1, 1, 2, 2, 2]
    assert counted == 0  # epoch 0 was trained before the restart: nothing to count
