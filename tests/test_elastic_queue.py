"""The work queue's elastic side on a local session: WAIT while a unit is in flight, the chief's
reclaim of a lost worker's unit after the batches the model holds, and the fence."""

from types import SimpleNamespace

import numpy as np
import pytest
import tensorflow as tf

from hooks import graph_keys
from hooks.data.epoch_listener import EpochStats
from hooks.errors import FENCED_MARK, WorkerFencedError, WorkQueueError
from hooks.workqueue import elastic_graph, queue_graph
from hooks.workqueue.audit import UnitAudit
from hooks.workqueue.claims import UnitClaims

_v1 = tf.compat.v1
from hooks.workqueue.unit_passes import UnitPasses
from hooks.workqueue.units import WorkUnit
from local_queue import LocalQueue

WAIT, FENCED = queue_graph.WAIT, queue_graph.FENCED


def _same(before, after):
  return all(np.array_equal(before[k], after[k]) for k in before)


def test_without_elastic_none_left_ends_the_epoch_even_with_a_unit_in_flight():
  queue = LocalQueue(units=2, workers=2)
  queue.claim(0, worker=0, seq=0)
  queue.claim(0, worker=1, seq=0)
  assert queue.claim(0, worker=0, seq=1, at=4, finished=(queue.state()["last"][0], 4, 32)) == -1
  assert queue.ops.reclaim is None


def test_none_left_with_a_unit_in_flight_answers_wait_until_it_is_finished():
  queue = LocalQueue(units=2, workers=2, elastic=True)
  first = queue.claim(0, worker=0, seq=0)
  second = queue.claim(0, worker=1, seq=0)
  assert queue.claim(0, worker=0, seq=1, at=4, finished=(first, 4, 32)) == WAIT
  before = queue.state()
  assert queue.claim(0, worker=0, seq=1, at=4, finished=(first, 4, 32)) == WAIT  # a retry
  assert _same(before, queue.state())
  assert queue.claim(0, worker=0, seq=2, at=4) == WAIT
  assert queue.claim(0, worker=1, seq=1, at=6, finished=(second, 6, 48)) == -1
  assert queue.claim(0, worker=0, seq=3, at=4) == -1
  assert list(queue.state()["batches"][[first, second]]) == [4, 6]


def test_a_lost_workers_unit_goes_back_after_the_batches_the_model_holds():
  queue = LocalQueue(units=3, workers=3, elastic=True)
  first = queue.claim(0, worker=0, seq=0)
  lost = queue.claim(0, worker=1, seq=0, at=10)  # worker:1 is at its 10th batch of the epoch
  third = queue.claim(0, worker=2, seq=0)
  assert queue.claim(0, worker=0, seq=1, at=5, finished=(first, 5, 40)) == WAIT
  queue.pass_gate(worker=1, times=3)  # 3 of its batches passed the gate: the model holds them
  assert queue.reclaim_result(0, worker=1) == (lost, 3, 0, 13)
  state = queue.state()
  assert int(state["next"]) == 2 and int(state["owner"][lost]) == -1
  assert list(state["order"][:2]) == [first, third] and int(state["order"][2]) == lost
  before = queue.state()
  assert queue.reclaim(0, worker=1) == (-1, 0)  # run twice: nothing more
  assert _same(before, queue.state())
  assert queue.claim_and_skip(0, worker=0, seq=2, at=5) == (lost, 3)
  assert int(queue.state()["first_batch"][lost]) == 5 - 3
  assert queue.claim(0, worker=1, seq=1, at=14, finished=(lost, 14, 112)) == FENCED
  assert int(queue.state()["batches"][lost]) == -1  # the fenced worker recorded nothing
  assert queue.claim(0, worker=0, seq=3, at=9, finished=(lost, 7, 56)) == WAIT  # third's
  assert queue.claim(0, worker=2, seq=1, at=8, finished=(third, 8, 64)) == -1
  assert list(queue.state()["batches"][[first, lost, third]]) == [5, 7, 8]


