"""The work queue's units, its claim on ps:0 and the claims' retries, under hostile timing.

The claim stress test runs 8 claimers (2 worker servers, 4 threads each, on a real gRPC ps); a
third of their claims get a 1 ms deadline (they time out before or after the ps ran them) and
another sixth lose the answer of a claim the ps ran; each is retried with the same claim
number, and every unit must still be handed out exactly once. (Without the queue's
critical section, the same stress hands out units twice: 8 of 2,400 claims in one measured run.)
"""

import collections
import json
import random
import threading
import time

import portpicker
import pytest
import tensorflow as tf

from hooks.errors import ClaimTimeoutError, ConfigError, EpochSyncError
from hooks.workqueue import WorkUnit, fingerprint, unit_problems, units_of_files
from hooks.workqueue import queue_graph
from hooks.workqueue.claims import UnitClaims
from hooks.workqueue.state_ops import execute_unrecorded
from hooks.workqueue.input import work_queue_input
from local_queue import LocalQueue

_v1 = tf.compat.v1


def test_units_are_checked_naming_each_problem(tmp_path):
  real = tmp_path / "part-0"
  real.write_text("x")
  assert unit_problems([WorkUnit(str(real))]) == []
  assert "non-empty list" in unit_problems([])[0]
  problems = unit_problems([WorkUnit(str(real)), WorkUnit(str(real)),
                            WorkUnit(str(tmp_path / "missing")), WorkUnit("", 5, 5), "x"])
  text = "; ".join(problems)
  assert "units[1]" in text and "repeats units[0]" in text
  assert f"file {tmp_path / 'missing'} does not exist" in text
  assert "units[3] <rows>[5:5]: the range must hold at least one record" in text
  assert "units[4]='x' is not a WorkUnit" in text


def test_units_of_files_and_their_fingerprint():
  units = units_of_files(["/d/a", "/d/b"])
  assert units == [WorkUnit("/d/a"), WorkUnit("/d/b")] and units[0].count == -1
  assert fingerprint(units) == fingerprint(list(units))
  assert fingerprint(units) != fingerprint(units[::-1])
  assert WorkUnit("", 8, 24).count == 16


def test_work_queue_input_refuses_bad_arguments():
  with tf.Graph().as_default():
    with pytest.raises(ConfigError, match="work units of worker:0"):
      work_queue_input([], lambda u: None, 1, 2, 0, "worker:0")
    with pytest.raises(ConfigError, match="worker_id=2 must be in"):
      work_queue_input([WorkUnit("", 0, 8)], lambda u: None, 1, 2, 2, "worker:2")
    with pytest.raises(ConfigError, match="unit_fn returned int"):
      work_queue_input([WorkUnit("", 0, 8)], lambda u: 3, 1, 2, 0, "worker:0")


def test_a_repeated_claim_answers_the_same_unit_and_changes_nothing():
  queue = LocalQueue()
  first = queue.claim(0, worker=1, seq=0)
  before = queue.state()
  assert queue.claim(0, worker=1, seq=0) == first
  after = queue.state()
  assert all((before[k] == after[k]).all() for k in before)
  assert int(after["next"]) == 1 and int(after["owner"][first]) == 1


def test_a_claim_after_a_lost_write_fails_naming_the_lost_write_instead_of_replaying():
  queue = LocalQueue(units=6)
  claims = UnitClaims(queue.ops, 1, "worker:1", timeout_secs=10)
  first = claims.claim(queue.session, 0, 0).unit
  lost = queue.vector()
  claims.claim(queue.session, 0, 1, (first, 1, 1))
  queue.write(lost)  # the second claim's write lost, as when two runs were in the lock at once
  assert queue.claim(0, worker=1, seq=2) == queue_graph.LOST_WRITE
  with pytest.raises(EpochSyncError, match=r"worker:1's claim 2 of epoch 0: the work queue on "
                                           r"ps:0 holds fewer of its claims than it answered"):
    claims.claim(queue.session, 0, 2)


def test_every_unit_once_per_epoch_then_none_and_the_finished_counts_recorded():
  queue = LocalQueue(units=5)
  taken, seq, unit = [], 0, queue.claim(0, worker=0, seq=0)
  while unit >= 0:
    taken.append(unit)
    seq += 1
    unit = queue.claim(0, worker=0, seq=seq, at=len(taken), finished=(unit, 2, 16))
  assert sorted(taken) == [0, 1, 2, 3, 4]
  state = queue.state()
  assert list(state["order"]) == taken
  assert list(state["batches"]) == [2] * 5 and list(state["examples"]) == [16] * 5
  assert list(state["first_batch"][taken]) == [0, 1, 2, 3, 4]


