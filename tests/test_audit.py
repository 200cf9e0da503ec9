"""Tests for hooks/epoch/audit.py: EpochAudit lines and read_audit."""

import json
import os

from hooks.epoch import audit as audit_lib
from hooks.epoch.audit import AUDIT_FILENAME, EpochAudit, read_audit
from hooks.data.epoch_input import EpochStats


def _stats(epoch, batches, examples, started_at, ended_at):
  return EpochStats(epoch, batches, examples, started_at, ended_at)


def test_exports():
  assert sorted(audit_lib.__all__) == ["AUDIT_FILENAME", "EpochAudit", "read_audit"]


class TestReadAudit:

  def test_missing_directory_is_empty(self, tmp_path):
    assert read_audit(str(tmp_path / "does-not-exist")) == []

  def test_directory_without_audit_is_empty(self, tmp_path):
    assert read_audit(str(tmp_path)) == []

  def test_skips_blank_lines(self, tmp_path):
    (tmp_path / AUDIT_FILENAME).write_text('{"epoch": 0}\n\n{"epoch": 1}\n  \n')
    assert read_audit(str(tmp_path)) == [{"epoch": 0}, {"epoch": 1}]


class TestEpochAudit:

  def test_write_then_read_round_trip(self, tmp_path):
    model_dir = str(tmp_path / "model")  # created by the first write
    audit = EpochAudit(model_dir)
    assert audit.path == os.path.join(model_dir, AUDIT_FILENAME)
    arrivals = {"worker:1": _stats(0, 2, 5, 100.0, 103.5),
                "chief:0": _stats(0, 3, 10, 100.25, 104.0)}
    record = audit.write(0, arrivals, released_at=104.75,
                         fields={"checkpoint": "/m/model.ckpt-epoch0000-5", "saved_at": 104.5},
                         global_step=5)
    expected = {
        "epoch": 0, "global_step": 5, "released_at": 104.75, "attempt": 1,
        "checkpoint": "/m/model.ckpt-epoch0000-5", "saved_at": 104.5,
        "workers": {
            "chief:0": {"batches": 3, "examples": 10, "started_at": 100.25, "arrived_at": 104.0,
                        "barrier_wait_secs": 0.75, "attempt": 1},
            "worker:1": {"batches": 2, "examples": 5, "started_at": 100.0, "arrived_at": 103.5,
                         "barrier_wait_secs": 1.25, "attempt": 1},
        },
    }
    assert record == expected
    assert list(record["workers"]) == ["chief:0", "worker:1"]  # sorted by task name
    assert read_audit(model_dir) == [expected]

  def test_barrier_wait_is_released_at_minus_arrived_at(self, tmp_path):
    audit = EpochAudit(str(tmp_path))
    arrivals = {f"worker:{i}": _stats(3, 1, 1, 0.0, 1000.0 + i * 0.123456) for i in range(3)}
    audit.write(3, arrivals, released_at=1010.0, fields={}, global_step=None)
    (line,) = read_audit(str(tmp_path))
    for i in range(3):
      worker = line["workers"][f"worker:{i}"]
      assert worker["barrier_wait_secs"] == round(1010.0 - worker["arrived_at"], 4)
    assert [line["workers"][f"worker:{i}"]["barrier_wait_secs"] for i in range(3)] == [
        10.0, 9.8765, 9.7531]
    assert line["global_step"] is None and "checkpoint" not in line

  def test_appends_one_line_per_epoch_in_order(self, tmp_path):
    audit = EpochAudit(str(tmp_path))
    for epoch in range(3):
      audit.write(epoch, {"worker:0": _stats(epoch, 3, 10, epoch, epoch + 0.5)},
                  released_at=epoch + 0.75, fields={"n": epoch}, global_step=3 * (epoch + 1))
    lines = (tmp_path / AUDIT_FILENAME).read_text().splitlines()
    assert len(lines) == 3 and all(json.loads(l) for l in lines)
    audit_lines = read_audit(str(tmp_path))
    assert [(l["epoch"], l["global_step"], l["n"]) for l in audit_lines] == [
        (0, 3, 0), (1, 6, 1), (2, 9, 2)]

  def test_a_new_audit_appends_to_an_existing_file(self, tmp_path):
    # A restarted chief keeps the lines of the epochs trained before the restart.
    EpochAudit(str(tmp_path)).write(0, {"chief:0": _stats(0, 1, 1, 0.0, 1.0)}, 2.0, {}, 1)
    EpochAudit(str(tmp_path)).write(1, {"chief:0": _stats(1, 1, 1, 2.0, 3.0)}, 4.0, {}, 2)
    assert [line["epoch"] for line in read_audit(str(tmp_path))] == [0, 1]

  def test_each_start_of_the_job_is_a_new_attempt(self, tmp_path):
    first = EpochAudit(str(tmp_path))
    first.write(0, {"chief:0": _stats(0, 1, 1, 0.0, 1.0)}, 2.0, {}, 1)
    first.write(1, {"chief:0": _stats(1, 1, 1, 2.0, 3.0)}, 4.0, {}, 2)
    assert EpochAudit(str(tmp_path)).attempt == 2
    EpochAudit(str(tmp_path)).write(2, {"chief:0": _stats(2, 1, 1, 4.0, 5.0)}, 6.0, {}, 3)
    assert [(l["epoch"], l["attempt"]) for l in read_audit(str(tmp_path))] == [
        (0, 1), (1, 1), (2, 2)]


