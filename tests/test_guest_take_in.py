"""A relaunched worker's rejoin (hooks.elastic.rejoin) over stand-ins of the ps-side state: when
it joins, when a synchronous guest is taken into the steps, and the bound of its wait. The
protocol on real processes: tests/test_elastic_sync_cluster.py (relaunched after 5 s)."""

import types

import pytest

from hooks.elastic.rejoin import GuestTakeInHook, Rejoin
from hooks.epoch.barrier_release import ReleaseWait
from hooks.errors import StartupTimeoutError
from hooks.workqueue.elastic_graph import JOINED, NOT_FENCED


class _Guest:
  """The sync optimizer's guest ops: `started` answers from `started_answers` in turn."""

  def __init__(self, started_answers, join_answers=((JOINED, 4),)):
    self.started_answers, self.join_answers = list(started_answers), list(join_answers)
    self.calls = []

  def join(self, session, epoch, spares=0):
    self.calls.append(("join", epoch))
    return self.join_answers.pop(0)

  def ready(self, session, epoch):
    self.calls.append(("ready", epoch))
    return True

  def started(self, session):
    answers = self.started_answers
    return answers.pop(0) if len(answers) > 1 else answers[0]

  def take_local_step(self, session):
    self.calls.append(("local step",))


class _Barrier:
  """The barrier's running epoch (`epochs` in turn) and its record of the rejoin."""

  def __init__(self, epochs=(2,), started=(True,)):
    self.epochs, self.rejoined, self.started = list(epochs), [], list(started)
    self.release_wait = types.SimpleNamespace(
        arrived_at_end=lambda session, epoch: False, rejoined_at=self._rejoined_at,
        epoch_under_way=lambda session, epoch: (
            self.started.pop(0) if len(self.started) > 1 else self.started[0]))

  def _rejoined_at(self, epoch, held):
    self.rejoined.append((epoch, held))

  def start_epoch(self, session):
    return self.epochs.pop(0) if len(self.epochs) > 1 else self.epochs[0]


def _rejoin(guest, barrier):
  queue = types.SimpleNamespace(task_name="worker:1", claims=guest)
  return Rejoin(queue, barrier, guest=guest)


def _hook(rejoin, timeout_secs=30.0):
  liveness = types.SimpleNamespace(check=lambda names, where: None)
  return GuestTakeInHook(rejoin, liveness, "worker:0", timeout_secs)


def test_a_guest_is_taken_in_after_it_said_it_is_ready_and_then_takes_the_step():
  guest, barrier = _Guest(started_answers=[-1, -1, 7]), _Barrier()
  rejoin = _rejoin(guest, barrier)
  assert rejoin(None) is None and rejoin.pending and barrier.rejoined == []
  _hook(rejoin).after_create_session(None, None)
  assert guest.calls == [("join", 2), ("ready", 2), ("local step",)]  # ready once
  assert barrier.rejoined == [(2, 4)] and not rejoin.pending


def test_a_guest_whose_epoch_ended_first_starts_with_the_next_one():
  guest, barrier = _Guest(started_answers=[-1]), _Barrier(epochs=[2, 2, 2, 3])
  rejoin = _rejoin(guest, barrier)
  assert rejoin(None) is None
  _hook(rejoin).after_create_session(None, None)
  assert barrier.rejoined == [] and not rejoin.pending  # it arrives from epoch 3 on
  assert ("local step",) not in guest.calls


def test_a_guest_no_step_takes_in_fails_at_the_timeout_naming_its_epoch_and_the_chief():
  guest, barrier = _Guest(started_answers=[-1]), _Barrier()
  rejoin = _rejoin(guest, barrier)
  rejoin(None)
  with pytest.raises(StartupTimeoutError, match=r"worker:1 joined epoch 2 as a guest of the "
                     r"synchronous steps, and no step took it in for 0.2 s") as raised:
    _hook(rejoin, timeout_secs=0.2).after_create_session(None, None)
  assert raised.value.missing == ("worker:0",)


def test_a_join_the_chief_is_not_ready_for_is_tried_again():
  guest = _Guest(started_answers=[5], join_answers=[(NOT_FENCED, 0), (JOINED, 0)])
  rejoin = _rejoin(guest, _Barrier())
  assert "has not found its earlier process lost" in rejoin(None)
  assert rejoin(None) is None and rejoin(None) is None  # joined once
  assert guest.calls == [("join", 2), ("join", 2)]


def test_an_asynchronous_worker_arrives_itself_from_its_join_on():
  barrier = _Barrier()
  claims = types.SimpleNamespace(join=lambda session, epoch, spares: (JOINED, 6))
  rejoin = Rejoin(types.SimpleNamespace(task_name="worker:1", claims=claims), barrier)
  assert rejoin(None) is None and not rejoin.pending
  assert barrier.rejoined == [(2, 6)]
  _hook(rejoin).after_create_session(None, None)  # nothing to take in


def test_a_worker_joins_an_epoch_only_once_it_is_under_way():
  """Before that it would train the epoch while the chief still waits at its start for a late
  worker of the launch, and arrive at its end out of turn (the chief refuses that)."""
  barrier, writes = _Barrier(started=(False, None, True)), []
  claims = types.SimpleNamespace(join=lambda session, epoch, spares: (JOINED, 0))
  rejoin = Rejoin(types.SimpleNamespace(task_name="worker:3", claims=claims), barrier,
                  spare=True, optional=True, announce=writes.append)
  assert "epoch 2 has not started: its start barrier waits for workers" in rejoin("s")
  assert "epoch 2 has not started" in rejoin("s")  # (the ps did not answer: asked again)
  assert writes == [] and rejoin.joined is None
  assert rejoin("s") is None and rejoin.joined == (2, 0) and writes == ["s"]


@pytest.mark.parametrize("epoch, arrived, under_way", [
    # the run starts at epoch 0: the chief and worker:1 at its start, worker:2 late, and the
    # chief has not arrived there for worker:3 yet (the race a grown job's test found)
    (0, [0, 0, -1, -1], False),
    (0, [0, 0, 0, -1], False),   # every other worker there, not the chief for worker:3 yet
    (0, [0, 0, 0, 0], True),     # every arrival at the start is in
    (0, [1, 0, 1, 0], True),     # the epoch's end is being gathered
    (3, [5, 5, 5, 5], True),     # a later epoch: every worker passed the end of epoch 2
    (3, [7, 5, 7, 5], True),
    (3, [6, -1, 6, 6], False),   # a run resumed at epoch 3: worker:1 not at its start yet
    (3, [6, 6, 6, 6], True),
    (3, [6, 6, 6, None], False)])  # (None: the ps did not answer)
def test_an_epoch_is_under_way_once_every_arrival_at_its_start_or_the_end_before_is_in(
    epoch, arrived, under_way):
  names = ["worker:0", "worker:1", "worker:2", "worker:3"]

  def missing(session, seq):
    if None in arrived:
      return None
    return [n for n, s in zip(names, arrived) if s < seq]

  wait = ReleaseWait("worker:3", "worker:0", None, None, lambda *a: True, missing)
  assert wait.epoch_under_way(None, epoch) == under_way