def test_the_order_is_drawn_per_epoch_from_the_seed():
  orders = []
  for seed in (7, 7, 8):
    queue = LocalQueue(units=12, seed=seed)
    orders.append([])
    for epoch in range(2):
      queue.claim(epoch, worker=0, seq=0)
      orders[-1].append(list(queue.state()["order"]))
  assert orders[0] == orders[1]  # same seed: same orders
  assert orders[0][0] != orders[0][1]  # reshuffled per epoch
  assert orders[0] != orders[2]
  assert all(sorted(o) == list(range(12)) for o in orders[0])
  unshuffled = LocalQueue(units=4, shuffle=False)
  unshuffled.claim(3, worker=0, seq=0)
  assert list(unshuffled.state()["order"]) == [0, 1, 2, 3]


def test_a_claim_of_an_earlier_epoch_is_refused():
  queue = LocalQueue()
  queue.claim(2, worker=0, seq=0)
  assert queue.claim(1, worker=1, seq=0) == queue_graph.STALE


def test_the_queue_adds_nothing_to_the_meta_graph_that_cannot_be_saved():
  queue = LocalQueue()
  with queue.graph.as_default():
    assert not queue.graph.get_collection("critical_section_executions")
    _v1.train.export_meta_graph()  # would warn "Issue encountered when serializing"


@pytest.mark.timeout(300)
def test_claims_waited_on_past_20ms_by_8_claimers_hand_out_every_unit_once():
  """8 claimers' claims wait past their 20 ms attempt while a slow run of the queue's holds its
  lock for ~0.1 s every ~0.3 s, a third of the runs are slow, and a sixth of the answers are
  lost (claimed again). Seen failing (2 of 2 runs, LOST_WRITE) while a claim was cancelled at
  the end of its attempt (its run deadline): TensorFlow's lock then let a claim in beside the
  slow run, whose write undid the claim's (test_tf_lock_cancellation)."""
  ports = [portpicker.pick_unused_port() for _ in range(3)]
  spec = tf.train.ClusterSpec({"ps": [f"localhost:{ports[0]}"],
                               "worker": [f"localhost:{p}" for p in ports[1:]]})
  servers = [tf.distribute.Server(spec, job_name=job, task_index=i, start=True)
             for job, i in (("ps", 0), ("worker", 0), ("worker", 1))]
  num_units, claimers, epochs = 300, 8, 2
  results, holds, errors = collections.defaultdict(list), [], []
  ready, stop, initialized = threading.Barrier(claimers), threading.Event(), threading.Event()

  def claimer(worker_id):
    graph = tf.Graph()
    with graph.as_default():
      ops = queue_graph.build(num_units, claimers, 3, True, "/job:ps/task:0")
      init = _v1.global_variables_initializer()
    claims = UnitClaims(ops, worker_id, f"worker:{worker_id}", timeout_secs=120,
                        attempt_secs=0.02)
    try:
      with _v1.Session(servers[1 + worker_id % 2].target, graph=graph) as real:
        session = _Hostile(real, random.Random(worker_id))
        if worker_id == 0:
          real.run(init)
          initialized.set()
        ready.wait()
        for epoch in range(epochs):
          unit, batches = claims.claim(session, epoch, 0).unit, 0
          while unit >= 0 and not stop.is_set():
            results[(epoch, worker_id)].append(unit)
            batches += 1
            if batches > num_units:  # Bounded: a claim answered as a replay for ever
              raise AssertionError(
                  f"worker:{worker_id} took {batches} units of an epoch of {num_units}, the "
                  f"last {results[(epoch, worker_id)][-5:]}: the ps's claim count fell behind "
                  "its own (a lost write to the queue's state?)")
            unit = claims.claim(session, epoch, batches, (unit, 1, 1)).unit
          if epoch + 1 < epochs:
            ready.wait()  # the epoch barrier: nobody claims epoch e+1 before all ended e
    except Exception as e:  # pylint: disable=broad-except
      errors.append(e)
      ready.abort()

  import logging as py_logging  # the retries' WARNINGs are counted
  handler = _Counter()
  py_logging.getLogger().addHandler(handler)
  try:
    # Daemon threads: one that never ends cannot keep pytest's process from exiting.
    threads = [threading.Thread(target=claimer, args=(w,), daemon=True)
               for w in range(claimers)]
    holder = threading.Thread(target=_hold_the_lock, args=(servers[2].target, stop, num_units,
                                                          claimers, holds, initialized,
                                                          errors), daemon=True)
    holder.start()
    for t in threads:
      t.start()
    deadline = time.monotonic() + 240
    for t in threads:
      t.join(max(0.0, deadline - time.monotonic()))
  finally:
    stop.set()
    py_logging.getLogger().removeHandler(handler)
  assert not [t.name for t in threads if t.is_alive()], (errors, {
      key: len(units) for key, units in results.items()})
  assert not errors, errors
  for epoch in range(epochs):
    taken = [u for (e, _), units in results.items() if e == epoch for u in units]
    assert sorted(taken) == list(range(num_units)), (
        f"epoch {epoch}: {len(taken)} units taken, {len(set(taken))} distinct")
  assert handler.retries > 0, "no answer was lost: the test did not stress the retries"
  assert handler.waits > 0, "no claim waited past 20 ms: the test did not stress the waits"
  assert len(holds) >= 5, f"the slow run held the lock {len(holds)} times"
  print(f"{handler.retries} claims claimed again after a lost answer, {handler.waits} waits "
        f"past 20 ms; the slow run held the lock {len(holds)} times")