def test_a_unit_resumed_with_a_skip_is_reclaimed_after_all_the_batches_the_model_holds():
  queue = LocalQueue(units=2, workers=2, elastic=True, shuffle=False)
  queue.claim(0, worker=0, seq=0)
  parts = queue.ops.layout.parts(queue.vector())
  parts["skip"][1] = 4  # a resumed checkpoint held 4 batches of unit 1
  header, fields = queue.ops.layout.join(parts)
  queue.write(np.concatenate([np.array(header, np.int64)] + fields))
  assert queue.claim_and_skip(0, worker=1, seq=0, at=2) == (1, 4)  # first_batch 2 - 4 = -2
  queue.pass_gate(worker=1, times=3)
  assert queue.reclaim(0, worker=1) == (1, 7)  # 4 held before + 3 trained since


def test_a_lost_worker_with_no_unit_in_flight_is_fenced_into_the_next_epochs():
  queue = LocalQueue(units=2, workers=2, elastic=True)
  first = queue.claim(0, worker=1, seq=0)
  second = queue.claim(0, worker=1, seq=1, at=3, finished=(first, 3, 24))
  assert queue.claim(0, worker=1, seq=2, at=5, finished=(second, 2, 16)) == -1
  before = queue.state()
  assert queue.reclaim(0, worker=1) == (-1, 0)
  after = queue.state()
  assert all(np.array_equal(before[k], after[k]) for k in before if k != "claims")
  assert queue.claim(1, worker=0, seq=0) >= 0  # epoch 1 starts its queue
  assert queue.claim(1, worker=1, seq=0) == FENCED
  assert int(queue.state()["next"]) == 1 and int(queue.state()["claims"][1]) <= -2


def test_a_fenced_worker_woken_after_the_queue_moved_on_is_told_it_is_fenced():
  """A frozen worker wakes after the chief fenced it and the epoch it froze in ended: its claim
  of that epoch answers FENCED (relaunch it), not STALE (restart the whole job). Seen in
  bench.elastic_chaos: the woken process said to restart the whole job."""
  queue = LocalQueue(units=2, workers=2, elastic=True)
  queue.claim(0, worker=1, seq=0)
  queue.reclaim(0, worker=1)
  assert queue.claim(1, worker=0, seq=0) >= 0  # epoch 1 starts its queue
  assert queue.claim(0, worker=1, seq=1) == FENCED
  assert queue.claim(0, worker=0, seq=5) == queue_graph.STALE  # a member behind: STALE


def test_a_reclaim_of_another_epoch_takes_nothing_back():
  queue = LocalQueue(units=2, workers=2, elastic=True)
  queue.claim(1, worker=1, seq=0)
  assert queue.reclaim(0, worker=1) == (-1, 0)
  assert int(queue.state()["next"]) == 1


def test_a_worker_the_chief_fenced_is_refused_at_its_session_start():
  queue = LocalQueue(units=2, workers=2, elastic=True)
  claims = UnitClaims(queue.ops, worker_id=1, task_name="worker:1", timeout_secs=5)
  claims.raise_if_fenced(queue.session)  # not fenced: nothing happens
  queue.claim(0, worker=1, seq=0)
  queue.reclaim(0, worker=1)
  with pytest.raises(WorkerFencedError, match="worker:1 was found lost by the chief"):
    claims.raise_if_fenced(queue.session)
  with pytest.raises(WorkerFencedError, match="its unit went to another worker"):
    claims.claim(queue.session, epoch=0, at_batch=0)


def test_the_gate_counts_each_batch_from_the_workers_count_at_its_claim():
  queue = LocalQueue(units=3, workers=2, elastic=True)
  first = queue.claim(1, worker=1, seq=0, at=0)
  queue.pass_gate(worker=1, times=4)
  queue.claim(1, worker=1, seq=1, at=4, finished=(first, 4, 32))
  queue.pass_gate(worker=1, times=2)
  assert queue.reclaim_result(1, worker=1)[1:] == (2, 0, 6)  # 2 of the second unit; 6 in all
  epoch, count = divmod(int(queue.session.run(queue.ops.gated)[1]), 2**32)
  assert (epoch, count) == (1, 6)


def test_a_fenced_workers_step_fails_at_the_gate_and_counts_nothing():
  queue = LocalQueue(units=2, workers=2, elastic=True)
  queue.claim(0, worker=1, seq=0, at=0)
  queue.pass_gate(worker=1, times=2)
  assert queue.reclaim_result(0, worker=1)[3] == 2
  with pytest.raises(tf.errors.InvalidArgumentError, match=FENCED_MARK):
    queue.pass_gate(worker=1)  # it woke up after the chief took its unit back: refused
  assert int(queue.session.run(queue.ops.gated)[1]) == 2
  queue.pass_gate(worker=0)  # another worker's gate is open


