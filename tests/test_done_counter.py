"""Tests for hooks/sync/done_counter.py: WorkerDoneHook and the DONE_OPS collection.

In-process: `epochsync/done_epochs` lives on the local session's own device.
"""

import numpy as np
import pytest
import tensorflow as tf

from hooks.sync import done_counter as done_counter_lib
from hooks import graph_keys
from hooks.epoch.barrier import EpochBarrierHook
from hooks.sync.done_counter import WorkerDoneHook
from hooks.data.epoch_input import EpochInput, EpochListener
from hooks.errors import ConfigError
from tf_unit import LOCAL, graph, v1  # noqa: F401  (graph: a fresh graph per test)
from tf_unit import train as _train


def _model(num_examples=10, num_epochs=3):
  """EpochInput over `num_examples` examples in batches of 4, a train_op and a done counter."""
  epoch_input = EpochInput(tf.data.Dataset.from_tensor_slices(
      np.arange(num_examples, dtype=np.float32)).batch(4), num_epochs=num_epochs)
  global_step = v1.train.get_or_create_global_step()
  train_op = v1.assign_add(global_step, 1, use_locking=True)
  done_count = v1.get_variable("done_count", [], tf.int64, v1.zeros_initializer(),
                               use_resource=False)
  v1.add_to_collection(graph_keys.DONE_OPS, v1.assign_add(done_count, 1).op)
  return epoch_input, tf.group(train_op, epoch_input.get_next()), done_count


class _Spy(EpochListener):
  """After the done hook (order 15): what done_epochs, the counter and the step were then."""
  order = 15

  def __init__(self, *names):
    self._names, self.seen = names, []

  def epoch_ended(self, session, stats):
    g = v1.get_default_graph()
    values = session.run([g.as_graph_element(n) for n in self._names])
    self.seen.append((stats.epoch,) + tuple(v.tolist() for v in values))


def test_exports():
  assert done_counter_lib.__all__ == ["WorkerDoneHook"]


class TestWorkerDoneHookValidation:

  @pytest.fixture
  def epoch_input(self):
    return EpochInput(tf.data.Dataset.range(3), num_epochs=1)

  @pytest.mark.parametrize("num_workers,worker_id", [(0, 0), (-1, 0), (3, 3), (3, -1), (1, 1)])
  def test_rejects(self, epoch_input, num_workers, worker_id):
    with pytest.raises(ConfigError,
                       match=rf"^WorkerDoneHook: (num_workers={num_workers} must be an integer "
                             rf">= 1|worker_id={worker_id} is out of range: it must be in "
                             rf"\[0, {num_workers}\)) \(pass ClusterConfig\."):
      WorkerDoneHook(epoch_input, num_workers=num_workers, worker_id=worker_id)
    assert epoch_input.listeners == []

  @pytest.mark.parametrize("names", [("chief:0",), ("chief:0", "worker:0", "worker:1")],
                           ids=["too-few", "too-many"])
  def test_rejects_a_worker_names_length_mismatch(self, epoch_input, names):
    with pytest.raises(ConfigError, match=rf"worker_names has {len(names)} names but "
                                          r"num_workers=2 \(pass ClusterConfig.worker_names\)"):
      WorkerDoneHook(epoch_input, num_workers=2, worker_id=1, worker_names=names)

  def test_validates_before_any_graph_op_exists(self, epoch_input, graph):
    ops_before = len(graph.get_operations())
    done = WorkerDoneHook(epoch_input, num_workers=3, worker_id=2,
                          worker_names=("chief:0", "worker:0", "worker:1"))
    assert len(graph.get_operations()) == ops_before
    assert done.task_name == "worker:1"
    assert epoch_input.listeners == [done]

  def test_default_task_name(self, epoch_input):
    assert WorkerDoneHook(epoch_input, num_workers=2, worker_id=1).task_name == "worker:1"

  def test_acts_before_the_barrier(self, epoch_input):
    barrier = EpochBarrierHook(epoch_input, num_workers=1, worker_id=0, ps_device=LOCAL)
    done = WorkerDoneHook(epoch_input, num_workers=1, worker_id=0, ps_device=LOCAL)
    assert epoch_input.listeners == [done, barrier]


