"""A restored work queue: which units a mid-epoch checkpoint holds whole, in part or not at all.

The plan (hooks.workqueue.resume_plan) is checked on queue states built by real claims; the
claims after the chief writes it hand out the units in flight first, each with its skip, then
the units not started, and never a unit the model holds whole.
"""

import os

import numpy as np
import pytest
import tensorflow as tf

from hooks.workqueue import WorkUnit, fingerprint, queue_graph
from hooks.workqueue.resume_plan import plan_resume
from local_queue import LocalQueue

_v1 = tf.compat.v1


class _Queue(LocalQueue):
  """Unshuffled (unit i is the i-th handed out); each worker's claims numbered for it."""

  def __init__(self, units=6, workers=2):
    super().__init__(units, workers, seed=0, shuffle=False, fingerprint="0" * 16)
    self.seq = {}

  def take(self, worker, at, finished=(-1, 0, 0), epoch=0):
    """The worker's next claim: (unit, skip)."""
    seq = self.seq.get(worker, 0)
    self.seq[worker] = seq + 1
    return self.claim_and_skip(epoch, worker, seq, at, finished)

  def write(self, vector):
    super().write(vector)
    self.seq = {}  # A resumed epoch: every worker's claims are numbered from 0 again.

  def parts(self):
    return self.ops.layout.parts(self.vector())


def _synchronous_epoch_until_a_save():
  """Two workers, units of 3 batches: worker 0 takes 0, 2, 4; worker 1 takes 1, 3, 5."""
  queue = _Queue()
  assert queue.take(0, at=0) == (0, 0)
  assert queue.take(1, at=0) == (1, 0)
  assert queue.take(0, at=3, finished=(0, 3, 24)) == (2, 0)
  assert queue.take(1, at=3, finished=(1, 3, 24)) == (3, 0)
  assert queue.take(0, at=6, finished=(2, 3, 24)) == (4, 0)  # worker 0 is one step ahead
  return queue


def test_a_synchronous_save_at_step_s_holds_units_whole_in_part_or_not_at_all():
  queue = _synchronous_epoch_until_a_save()
  # Saved after 5 steps: units 0 and 1 whole (steps 0-2), 2 and 3 in part (steps 3-4: 2 of 3
  # batches), unit 4 (taken for step 6) not at all, unit 5 never handed out.
  plan = plan_resume(queue.vector(), queue.ops.layout, lambda owner: 5)
  assert plan.done == [0, 1]
  assert plan.in_flight == {2: 2, 3: 2}
  assert plan.not_started == [4, 5]
  assert "2 units done, 2 in flight (2 after 2 batches, 3 after 2 batches), 2 not started" in (
      plan.describe())


def test_a_finished_unit_whose_last_batch_the_model_lacks_is_in_flight():
  queue = _synchronous_epoch_until_a_save()
  plan = plan_resume(queue.vector(), queue.ops.layout, lambda owner: 5 if owner else 6)
  assert plan.done == [0, 1, 2] and plan.in_flight == {3: 2}


def test_after_the_resume_the_claims_hand_out_units_in_flight_first_with_their_skip():
  queue = _synchronous_epoch_until_a_save()
  plan = plan_resume(queue.vector(), queue.ops.layout, lambda owner: 5)
  queue.write(plan.state)
  parts = queue.parts()
  assert int(parts["next"]) == 2 and int(parts["resumed_next"]) == 2
  assert list(parts["owner"][:2]) == [0, 1]  # the done units keep their record
  # Three workers now (another count than the save's): every one starts at step 5.
  assert queue.take(2, at=5) == (2, 2)
  assert queue.take(0, at=5) == (3, 2)
  assert queue.take(1, at=5) == (4, 0)
  assert queue.take(2, at=6, finished=(2, 3, 24)) == (5, 0)
  assert queue.take(0, at=6, finished=(3, 3, 24)) == (-1, 0)
  parts = queue.parts()
  # first_batch is the owner's position minus the skip: batch k went into step first_batch + k.
  assert int(parts["first_batch"][2]) == 3 and int(parts["first_batch"][3]) == 3
  assert int(parts["first_batch"][5]) == 6