def test_a_new_run_lifts_the_fences_an_earlier_run_left_in_the_state():
  """A relaunched job restores the queue with its fences from the checkpoint; the chief's reset
  at the run's start (graph_keys.RESET_OPS) brings every worker back."""
  queue = LocalQueue(units=2, workers=2, elastic=True)
  queue.claim(0, worker=1, seq=0)
  queue.reclaim(0, worker=1)
  assert int(queue.state()["claims"][1]) <= queue_graph.FENCE_MARK
  queue.session.run(queue.graph.get_collection(graph_keys.RESET_OPS))
  assert int(queue.state()["claims"][1]) == 0
  assert queue.claim(1, worker=1, seq=0) >= 0  # the next epoch hands it a unit


def test_a_relaunched_worker_joins_the_epoch_it_was_lost_in_with_the_count_its_process_left():
  queue = LocalQueue(units=4, workers=3, elastic=True)
  JOINED, NOT_FENCED = queue_graph.JOINED, queue_graph.NOT_FENCED
  unit = queue.claim(0, worker=1, seq=0, at=0)
  queue.pass_gate(worker=1, times=3)
  assert queue.join(0, worker=1) == NOT_FENCED  # the chief has not found the old process lost
  assert queue.reclaim_result(0, worker=1) == (unit, 3, 0, 3)
  assert queue.join_and_held(0, worker=1) == (JOINED, 3)  # no gather arrived for it yet
  assert not queue.still_lost(0, worker=1)  # epoch 0's gather: it arrives itself
  assert queue.claim(0, worker=1, seq=0, at=3) >= 0  # its count goes on from 3
  queue.pass_gate(worker=1, times=2)
  assert queue.still_lost_and_held(0, worker=1) == (False, 5)


def test_a_relaunched_worker_joins_at_the_first_epoch_whose_barrier_the_chief_left_to_it():
  queue = LocalQueue(units=4, workers=3, elastic=True)
  JOINED, NOT_FENCED, CLOSED = queue_graph.JOINED, queue_graph.NOT_FENCED, queue_graph.CLOSED
  queue.claim(0, worker=1, seq=0)
  assert queue.join(0, worker=1) == NOT_FENCED  # the chief has not found the old process lost
  queue.reclaim(0, worker=1)  # lost in epoch 0
  assert queue.still_lost(0, worker=1)  # epoch 0's gather: the chief arrives for it
  assert queue.join(0, worker=1) == CLOSED
  assert queue.join(1, worker=1) == JOINED  # epoch 1 is its own
  assert queue.join(1, worker=1) == JOINED  # run again (its answer lost): the same answer
  assert queue.join(1, worker=1, token=8) == NOT_FENCED  # another process: nothing to join
  assert not queue.still_lost(1, worker=1)  # epoch 1's gather: it arrives itself
  unit = queue.claim(1, worker=1, seq=0, at=0)
  assert unit >= 0
  queue.pass_gate(worker=1, times=2)
  assert queue.reclaim_result(1, worker=1) == (unit, 2, 0, 2)  # lost again: 2 batches held
  assert queue.still_lost(2, worker=1) and queue.join(2, worker=1) == CLOSED


def test_a_spare_joins_only_in_place_of_a_lost_worker_and_a_relaunch_then_finds_the_job_full():
  queue = LocalQueue(units=4, workers=4, elastic=True)  # worker 3 is the spare
  JOINED, FULL = queue_graph.JOINED, queue_graph.FULL
  queue.reclaim(0, worker=3)  # the chief fences the spare at the run's start
  assert queue.still_lost(-1, worker=3)  # the start barrier: it asks about the epoch before
  assert queue.join(0, worker=3, spares=1) == FULL  # nobody else is fenced: it stands by
  assert queue.join(0, worker=3, spares=0) == JOINED  # (no spares: a plain relaunch joins)
  queue.reclaim(0, worker=3)  # fenced again, as a spare
  unit = queue.claim(0, worker=1, seq=0, at=0)
  queue.reclaim(0, worker=1)  # worker 1 is lost
  assert queue.join(0, worker=3, spares=1) == JOINED  # the spare takes its place in epoch 0
  assert queue.claim(0, worker=3, seq=0, at=0) == unit  # and resumes its unit first
  assert queue.join(0, worker=1, token=9, spares=1) == FULL  # worker 1's relaunch stands by
  queue.reclaim(0, worker=2)  # another worker lost: the relaunch joins in its place
  assert queue.join(0, worker=1, token=9, spares=1) == JOINED
  assert queue.join(0, worker=2, token=5, spares=1) == FULL