class TestWorkerDoneHook:

  def test_marks_each_epoch_done_and_runs_the_done_ops_once_per_epoch(self):
    epoch_input, train_op, _ = _model(num_examples=10, num_epochs=3)
    done = WorkerDoneHook(epoch_input, num_workers=1, worker_id=0, ps_device=LOCAL)
    spy = _Spy("epochsync/done_epochs:0", "done_count:0", "global_step:0")
    epoch_input.add_listener(spy)
    assert _train([done, epoch_input.hook], train_op) == 9
    # Signalled after the epoch's last step (3 per epoch), once per epoch.
    assert spy.seen == [(0, [1], 1, 3), (1, [2], 2, 6), (2, [3], 3, 9)]

  def test_empty_shard_is_done_at_once_every_epoch(self):
    epoch_input, train_op, _ = _model(num_examples=0, num_epochs=3)
    done = WorkerDoneHook(epoch_input, num_workers=1, worker_id=0, ps_device=LOCAL)
    spy = _Spy("epochsync/done_epochs:0", "done_count:0", "global_step:0")
    epoch_input.add_listener(spy)
    assert _train([done, epoch_input.hook], train_op) == 0
    assert spy.seen == [(0, [1], 1, 0), (1, [2], 2, 0), (2, [3], 3, 0)]

  def test_marks_only_its_own_entry(self):
    epoch_input, train_op, _ = _model(num_examples=5, num_epochs=2)
    done = WorkerDoneHook(epoch_input, num_workers=3, worker_id=1, ps_device=LOCAL)
    spy = _Spy("epochsync/done_epochs:0", "done_count:0")
    epoch_input.add_listener(spy)
    assert _train([done, epoch_input.hook], train_op) == 4
    assert spy.seen == [(0, [0, 1, 0], 1), (1, [0, 2, 0], 2)]

  def test_every_op_in_the_collection_runs(self):
    epoch_input, train_op, done_count = _model(num_examples=4, num_epochs=2)
    other = v1.get_variable("other", [], tf.int64, v1.zeros_initializer(), use_resource=False)
    v1.add_to_collection(graph_keys.DONE_OPS, v1.assign_add(other, 10))  # a tensor works too
    done = WorkerDoneHook(epoch_input, num_workers=1, worker_id=0, ps_device=LOCAL)
    spy = _Spy("done_count:0", "other:0")
    epoch_input.add_listener(spy)
    _train([done, epoch_input.hook], train_op)
    assert spy.seen == [(0, 1, 10), (1, 2, 20)]

  def test_works_without_done_ops(self):
    epoch_input = EpochInput(tf.data.Dataset.range(6).batch(4), num_epochs=2)
    train_op = epoch_input.get_next()
    done = WorkerDoneHook(epoch_input, num_workers=1, worker_id=0, ps_device=LOCAL)
    spy = _Spy("epochsync/done_epochs:0")
    epoch_input.add_listener(spy)
    assert v1.get_collection(graph_keys.DONE_OPS) == []
    assert _train([done, epoch_input.hook], train_op) == 4
    assert spy.seen == [(0, [1]), (1, [2])]

  def test_restart_marks_the_epoch_it_trains(self):
    # A listener reports that epochs 0 and 1 are trained (as the barrier does after a restart).
    epoch_input, train_op, _ = _model(num_examples=4, num_epochs=3)

    class _Restart(EpochListener):
      order = 5

      def start_epoch(self, session):
        return 2

    epoch_input.add_listener(_Restart())
    done = WorkerDoneHook(epoch_input, num_workers=1, worker_id=0, ps_device=LOCAL)
    spy = _Spy("epochsync/done_epochs:0", "done_count:0")
    epoch_input.add_listener(spy)
    assert _train([done, epoch_input.hook], train_op) == 1
    assert spy.seen == [(2, [3], 1)]