def test_a_second_resume_counts_the_batches_of_both_attempts():
  queue = _synchronous_epoch_until_a_save()
  queue.write(plan_resume(queue.vector(), queue.ops.layout, lambda owner: 5).state)
  assert queue.take(1, at=5) == (2, 2)  # worker 1 finishes unit 2's last batch at step 5
  assert queue.take(1, at=6, finished=(2, 3, 24)) == (3, 2)  # unit 3 from step 6
  # Saved after step 6: unit 3's batch 2 (step 6) not yet; after step 7: all 3 of its batches,
  # but not finished (worker 1 had not asked for its next unit): in flight, with nothing left.
  plan = plan_resume(queue.vector(), queue.ops.layout, lambda owner: 6)
  assert plan.done == [0, 1, 2] and plan.in_flight == {3: 2}
  plan = plan_resume(queue.vector(), queue.ops.layout, lambda owner: 7)
  assert plan.done == [0, 1, 2] and plan.in_flight == {3: 3}
  assert plan.not_started == [4, 5]


def test_asynchronous_positions_are_each_owners_own():
  queue = _Queue()
  queue.take(0, at=0)               # unit 0 to worker 0
  queue.take(1, at=0)               # unit 1 to worker 1
  queue.take(0, at=3, finished=(0, 3, 24))  # unit 2 to worker 0 at its batch 3
  applied = {0: 4, 1: 1}
  plan = plan_resume(queue.vector(), queue.ops.layout, applied.get)
  assert plan.done == [0] and plan.in_flight == {1: 1, 2: 1}
  assert plan.not_started == [3, 4, 5]


@pytest.mark.parametrize("workers", [1, queue_graph.MAX_WORKERS])
def test_the_state_has_the_same_size_for_any_worker_count(workers):
  with tf.Graph().as_default():
    ops = queue_graph.build(5, workers, 0, True, "/cpu:0")
  assert ops.vector.shape.as_list() == [queue_graph.Layout(5).size]


def test_more_workers_than_the_queue_serves_is_a_config_error():
  from hooks.errors import ConfigError  # pylint: disable=g-import-not-at-top
  with tf.Graph().as_default(), pytest.raises(ConfigError, match="at most 1024 workers"):
    queue_graph.build(5, queue_graph.MAX_WORKERS + 1, 0, True, "/cpu:0")


def test_the_plan_of_a_fresh_epoch_keeps_nothing():
  queue = _Queue()
  queue.take(0, at=0)
  plan = plan_resume(queue.vector(), queue.ops.layout, lambda owner: 0)
  assert plan.done == [] and plan.in_flight == {} and plan.not_started == list(range(6))
  assert np.array_equal(queue.ops.layout.parts(plan.state)["owner"], [-1] * 6)


class _Barrier:
  def add_chief_action(self, action):
    self.action = action


def _checkpoint_with_a_queue(model_dir, units):
  """A mid-epoch checkpoint of epoch 1 (synchronous step 3) whose queue handed out unit 0."""
  from hooks.checkpoint import mid_epoch  # pylint: disable=g-import-not-at-top
  graph = tf.Graph()
  with graph.as_default():
    ops = queue_graph.build(len(units), 2, 0, False, "", fingerprint(units))
    position = mid_epoch.state(2, "")["position"]
    _v1.train.create_global_step()
    saver = _v1.train.Saver()
    init = _v1.global_variables_initializer()
  with _v1.Session(graph=graph) as session:
    session.run(init)
    session.run(ops.claim, {ops.epoch: 1, ops.worker: 0, ops.seq: 0, ops.at_batch: 0,
                            ops.finished: -1, ops.finished_batches: 0, ops.finished_examples: 0})
    session.run(position.assign([1, 3, 2, 1, 1]))
    saver.save(session, os.path.join(model_dir, "mid_epoch", "model.ckpt-epoch0001"),
               global_step=3)