def test_an_epoch_whose_gather_found_the_worker_still_fenced_is_closed_to_its_join():
  queue = LocalQueue(units=4, workers=3, elastic=True)
  queue.claim(0, worker=1, seq=0)
  queue.reclaim(0, worker=1)
  assert queue.still_lost(1, worker=1)  # epoch 1's gather came first: the chief arrives
  assert queue.join(1, worker=1) == queue_graph.CLOSED
  assert queue.join(2, worker=1) == queue_graph.JOINED


def test_a_unit_two_workers_were_lost_in_is_audited_with_both_parts_in_their_order():
  """Worker 1 is lost 2 batches into unit 1, worker 2 takes the rest and is lost 3 batches
  later; worker 0 finishes it. The audit lists both parts and the epoch is exact."""
  queue = LocalQueue(units=2, workers=3, elastic=True, shuffle=False)
  units = [WorkUnit("", 0, 32), WorkUnit("", 32, 96)]  # 4 and 8 batches of 8 records
  passes = UnitPasses(SimpleNamespace(state=queue.ops.state), None, units, "worker:0")
  assert queue.claim(0, worker=0, seq=0) == 0
  assert queue.claim(0, worker=1, seq=0) == 1
  queue.pass_gate(worker=1, times=2)
  unit, skip, old_skip, _ = queue.reclaim_result(0, worker=1)
  passes.take_back(0, unit, 1, skip - old_skip)  # what LostWorkers records
  assert queue.claim_and_skip(0, worker=2, seq=0) == (1, 2)
  queue.pass_gate(worker=2, times=3)
  unit, skip, old_skip, _ = queue.reclaim_result(0, worker=2)
  assert (skip, old_skip) == (5, 2)
  passes.take_back(0, unit, 2, skip - old_skip)
  assert queue.claim_and_skip(0, worker=0, seq=1, at=4, finished=(0, 4, 32)) == (1, 5)
  assert queue.claim(0, worker=0, seq=2, at=7, finished=(1, 8, 64)) == -1
  def stats(batches, examples=-1):  # (-1: a lost worker's examples are unknown)
    return EpochStats(0, batches, examples, 0.0, 0.0)
  arrivals = {"worker:0": stats(7, 56), "worker:1": stats(2), "worker:2": stats(3)}
  audit = UnitAudit(passes, ["worker:0", "worker:1", "worker:2"])
  line = audit(queue.session, 0, arrivals)
  assert line["units"][1]["taken_back"] == [{"worker": "worker:1", "batches": 2},
                                            {"worker": "worker:2", "batches": 3}]
  assert line["units"][1]["resumed_after"] == 5
  with pytest.raises(WorkQueueError, match="worker:2 trained 4 batches"):
    audit(queue.session, 0, dict(arrivals, **{"worker:2": stats(4)}))


def _elastic_async_worker(worker_id=1, num_workers=2, learning_rate=0.5):
  """An asynchronous elastic worker's graph in one process: the work queue input (2 units of
  4 batches of 1), w * x with an ElasticOptimizer, and the chief's admission fence."""
  from hooks.config.settings import EpochSyncSettings  # pylint: disable=g-import-not-at-top
  from hooks.sync.elastic_apply import ElasticOptimizer  # pylint: disable=g-import-not-at-top
  from hooks.workqueue import WorkUnit, work_queue_input  # pylint: disable=g-import-not-at-top
  graph = tf.Graph()
  with graph.as_default():
    settings = EpochSyncSettings(num_epochs=1, sync=False, elastic=True, save_checkpoint_secs=0)
    units = [WorkUnit("", 0, 4), WorkUnit("", 4, 8)]
    epoch_input = work_queue_input(
        units, lambda u: tf.data.Dataset.range(u.start, u.start + u.count).batch(1),
        num_epochs=1, num_workers=num_workers, worker_id=worker_id,
        task_name=f"worker:{worker_id}", ps_device="", settings=settings)
    x = tf.cast(tf.reshape(tf.compat.v1.placeholder_with_default(
        tf.constant([1], tf.int64), [1]), []), tf.float32)
    w = _v1.get_variable("w", [], initializer=_v1.zeros_initializer(), use_resource=False)
    step = _v1.train.get_or_create_global_step()
    train_op = ElasticOptimizer(_v1.train.GradientDescentOptimizer(learning_rate)).minimize(
        -w * x, global_step=step)
    ops = epoch_input.passes.claims.ops
    fence = elastic_graph.fence_admissions(ops, worker_id)
    init = [_v1.global_variables_initializer(), _v1.local_variables_initializer()]
    reset = graph.get_collection(graph_keys.RESET_OPS)
  session = _v1.Session(graph=graph)
  session.run(init)
  session.run(reset)  # the run's start (RunStartHook): the admission words and done counts
  return graph, session, epoch_input, train_op, ops, fence, (w, step)