def _hold_the_lock(target, stop, num_units, claimers, holds, initialized, errors, secs=0.1,
                   every=0.3):
  """Until `stop`: a run in the work queue's lock that reads its state, works for about `secs`
  seconds on ps:0 and writes the state it read back (a slow run of the queue's), every `every`
  seconds (counted in `holds`), from when the queue is `initialized`; its error goes to
  `errors`. A claim let in meanwhile would have its write undone."""
  graph = tf.Graph()
  with graph.as_default():
    ops = queue_graph.build(num_units, claimers, 3, True, "/job:ps/task:0")
    n = _v1.placeholder(tf.int32, [])

    def slow_rewrite():
      old = ops.state_variable.read_value()
      busy = tf.while_loop(lambda i, a: i < n, lambda i, a: (i + 1, a * 1.0000001 + 1.0),
                           [tf.constant(0), tf.reduce_sum(tf.cast(old, tf.float32))])[1]
      with tf.control_dependencies([busy]):
        return ops.state_variable.assign(old).op

    with _v1.device("/job:ps/task:0"):
      lock = tf.CriticalSection(shared_name="epochsync_workqueue_lock")  # the claims' lock
      rewrite = execute_unrecorded(lock, slow_rewrite)
  try:
    with _v1.Session(target, graph=graph) as session:
      initialized.wait(60)
      started = time.monotonic()
      session.run(rewrite, {n: 10000})
      iterations = max(1000, int(10000 * secs / max(time.monotonic() - started, 1e-3)))
      while not stop.wait(every):  # Bounded: the test sets `stop`.
        session.run(rewrite, {n: iterations})
        holds.append(iterations)
  except Exception as e:  # pylint: disable=broad-except
    errors.append(e)


class _Hostile:
  """A session whose runs are slow (1 in 3: 20-40 ms before the run) or lose their answer (1
  in 6: the run happened, its caller gets DeadlineExceededError)."""

  def __init__(self, session, rng):
    self._session, self._rng = session, rng
    self._lock = threading.Lock()  # the runs come from several threads

  def run(self, fetches, feed_dict=None, options=None):
    with self._lock:
      draw, pause = self._rng.random(), self._rng.uniform(0.02, 0.04)
    if draw < 1 / 3:
      time.sleep(pause)
    result = self._session.run(fetches, feed_dict, options=options)
    if 1 / 3 <= draw < 1 / 2:
      raise tf.errors.DeadlineExceededError(None, None, "the answer was lost")
    return result


class _Counter(__import__("logging").Handler):

  def __init__(self):
    super().__init__()
    self.retries = self.waits = 0

  def emit(self, record):
    message = record.getMessage()
    self.retries += "claiming again" in message
    self.waits += "waiting on" in message


def test_a_claim_that_never_gets_an_answer_times_out_naming_the_epoch_and_ps():
  with tf.Graph().as_default():
    ops = queue_graph.build(3, 1, 0, True, "/cpu:0")
  claims = UnitClaims(ops, 0, "worker:0", timeout_secs=1.5, attempt_secs=0.2)

  class Unanswered:
    def run(self, *args, **kwargs):
      raise tf.errors.DeadlineExceededError(None, None, "Timed out")

  with pytest.raises(ClaimTimeoutError, match=r"worker:0 could not claim its next unit of epoch "
                                              r"4 from the work queue on ps:0"):
    claims.claim(Unanswered(), 4, 0)