def test_a_resumed_queue_epoch_counts_every_attempt_and_lists_workers_it_lacks(tmp_path):
  """`trained_across_attempts` (a work queue's resume) replaces the arrivals' counts, and a
  worker only an earlier attempt had gets a line of its own, without times."""
  audit = EpochAudit(str(tmp_path))
  arrivals = {"worker:0": EpochStats(1, 5, 40, 1.0, 2.0), "worker:1": EpochStats(1, 3, 24, 1.0,
                                                                                 2.5)}
  across = {"worker:0": {"batches": 7, "examples": 56}, "worker:1": {"batches": 3, "examples": 24},
            "worker:2": {"batches": 4, "examples": 32}}
  record = audit.write(1, arrivals, 3.0, {"trained_across_attempts": across}, global_step=14)
  assert "trained_across_attempts" not in record
  workers = read_audit(str(tmp_path))[0]["workers"]
  assert {w: (s["batches"], s["examples"]) for w, s in workers.items()} == {
      "worker:0": (7, 56), "worker:1": (3, 24), "worker:2": (4, 32)}
  assert workers["worker:2"]["arrived_at"] is None and workers["worker:2"]["attempt"] is None
  assert workers["worker:1"]["arrived_at"] == 2.5


def test_earlier_attempts_of_a_resumed_queue_epoch():
  """Units done before the resume count for their owner (less their skip), parts of units
  in flight for who trained them; an owner id past this job's workers is an earlier worker."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from hooks.workqueue.audit import earlier_attempts, worker_name  # pylint: disable=g-import-not-at-top
  state = {"order": np.array([2, 0, 1]), "resumed_next": 2, "owner": np.array([3, -1, 0]),
           "batches": np.array([4, -1, 6]), "examples": np.array([30, -1, 48]),
           "skip": np.array([1, 0, 2])}
  parts = [{"index": 2, "worker": "worker:1", "from": 0, "to": 2, "examples": 16},
           {"index": 0, "worker": "worker:3", "from": 0, "to": 1, "examples": 6}]
  assert earlier_attempts(state, parts, ["worker:0", "worker:1", "worker:2"]) == {
      "worker:1": [2, 16], "worker:3": [1 + 4 - 1, 6 + 30 - 6], "worker:0": [6 - 2, 48 - 16]}
  assert worker_name(["chief:0", "worker:0"], 3) == "worker:2"
  assert worker_name(["worker:0", "worker:1"], 3) == "worker:3"
  state["skip"] = np.array([1, 0, 3])  # unit 2's skip is not its recorded parts: examples unknown
  assert earlier_attempts(state, parts, ["worker:0"])["worker:0"] == [6 - 3, None]