def _resume_with(model_dir, units, unit_fn=lambda unit: tf.data.Dataset.range(2).batch(1)):
  """UnitResumeHook of a job over `units`, after its session restored the checkpoint."""
  from hooks.checkpoint import mid_epoch  # pylint: disable=g-import-not-at-top
  from hooks.checkpoint.unit_resume import UnitResumeHook  # pylint: disable=g-import-not-at-top
  from hooks.workqueue.input import work_queue_input  # pylint: disable=g-import-not-at-top
  graph = tf.Graph()
  with graph.as_default():
    epoch_input = work_queue_input(units, unit_fn, 1, 2, 0, "worker:0", ps_device="")
    mid_epoch.state(2, "")
    _v1.train.create_global_step()
    hook = UnitResumeHook(epoch_input, model_dir, _Barrier(), ["worker:0", "worker:1"])
    restore = _v1.train.Saver(var_list=[v for v in _v1.global_variables()
                                        if v.op.name == "epochsync/workqueue/state"])
    init = _v1.global_variables_initializer()
  with _v1.Session(graph=graph) as session:
    session.run(init)
    if len(units) == 3:
      restore.restore(session, mid_epoch.checkpoint_to_restore(model_dir))
    hook.after_create_session(session, None)
  return hook


def test_a_resume_refuses_units_that_changed_since_the_checkpoint(tmp_path):
  from hooks.errors import ConfigError  # pylint: disable=g-import-not-at-top
  units = [WorkUnit("", 0, 16), WorkUnit("", 16, 32), WorkUnit("", 32, 48)]
  model_dir = str(tmp_path)
  _checkpoint_with_a_queue(model_dir, units)
  hook = _resume_with(model_dir, units)
  assert hook.plan.in_flight == {0: 3} and hook.plan.not_started == [1, 2]
  moved = [WorkUnit("", 0, 16), WorkUnit("", 16, 40), WorkUnit("", 40, 48)]
  with pytest.raises(ConfigError, match=r"the units changed since the mid-epoch checkpoint of "
                                        r"epoch 1 was written \(their fingerprint"):
    _resume_with(model_dir, moved)
  with pytest.raises(ConfigError, match=r"holds a work queue of another number of units \(3 "
                                        r"there, 4 here\)"):
    _resume_with(model_dir, units + [WorkUnit("", 48, 64)])


def test_units_done_at_an_earlier_resume_stay_done_whatever_the_counts_now():
  """Asynchronous: after a resume every worker counts its batches from 0 again, so a unit done
  before it (taken at an owner's batch 3) must not be judged by the new counts."""
  queue = _Queue()
  queue.take(0, at=0)
  queue.take(0, at=3, finished=(0, 3, 24))  # unit 1 to worker 0 at its batch 3
  queue.write(plan_resume(queue.vector(), queue.ops.layout, {0: 4, 1: 0}.get).state)
  assert list(queue.parts()["order"][:1]) == [0] and int(queue.parts()["resumed_next"]) == 1
  assert queue.take(1, at=0) == (1, 1)  # unit 1 after its batch the model holds
  plan = plan_resume(queue.vector(), queue.ops.layout, {0: 0, 1: 1}.get)
  assert plan.done == [0] and plan.in_flight == {1: 2}


def test_a_unit_the_model_holds_whole_is_done_at_the_resume_though_its_end_was_not_recorded(
    tmp_path):
  """The save came between the unit's last step and its owner's next claim: where tf.data
  knows the unit's batch count (a range batched), the unit is done, not handed out again."""
  units = [WorkUnit("", 0, 24), WorkUnit("", 24, 48), WorkUnit("", 48, 72)]
  model_dir = str(tmp_path)
  _checkpoint_with_a_queue(model_dir, units)  # unit 0: the model holds 3 of its batches
  whole = _resume_with(model_dir, units, lambda unit: tf.data.Dataset.range(
      unit.start, unit.start + unit.count).batch(8))  # 3 batches: all held
  assert whole.plan.done == [0] and whole.plan.in_flight == {}
  parts = queue_graph.Layout(len(units)).parts(whole.plan.state)
  assert int(parts["batches"][0]) == 3 and int(parts["examples"][0]) == 24
  partial = _resume_with(model_dir, units, lambda unit: tf.data.Dataset.range(
      unit.start, unit.start + unit.count).batch(4))  # 6 batches: 3 held
  assert partial.plan.done == [] and partial.plan.in_flight == {0: 3}
