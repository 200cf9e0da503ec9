"""The fork server: a forked task is a process of its own, as one started by Popen would be."""

import json
import os
import signal
import subprocess
import sys

import pytest

from hooks.testing import forked_process
from hooks.testing.local_cluster import PS_COMMAND, LocalCluster

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _env(**extra):
  env = dict(os.environ, PYTHONPATH=ROOT, PYTHONUNBUFFERED="1")
  env.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # as LocalCluster sets it
  env.pop(forked_process.ENABLE_ENV, None)
  env.update(extra)
  return env


def _start(*args, **env):
  return forked_process.start([sys.executable, "-m", "tests.tasks.forked_probe", *args],
                              _env(**env), ROOT)


def _finish(proc, timeout=60):
  out = proc.stdout.read().decode()
  proc.wait(timeout)
  proc.stdout.close()
  return json.loads(out.splitlines()[0]), out


def test_a_forked_task_has_its_own_pid_group_argv_env_and_exit_code():
  proc = _start("exit", "3", TF_CONFIG='{"task": 1}')
  assert isinstance(proc, forked_process.ForkedProcess)
  view, _ = _finish(proc)
  assert proc.returncode == 3
  assert view["pid"] == proc.pid != os.getpid()
  assert view["pgid"] == proc.pid  # its own process group: LocalCluster kills it by group
  assert view["argv"] == ["exit", "3"] and view["tf_config"] == '{"task": 1}'
  assert view["cwd"] == ROOT


def test_a_script_runs_as_main_with_its_folder_first_on_the_path():
  script = os.path.join("tests", "tasks", "forked_probe.py")
  proc = forked_process.start([sys.executable, script, "exit", "0"], _env(), ROOT)
  assert isinstance(proc, forked_process.ForkedProcess)
  view, _ = _finish(proc)
  assert proc.returncode == 0
  assert view["main_file"] == os.path.join(ROOT, script)
  assert view["path0"] == os.path.join(ROOT, "tests", "tasks")  # as `python script.py` has it


def test_two_forks_draw_different_random_numbers():
  views = [_finish(_start("exit", "0"))[0] for _ in range(2)]
  assert views[0]["random"] != views[1]["random"]
  assert views[0]["np_random"] != views[1]["np_random"]


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_a_signalled_task_ends_with_the_signal_as_popen_reports_it(sig):
  proc = _start("sleep")
  view = json.loads(proc.stdout.readline())
  assert proc.poll() is None
  with pytest.raises(subprocess.TimeoutExpired):
    proc.wait(0.2)
  os.killpg(view["pgid"], sig)
  assert proc.wait(30) == -sig
  proc.stdout.close()


def test_an_uncaught_exception_exits_1_with_its_traceback():
  _, out = _finish(proc := _start("raise"))
  assert proc.returncode == 1
  assert "RuntimeError: the probe raised" in out


def test_the_exit_waits_for_non_daemon_threads_then_runs_atexit():
  _, out = _finish(proc := _start("thread"))
  assert proc.returncode == 0
  assert out.index("thread done") < out.index("atexit ran")


@pytest.mark.parametrize("variable", [
    {"TF_CPP_MIN_LOG_LEVEL": "0"},  # read when TensorFlow is imported: the server has
    {"LD_PRELOAD": ""}])  # read when a process is exec'd: a fork never is
def test_a_variable_read_before_the_tasks_code_that_differs_gets_a_process_of_its_own(variable):
  other = _start("exit", "0", **variable)
  assert isinstance(other, subprocess.Popen)
  _finish(other)


def test_a_variable_read_at_run_time_is_the_forked_tasks_own():
  proc = _start("exit", "0", GRPC_FAIL_FAST="true", EPOCHSYNC_NUM_EPOCHS="3")
  assert isinstance(proc, forked_process.ForkedProcess)
  view, _ = _finish(proc)
  assert view["env"] == {"GRPC_FAIL_FAST": "true", "EPOCHSYNC_NUM_EPOCHS": "3"}


def test_the_switch_turns_the_fork_server_off(monkeypatch):
  monkeypatch.setenv(forked_process.ENABLE_ENV, "0")
  proc = _start("exit", "4")
  assert isinstance(proc, subprocess.Popen)
  _finish(proc)
  assert proc.returncode == 4


@pytest.mark.cluster
def test_a_local_clusters_tasks_are_forks_of_the_server_not_children_of_this_process():
  with LocalCluster(num_workers=2, timeout_secs=60) as cluster:
    cluster.start(list(PS_COMMAND))  # every task serves: nothing to wait for
    parents = {name: _parent(pid) for name, pid in cluster.pids.items()}
  assert os.getpid() not in parents.values(), parents
  assert len(set(parents.values())) == 1  # the fork server


def _parent(pid: int) -> int:
  with open(f"/proc/{pid}/stat") as f:
    return int(f.read().rsplit(")", 1)[1].split()[1])
