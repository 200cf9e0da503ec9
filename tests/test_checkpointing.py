"""Tests for hooks/checkpoint/epoch_save.py: ChiefSaveAfterBarrierHook, one checkpoint per epoch.

In-process: a one-worker (chief-only) barrier whose state lives on the local session's device.
"""

import glob
import os

import numpy as np
import pytest
import tensorflow as tf

from hooks.checkpoint import epoch_save as checkpointing_lib
from hooks.epoch.audit import read_audit
from hooks.epoch.barrier import EpochBarrierHook
from hooks.checkpoint.epoch_save import ChiefSaveAfterBarrierHook, epoch_checkpoint_prefix
from hooks.sync.done_counter import WorkerDoneHook
from hooks.data.epoch_input import EpochInput
from hooks.errors import ConfigError
from tf_unit import LOCAL, graph, v1  # noqa: F401  (graph: a fresh graph per test)
from tf_unit import train as _train


def _model(num_examples=10, num_epochs=3, audit_dir=None):
  """A chief alone: 10 examples in batches of 4 (3 steps per epoch), `total` sums them."""
  epoch_input = EpochInput(tf.data.Dataset.from_tensor_slices(
      np.arange(num_examples, dtype=np.float32)).batch(4), num_epochs=num_epochs,
      task_name="chief:0")
  global_step = v1.train.get_or_create_global_step()
  total = v1.get_variable("total", [], tf.float32, v1.zeros_initializer(), use_resource=False)
  train_op = tf.group(v1.assign_add(total, tf.reduce_sum(epoch_input.get_next())),
                      v1.assign_add(global_step, 1))
  barrier = EpochBarrierHook(epoch_input, num_workers=1, worker_id=0, worker_names=("chief:0",),
                             audit_dir=audit_dir, ps_device=LOCAL)
  return epoch_input, barrier, train_op


class _Recorder(v1.train.CheckpointSaverListener):

  def __init__(self, checkpoint_dir):
    self.calls, self._dir = [], checkpoint_dir

  def begin(self):
    self.calls.append(("begin",))

  def before_save(self, session, global_step_value):
    self.calls.append(("before_save", global_step_value, self._saved()))

  def after_save(self, session, global_step_value):
    self.calls.append(("after_save", global_step_value, self._saved()))

  def end(self, session, global_step_value):
    self.calls.append(("end", global_step_value))

  def _saved(self):
    return len(glob.glob(os.path.join(self._dir, "*.index")))


def test_exports():
  assert sorted(checkpointing_lib.__all__) == ["ChiefSaveAfterBarrierHook",
                                               "epoch_checkpoint_prefix"]


def test_epoch_checkpoint_prefix():
  assert epoch_checkpoint_prefix("/m", 2) == os.path.join("/m", "model.ckpt-epoch0002")
  assert epoch_checkpoint_prefix("/m", 12345, "w") == os.path.join("/m", "w-epoch12345")


class TestChiefSaveAfterBarrierHookValidation:

  def test_rejects_a_non_chief_barrier(self, tmp_path):
    epoch_input = EpochInput(tf.data.Dataset.range(3), num_epochs=1)
    barrier = EpochBarrierHook(epoch_input, num_workers=2, worker_id=1,
                               worker_names=("chief:0", "worker:0"))
    with pytest.raises(ConfigError, match=r"runs on the chief only, but the barrier is "
                                          r"worker:0's; add it to chief_only_hooks"):
      ChiefSaveAfterBarrierHook(barrier, str(tmp_path))
    assert barrier._chief_actions == []

  @pytest.mark.parametrize("checkpoint_dir", ["", None])
  def test_rejects_an_empty_checkpoint_dir(self, checkpoint_dir):
    epoch_input, barrier, _ = _model()
    with pytest.raises(ConfigError, match=r"checkpoint_dir is empty; pass the model_dir"):
      ChiefSaveAfterBarrierHook(barrier, checkpoint_dir)

  def test_needs_a_global_step(self, tmp_path):
    epoch_input = EpochInput(tf.data.Dataset.range(3), num_epochs=1)
    barrier = EpochBarrierHook(epoch_input, num_workers=1, worker_id=0, ps_device=LOCAL)
    save = ChiefSaveAfterBarrierHook(barrier, str(tmp_path))
    with pytest.raises(RuntimeError, match=r"get_or_create_global_step\(\)"):
      save.begin()