def test_an_elastic_optimizer_counts_a_batch_with_its_apply_and_a_fenced_step_applies_nothing():
  """An admitted step applies and counts; after the chief's fence (nothing in flight: 0), a
  step (a frozen worker woken) is refused before any variable changes."""
  graph, session, epoch_input, train_op, ops, fence, (w, step) = _elastic_async_worker()
  claims = epoch_input.passes.claims
  assert claims.claim(session, epoch=0, at_batch=0).unit >= 0
  for _ in range(3):
    session.run(train_op)
  assert session.run([w, step]) == [1.5, 3]
  assert int(session.run(ops.gated)[1]) == 3  # counted with each apply
  reclaim = ops.reclaim
  assert int(session.run(fence)) == 0  # no admitted step in flight
  with pytest.raises(tf.errors.InvalidArgumentError, match=FENCED_MARK):
    session.run(train_op)
  assert session.run([w, step]) == [1.5, 3] and int(session.run(ops.gated)[1]) == 3
  unit, skip, _, held = (int(v) for v in session.run(reclaim.result, {reclaim.epoch: 0,
                                                                     reclaim.worker: 1}))
  assert unit >= 0 and skip == 3 and held == 3
  del graph


def test_a_stale_process_of_a_slot_another_process_joined_applies_nothing():
  """The slot's member is the process that joined it (its token); an earlier process of the
  same worker woken after that join is refused, though the slot is no longer fenced."""
  graph, session, epoch_input, train_op, ops, fence, (w, _) = _elastic_async_worker()
  epoch_input.passes.claims.claim(session, epoch=0, at_batch=0)
  session.run(train_op)
  session.run(fence)
  session.run(ops.reclaim.result, {ops.reclaim.epoch: 0, ops.reclaim.worker: 1})
  membership = ops.membership
  answer, _ = session.run(membership.join, {membership.epoch: 0, membership.worker: 1,
                                            membership.token: 12345, membership.spares: 0})
  assert int(answer) == 1  # JOINED by another process (token 12345): it is the member
  with pytest.raises(tf.errors.InvalidArgumentError, match=FENCED_MARK):
    session.run(train_op)  # still fenced: the new process has not taken the slot yet
  with graph.as_default():
    take = elastic_graph.take_slot(ops, 1)
    become = epoch_input.passes.claims.identity.assign(12345)
  session.run(take)
  with pytest.raises(tf.errors.InvalidArgumentError, match=FENCED_MARK):
    session.run(train_op)  # this process (identity 0) is not the member: refused
  assert session.run(w) == 0.5
  session.run(become)  # the joined process itself
  session.run(train_op)
  assert session.run(w) == 1.0
  assert int(session.run(ops.gated)[1]) % 2**32 == 2


def test_a_new_run_makes_every_slot_the_runs_own_process_again():
  graph, session, _, train_op, ops, fence, (w, _) = _elastic_async_worker()
  membership = ops.membership
  session.run(fence)
  session.run(ops.reclaim.result, {ops.reclaim.epoch: 0, ops.reclaim.worker: 1})
  session.run(membership.join, {membership.epoch: 0, membership.worker: 1,
                                membership.token: 99, membership.spares: 0})
  session.run(graph.get_collection(graph_keys.RESET_OPS))
  session.run(train_op)  # identity 0 is the member again, the word unfenced
  assert session.run(w) == 0.5


def test_the_batch_gate_is_off_when_the_step_applies_in_the_workers_lock():
  _, _, epoch_input, _, _, _, _ = _elastic_async_worker()
  feeds = epoch_input.passes.step_feeds()
  assert list(feeds.values()) == [False]
