"""A healthy run's logs hold no warning, error or traceback that a job could avoid.

Runs the two demos as `./es demo` does (the MonitoredSession job: 1 ps + 3 workers; the
Estimator job: chief + 2 workers, 2 ps, an evaluator) and the MonitoredSession job with an
embedding table split over 2 ps (sparse gradients), each for 3 epochs, then reads every task's
log (ps and evaluator included). Any line at WARNING or above, in TensorFlow's C++ format
(`... W tensorflow/...`), absl's (`W1123 ...`) or Python's (`WARNING:...`), any Python warning
and any traceback fails the test, except `ALLOWED`: TensorFlow's own notices that no job can
avoid.
"""

import glob
import os
import re
import subprocess
import sys

import pytest

from hooks.config import tf_version as _tf_version
from log_checks import ALLOWED, alarms

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\d [\d:.]+: |(?<=^[WEF])\d{4} [\d:.]+ +\d+ ")

_JOBS = {
    "mts": [],
    "estimator": ["--api=estimator"],
    "mts_2ps": ["--num_ps=2", "--", "--model=embedding", "--features=12"],
    "mts_units": ["--work_units"],  # the work queue (docs/workqueue.md)
}


@pytest.mark.timeout(600)
def test_healthy_runs_log_no_avoidable_warning(tmp_path):
  """Every job on TensorFlow 2.15; on 2.16+ (./es test --tf=2.21) all but the Estimator's."""
  found, logs = {}, {}
  jobs = {job: args for job, args in _JOBS.items()
          if job != "estimator" or not _tf_version.estimator_unavailable_reason()}
  for job, args in jobs.items():
    model_dir = str(tmp_path / job)
    demo = subprocess.run(
        [sys.executable, "-m", "examples.local_cluster", f"--model_dir={model_dir}",
         "--timeout_secs=150"] + args, cwd=ROOT, capture_output=True, text=True, timeout=200)
    assert demo.returncode == 0, f"{job} failed:\n{demo.stdout[-3000:]}\n{demo.stderr[-3000:]}"
    paths = sorted(glob.glob(os.path.join(model_dir, "logs", "*.log")))
    expected = {"mts": 4, "estimator": 6, "mts_2ps": 5, "mts_units": 4}[job]  # ps and evaluator included
    assert len(paths) == expected, paths
    for path in paths:
      with open(path, errors="replace") as f:
        logs[f"{job}/{os.path.basename(path)}"] = f.read()
  for name, text in logs.items():
    bad = [_TIMESTAMP.sub("", line) for line in alarms(text)]  # the same line, once
    if bad:
      found[name] = sorted(set(bad), key=bad.index)
  assert not found, "avoidable warnings in a healthy run:\n" + "\n".join(
      f"  {name}: {len(lines)} distinct\n" + "\n".join(f"    {l[:300]}" for l in lines[:8])
      for name, lines in found.items())
  assert any("tf-epochsync cluster:" in text for text in logs.values())  # the project's lines
  # Each fact once per task: the cluster (not on a ps), and each epoch's end on each training
  # task (its progress line and its done line; EpochInput's own line only without progress).
  facts = {"cluster": " of cluster {"}
  facts.update({f"epoch {e} done": f"epoch {e} done: " for e in range(3)})
  facts.update({f"done with epoch {e}": f" done with epoch {e}; " for e in range(3)})
  repeated = {}
  for name, text in logs.items():
    training = re.search(r"/(chief|worker)-\d+\.log$", name)
    want = {fact: 0 if "/ps-" in name else 1 if fact == "cluster" or training else 0
            for fact in facts}
    wrong = {fact: text.count(s) for fact, s in facts.items() if text.count(s) != want[fact]}
    if wrong:
      repeated[name] = wrong
  assert not repeated, f"facts not logged once per task (count of each): {repeated}"


def test_the_scan_sees_each_format_and_the_allow_list_only_its_notices():
  """The filter itself: these lines from the old code's logs are caught; the notice is not."""
  caught = [
      "2026-11-23 20:28:42.458330: W tensorflow/core/kernels/conditional_accumulator_base.cc:45]"
      " Attempt to set current_global_step_ to smaller value: current_global_step_ = 1 >= 0 = "
      "new_global_step.",
      "WARNING:tensorflow:Issue encountered when serializing epochsync_run_start_hooks.",
      "W1123 20:28:41.070314 140486382095232 meta_graph.py:416] Issue encountered when "
      "serializing epochsync_run_start_hooks.",
      "E1123 20:28:41.070314 140486382095232 barrier.py:1] worker:1 timed out",
      "ERROR:tensorflow:boom",
      "/x/y.py:3: UserWarning: something",
      "Traceback (most recent call last):",
      "E0000 00:00:1795468076.912047    2104 grpc_server_lib.cc:9] something new",
      "W0000 00:00:1795468076.912047    2104 accumulator.cc:45] another runtime warning",
      "WARNING:tensorflow:From /x/hooks/sync/tokens.py:108: SessionRunArgs.__new__ (from tensorflow."
      "python.training.session_run_hook) is deprecated and will be removed in a future version"
      ". But more",
  ]
  allowed = [
      "WARNING:tensorflow:From /x/estimator_ext/run_config.py:196: RunConfig.__init__ (from "
      "tensorflow_estimator.python.estimator.run_config) is deprecated and will be removed in "
      "a future version.",
      "W1123 20:28:40.1 140 deprecation.py:50] From /v/compat/v2_compat.py:108: "
      "disable_resource_variables (from tensorflow.python.ops.variable_scope) is deprecated "
      "and will be removed in a future version.",
      "I1123 20:28:44.1 140 barrier.py:231] chief:0 passed epoch_end, epoch 0, after 0.237 s",
      "INFO:tensorflow:loss = 10.359863, step = 0",
      "'RunStartHook' object has no attribute 'name'",  # caught by the line before it
      "W0000 00:00:1795468076.912047    2104 local_rendezvous.cc:412] Local rendezvous is "
      "aborting with status: ABORTED: Cleanup 9626 [type.googleapis.com/x='']",
      "2026-11-23 21:08:01.500000: I tensorflow/core/util/port.cc:113] oneDNN is on",
      "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
  ]
  assert alarms("\n".join(caught)) == caught
  assert alarms("\n".join(allowed)) == []