class TestChiefSaveAfterBarrierHook:

  def test_saves_exactly_one_checkpoint_per_epoch(self, tmp_path):
    model_dir = str(tmp_path / "model")  # created by the first save
    epoch_input, barrier, train_op = _model(num_epochs=3, audit_dir=model_dir)
    listener = _Recorder(model_dir)
    save = ChiefSaveAfterBarrierHook(barrier, model_dir, listeners=[listener])
    assert _train([barrier, save, epoch_input.hook], train_op) == 9

    expected = {e: os.path.join(model_dir, f"model.ckpt-epoch{e:04d}-{3 * (e + 1)}")
                for e in range(3)}
    assert save.saved == expected
    index_files = sorted(glob.glob(os.path.join(model_dir, "*.index")))
    assert index_files == [expected[e] + ".index" for e in range(3)]
    assert tf.train.latest_checkpoint(model_dir) == expected[2]
    for e, path in expected.items():
      assert tf.train.load_variable(path, "epochsync/completed_epochs") == e + 1
      assert tf.train.load_variable(path, "global_step") == 3 * (e + 1)
      assert tf.train.load_variable(path, "total") == 45.0 * (e + 1)
    # The audit line of each epoch names its checkpoint and when it was saved.
    audit = read_audit(model_dir)
    assert [line["checkpoint"] for line in audit] == [expected[e] for e in range(3)]
    assert all(line["saved_at"] <= line["released_at"] for line in audit)

    assert listener.calls == [("begin",)] + [
        call for e in range(3) for call in (("before_save", 3 * (e + 1), e),
                                            ("after_save", 3 * (e + 1), e + 1))] + [("end", 9)]

  def test_checkpoint_includes_the_done_signal(self, tmp_path):
    epoch_input, barrier, train_op = _model(num_epochs=2)
    done = WorkerDoneHook(epoch_input, num_workers=1, worker_id=0, ps_device=LOCAL)
    save = ChiefSaveAfterBarrierHook(barrier, str(tmp_path))
    _train([done, barrier, save, epoch_input.hook], train_op)
    assert [list(tf.train.load_variable(save.saved[e], "epochsync/done_epochs"))
            for e in range(2)] == [[1], [2]]

  def test_empty_shard_saves_once_per_epoch(self, tmp_path):
    epoch_input, barrier, train_op = _model(num_examples=0, num_epochs=2)
    listener = _Recorder(str(tmp_path))
    save = ChiefSaveAfterBarrierHook(barrier, str(tmp_path), listeners=[listener])
    assert _train([barrier, save, epoch_input.hook], train_op) == 0
    assert save.saved == {e: str(tmp_path / f"model.ckpt-epoch{e:04d}-0") for e in range(2)}
    assert [tf.train.load_variable(save.saved[e], "epochsync/completed_epochs")
            for e in range(2)] == [1, 2]
    assert [c[0] for c in listener.calls] == ["begin", "before_save", "after_save",
                                              "before_save", "after_save", "end"]

  def test_explicit_saver_and_basename(self, tmp_path):
    epoch_input, barrier, train_op = _model(num_epochs=1)
    saver = v1.train.Saver([v1.train.get_global_step()])
    save = ChiefSaveAfterBarrierHook(barrier, str(tmp_path), saver=saver,
                                     checkpoint_basename="steps")
    _train([barrier, save, epoch_input.hook], train_op)
    path = str(tmp_path / "steps-epoch0000-3")
    assert save.saved == {0: path}
    assert tf.train.load_variable(path, "global_step") == 3
    names = [name for name, _ in tf.train.list_variables(path)]
    assert names == ["global_step"]

  def test_restart_resumes_after_the_last_saved_epoch(self, tmp_path):
    model_dir = str(tmp_path)
    with tf.Graph().as_default():
      epoch_input, barrier, train_op = _model(num_epochs=2)
      save = ChiefSaveAfterBarrierHook(barrier, model_dir)
      assert _train([barrier, save, epoch_input.hook], train_op, checkpoint_dir=model_dir) == 6
    with tf.Graph().as_default():
      epoch_input, barrier, train_op = _model(num_epochs=3)
      listener = _Recorder(model_dir)
      save = ChiefSaveAfterBarrierHook(barrier, model_dir, listeners=[listener])
      assert _train([barrier, save, epoch_input.hook], train_op, checkpoint_dir=model_dir) == 3
    assert [s.epoch for s in epoch_input.hook.history] == [2]
    assert save.saved == {2: os.path.join(model_dir, "model.ckpt-epoch0002-9")}
    assert tf.train.load_variable(save.saved[2], "total") == 3 * 45.0
    assert len(glob.glob(os.path.join(model_dir, "*.index"))) == 3
    assert [c[0] for c in listener.calls] == ["begin", "before_save", "after_save", "end"]


class TestGraphFiles:
  """graph.pbtxt and the graph events are written off the chief's way to the start barrier."""

  def test_not_written_before_the_first_step_and_written_by_the_first_save(self, tmp_path):
    epoch_input, barrier, train_op = _model(num_epochs=1)
    saver = v1.train.Saver()
    save = ChiefSaveAfterBarrierHook(barrier, str(tmp_path), saver=saver)
    save.begin()
    init = v1.global_variables_initializer()  # before the writer: it serializes the graph
    with v1.Session() as sess:
      save.after_create_session(sess, None)
      assert not os.path.exists(tmp_path / "graph.pbtxt")  # nothing on the start-up path
      save.before_run(None)  # the first step starts the writer; the first save waits for it
      sess.run(init)
      save._save(sess, 0, {})  # pylint: disable=protected-access
      assert os.path.exists(tmp_path / "graph.pbtxt")
      assert glob.glob(str(tmp_path / "events.out.tfevents.*"))

  def test_a_session_without_steps_writes_them_at_its_end(self, tmp_path):
    epoch_input, barrier, train_op = _model(num_epochs=1)
    save = ChiefSaveAfterBarrierHook(barrier, str(tmp_path), saver=v1.train.Saver())
    save.begin()
    with v1.Session() as sess:
      sess.run(v1.global_variables_initializer())
      save.after_create_session(sess, None)
      save.end(sess)
    graph_def = tf.compat.v1.GraphDef()
    from google.protobuf import text_format  # pylint: disable=g-import-not-at-top
    with open(tmp_path / "graph.pbtxt") as f:
      text_format.Parse(f.read(), graph_def)
    assert any(node.name == "total" for node in graph_def.node)