def test_a_unit_fn_that_repeats_is_refused_before_the_first_step():
  graph = tf.Graph()
  with graph.as_default():
    epoch_input = work_queue_input(
        [WorkUnit("", 0, 8), WorkUnit("", 8, 16)],
        lambda unit: tf.data.Dataset.range(16).skip(unit.start).take(unit.count).batch(4).repeat(),
        1, 1, 0, "worker:0", ps_device="/cpu:0")
    init = [_v1.global_variables_initializer(), _v1.local_variables_initializer()]
  with _v1.Session(graph=graph) as session:
    session.run(init)
    with pytest.raises(ConfigError, match=r"worker:0: unit_fn returned an infinite \(repeated\) "
                                          r"dataset for unit <rows>\[\d+:\d+\]"):
      epoch_input.passes.first_pass(session, 0)


def test_a_specs_units_are_checked_once(tmp_path, monkeypatch):
  from hooks.workqueue import input as input_lib  # pylint: disable=g-import-not-at-top
  calls = []
  monkeypatch.setattr(input_lib, "unit_problems",
                      lambda units: calls.append(1) or unit_problems(units))
  spec = input_lib.WorkQueueSpec([WorkUnit(str(tmp_path / "missing"))], lambda unit: None)
  first, second = spec.problems(), spec.problems()
  assert first == second and "does not exist" in first[0]
  assert len(calls) == 1  # each file's existence is a filesystem call


def test_a_wanted_unit_is_handed_out_once_and_none_ends_a_replayed_worker():
  queue = LocalQueue(units=5, shuffle=False)

  def claim(worker, seq, wanted, finished=(-1, 0, 0)):
    return queue.claim(0, worker, seq, finished=finished, wanted=wanted)

  assert claim(0, 0, 3) == 3
  assert claim(1, 0, 3) == -1  # already handed out: none (the audit names what is left)
  assert claim(1, 1, 0) == 0
  assert claim(0, 1, queue_graph.NONE, finished=(3, 0, 0)) == -1
  assert claim(1, 2, queue_graph.ANY) == 2  # the order goes on: [3, 0, 2, 1, 4] after swaps
  state = queue.state()
  assert list(state["order"][:3]) == [3, 0, 2] and int(state["next"]) == 3
  assert sorted(state["order"]) == [0, 1, 2, 3, 4]


def test_a_replay_reads_each_workers_units_from_an_audit(tmp_path):
  from hooks.workqueue import UnitReplay  # pylint: disable=g-import-not-at-top
  audit = tmp_path / "epochsync_epochs.jsonl"
  unit = lambda index, worker, first: {"index": index, "worker": worker, "first_batch": first}
  audit.write_text(json.dumps({"epoch": 0, "units": [
      unit(2, "worker:0", 0), unit(0, "worker:1", 0), unit(1, "worker:0", 4)]}) + "\n")
  replay = UnitReplay.from_audit(str(audit), 3)
  assert replay.units_of(0, "worker:0") == [2, 1] and replay.units_of(0, "worker:1") == [0]
  assert replay.units_of(0, "worker:2") == [] and replay.units_of(1, "worker:0") is None
  with pytest.raises(ConfigError, match="not the 4 units of this job"):
    UnitReplay.from_audit(str(audit), 4)
  audit.write_text(json.dumps({"epoch": 0, "units": [dict(unit(0, "worker:0", 0),
                                                          before_resume=True)]}) + "\n")
  with pytest.raises(ConfigError, match="resumed from a mid-epoch checkpoint"):
    UnitReplay.from_audit(str(audit), 1)


def test_the_queue_knobs_come_from_the_settings_unless_given():
  from hooks.config.settings import EpochSyncSettings  # pylint: disable=g-import-not-at-top
  units = [WorkUnit("", 8 * i, 8 * i + 8) for i in range(12)]
  orders = {}
  for name, kwargs in (("unshuffled", dict(settings=EpochSyncSettings(unit_shuffle=False))),
                       ("seed 3", dict(settings=EpochSyncSettings(unit_seed=3))),
                       ("seed 3 given", dict(seed=3, settings=EpochSyncSettings(unit_seed=5)))):
    graph = tf.Graph()
    with graph.as_default():
      epoch_input = work_queue_input(units, lambda u: tf.data.Dataset.range(1).batch(1), 1, 1, 0,
                                     "worker:0", ps_device="", **kwargs)
      init = _v1.global_variables_initializer()
    with _v1.Session(graph=graph) as session:
      session.run(init)
      epoch_input.passes.claims.claim(session, 0, 0)
      orders[name] = list(session.run(epoch_input.passes.claims.state)["order"])
  assert orders["unshuffled"] == list(range(12))
  assert orders["seed 3"] == orders["seed 3 given"] != list(range(12))
