"""examples/demo_report.py, what ./es demo prints: the echoed progress lines and the final table."""

import io
import os
import re
import subprocess
import sys

import pytest

from examples import demo_report as demo

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

AUDIT = [{"epoch": e, "global_step": 9 * (e + 1), "workers": {
    "worker:0": {"examples": 72, "started_at": 100.0, "arrived_at": 100.5,
                 "barrier_wait_secs": 0.25},
    "worker:1": {"examples": 40, "started_at": 100.0, "arrived_at": 100.75,
                 "barrier_wait_secs": 0.0}}} for e in range(2)]


def test_epoch_table_has_one_row_per_epoch_and_three_numbers_per_worker():
  rows = demo.epoch_table(AUDIT)
  assert rows[0].split() == ["epoch", "|", "worker:0", "|", "worker:1", "|", "global_step"]
  assert rows[1].split() == ["|"] + ["examples", "secs", "wait", "|"] * 2
  assert rows[2].split() == ["0", "|", "72", "0.50", "0.25", "|", "40", "0.75", "0.00", "|", "9"]
  assert rows[3].split()[0] == "1" and rows[3].split()[-1] == "18"
  assert len(rows) == 4


def test_a_resumed_epoch_is_marked_and_explained_below_the_table():
  resumed = dict(AUDIT[1], attempts=[1, 2], resumed_from=[{"attempt": 2, "global_step": 13}])
  rows = demo.epoch_table([AUDIT[0], resumed])
  assert rows[2].split()[0] == "0" and rows[3].split()[0] == "1*"
  assert rows[4] == ("* epoch 1 took attempts 1-2 (resumed at global_step 13): examples count "
                     "every attempt, secs and wait are attempt 2's")
  assert len(rows) == 5


def test_progress_printer_echoes_progress_and_the_chiefs_epoch_lines_only():
  out = io.StringIO()
  on_line = demo.progress_printer(out)
  on_line("worker:1", "I1122 17:02:00.1 42 progress.py:97] progress worker:1 epoch 0 done: "
                      "5/5 batches of its shard, 40 examples in 0.40 s, 100.0 examples/s\n")
  on_line("worker:0", "I1122 17:02:00.2 42 audit.py:57] epoch 0 done on all 3 workers: ...\n")
  on_line("worker:0", "I1122 17:02:00.3 42 barrier.py:150] worker:0 waiting at start, epoch 0\n")
  on_line("ps:0", "some unrelated line\n")
  on_line("worker:2", "I1122 17:02:00.4 42 unit_passes.py:48] worker:2 took unit 3 "
                      "(part-3.tfrecord[0:]) in epoch 0\n")
  assert out.getvalue().splitlines() == [
      "  progress worker:1 epoch 0 done: 5/5 batches of its shard, 40 examples in 0.40 s, "
      "100.0 examples/s",
      "  worker:0: epoch 0 done on all 3 workers: ...",
      "  worker:2 took unit 3 (part-3.tfrecord[0:]) in epoch 0"]


def test_unit_table_lists_each_workers_units_in_the_order_it_took_them():
  line = {"epoch": 1, "units": [
      {"unit": "/d/part-2.tfrecord[0:]", "worker": "worker:1", "first_batch": 4, "batches": 3},
      {"unit": "/d/part-0.tfrecord[0:]", "worker": "worker:0", "first_batch": 0, "batches": 9},
      {"unit": "/d/part-1.tfrecord[0:]", "worker": "worker:1", "first_batch": 0, "batches": 4}]}
  assert demo.unit_table([dict(AUDIT[0]), line]) == [
      "epoch 1 worker:0   part-0.tfrecord[0:] (9)  = 9 batches",
      "epoch 1 worker:1   part-1.tfrecord[0:] (4), part-2.tfrecord[0:] (3)  = 7 batches"]


