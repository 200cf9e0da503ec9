"""Nothing tf-epochsync logs prints secrets from the environment; TF_CONFIG only as parsed.

A small real job runs with secret-looking environment variables (and TensorFlow's C++ logs
at their most verbose level); no task's log, the ps tasks' included, may contain them or the
raw TF_CONFIG JSON.
"""

import glob
import os
import sys

import pytest

from hooks.testing.local_cluster import LocalCluster

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

TASK = [sys.executable, os.path.join(os.path.dirname(__file__), "tasks", "epoch_task.py")]
SECRET = "epochsync-test-secret-5d1f0c7a9b"


@pytest.mark.timeout(150)
def test_no_task_log_prints_a_secret_from_the_environment(tmp_path):
  env = {"EPOCHSYNC_TEST_API_TOKEN": SECRET, "AWS_SECRET_ACCESS_KEY": SECRET + "-aws",
         "TF_CPP_MIN_LOG_LEVEL": "0"}  # TensorFlow's own C++ logs at their most verbose
  model_dir = str(tmp_path / "model")
  command = TASK + [f"--model_dir={model_dir}", "--shard_batches=3,2", "--epochsync_num_epochs=2",
                    "--epochsync_sync=False", "--epochsync_log_every_secs=0.2",
                    "--step_sleep_secs=0.1"]
  log_dir = str(tmp_path / "logs")
  with LocalCluster(num_workers=2, timeout_secs=90, log_dir=log_dir, env=env) as cluster:
    cluster.start(command, per_task_args={"worker:1": ["--slowdown=5"]})  # worker:0 waits, logs
    result = cluster.wait()
    raw_tf_configs = [cluster.tf_config(job, int(index)) for job, index in
                      (name.split(":") for name in ["ps:0"] + cluster.training_task_names)]
  result.check()
  logs = {os.path.basename(p): open(p, errors="replace").read()
          for p in glob.glob(os.path.join(log_dir, "*.log"))}
  assert sorted(logs) == ["ps-0.log", "worker-0.log", "worker-1.log"]
  assert "still waiting at epoch_end" in logs["worker-0.log"]  # the waits did log
  for name, text in logs.items():
    assert SECRET not in text, f"{name} prints a secret from the environment"
    for raw in raw_tf_configs:
      assert raw not in text, f"{name} prints the raw TF_CONFIG"
  assert ("tf-epochsync cluster: worker:0 of cluster {worker: 2, ps: 1} from TF_CONFIG"
          in logs["worker-0.log"])