@pytest.mark.cluster
@pytest.mark.slow
@pytest.mark.timeout(200)
def test_the_demo_with_work_units_prints_who_trained_which_unit(tmp_path):
  """`./es demo --work_units --shard_batches=9,1,5,2,7,3`: 6 units over 3 workers, 2 epochs."""
  out = subprocess.run(
      [sys.executable, "-m", "examples.local_cluster", "--work_units",
       "--shard_batches=9,1,5,2,7,3", "--num_epochs=2", f"--model_dir={tmp_path / 'run'}",
       "--timeout_secs=150"], cwd=ROOT, capture_output=True, text=True, timeout=180)
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  assert re.search(r"worker:\d took unit \d \(<rows>\[\d+:\d+\]\) in epoch 1", out.stdout)
  table = out.stdout.split("units per epoch and worker, in the order each took them")[1]
  for epoch in (0, 1):
    rows = re.findall(rf"epoch {epoch} worker:\d .*= (\d+) batches", table)
    assert sum(map(int, rows)) == 27, table


@pytest.mark.cluster
@pytest.mark.slow
@pytest.mark.timeout(200)
def test_the_elastic_demo_with_a_spare_loses_worker_1_and_the_spare_takes_its_place(tmp_path):
  """docs/elastic.md's demo with a spare: worker:1 SIGKILLed inside its first unit, worker:2
  (the spare) joins in its place; the table marks worker:1 lost and shows worker:2's units."""
  out = subprocess.run(
      [sys.executable, "-m", "examples.local_cluster", "--work_units",
       "--shard_batches=90,70,80,60,90,50", "--num_epochs=2", "--lose_worker=worker:1",
       "--lose_after_secs=1", f"--model_dir={tmp_path / 'run'}", "--timeout_secs=150", "--",
       "--epochsync_sync=false", "--epochsync_elastic", "--epochsync_spare_workers=1"],
      cwd=ROOT, capture_output=True, text=True, timeout=180)
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  assert "worker:2 joined epoch 0 (a spare, in place of a lost worker)" in out.stdout or (
      "a spare standing by (worker:2) joins in its place" in out.stdout), out.stdout[-3000:]
  table = out.stdout.split("units per epoch and worker, in the order each took them")[1]
  assert re.search(r"epoch 1 worker:2 .*= \d+ batches", table), table
  assert not re.search(r"epoch 1 worker:1 ", table), table


def test_exports():
  assert sorted(demo.__all__) == ["epoch_table", "progress_printer", "unit_table"]


@pytest.mark.cluster
@pytest.mark.slow
@pytest.mark.estimator  # examples.ctr_train: estimator_ext
@pytest.mark.timeout(300)
def test_the_ctr_demo_writes_its_data_trains_and_evaluates_every_epoch(tmp_path):
  """`./es demo --api=estimator --model=ctr` (docs/estimator.md), 2 epochs on shards 3/2/0."""
  out = subprocess.run(
      [sys.executable, "-m", "examples.local_cluster", "--api=estimator", "--model=ctr",
       "--num_epochs=2", "--shard_batches=3,2,0", f"--model_dir={tmp_path / 'run'}",
       "--timeout_secs=240"], cwd=ROOT, capture_output=True, text=True, timeout=280)
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  assert "wrote 3 training files and 1 eval file" in out.stdout
  evaluations = out.stdout.split("evaluations by evaluator:0")[1]
  assert re.findall(r"epoch (\d): global_step (\d+)", evaluations) == [("0", "5"), ("1", "10")]
  assert "auc" in evaluations


def test_a_lost_worker_shows_as_lost_in_both_tables():
  lost = dict(AUDIT[0], workers=dict(AUDIT[0]["workers"], **{"worker:1": {
      "lost": True, "batches": 3, "examples": None, "started_at": None, "arrived_at": None,
      "barrier_wait_secs": None}}), units=[
          {"unit": "<rows>[0:72]", "worker": "worker:0", "first_batch": 0, "batches": 9,
           "resumed_after": 3, "taken_back": [{"worker": "worker:1", "batches": 3}]}])
  rows = demo.epoch_table([lost])
  assert rows[2].split() == ["0", "|", "72", "0.50", "0.25", "|", "lost", "(3", "batches)", "|",
                             "9"]
  assert demo.unit_table([lost]) == [
      "epoch 0 worker:0   <rows>[0:72] (9, the first 3 from lost worker:1)  = 9 batches"]
  out = io.StringIO()
  demo.progress_printer(out)("worker:0", "W1127 00:21:29.6 42 lost_workers.py:105] worker:1 is "
                                         "lost in epoch 0 (...); elastic: ...\n")
  assert out.getvalue() == "  worker:1 is lost in epoch 0 (...); elastic: ...\n"
