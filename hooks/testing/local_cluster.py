"""Runs a real TensorFlow parameter-server cluster on localhost: one OS process per task.

Every task gets ports from portpicker, its own TF_CONFIG, its own process group and a log
file; the whole job has one hard deadline, and only the process groups started here are
ever killed. This module does not import TensorFlow: only the task processes do.

Typical usage:
  with LocalCluster(num_workers=3, num_ps=1, timeout_secs=120) as cluster:
    cluster.start([sys.executable, "-m", "examples.train", "--epochsync_num_epochs=3"])
    result = cluster.wait()          # ps tasks still serve here: read their variables
  result.check()                     # raises ClusterLaunchError naming the failed task
"""

import json
import os
import signal
import sys
import tempfile
import time
from typing import Callable, Dict, List, Mapping, Optional, Sequence

import portpicker

from hooks.testing import forked_process
from hooks.testing.task_process import ClusterResult, TaskResult, _Task, _signal_group

__all__ = ["LocalCluster", "TaskResult", "ClusterResult", "run_cluster", "PS_COMMAND"]

PS_COMMAND = (sys.executable, "-m", "hooks.testing.ps_task")
_PROJECT_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_POLL_SECS = 0.05


class LocalCluster:
  """A localhost cluster of `num_ps` ps tasks and `num_workers` training tasks.

  Use it for tests, examples and benchmarks that must run real separate processes.

    with LocalCluster(num_workers=3, timeout_secs=60) as cluster:
      cluster.start([sys.executable, "-m", "examples.train"])
      result = cluster.wait()
    result.check()

  Args:
    num_workers: `int`, training tasks (a `chief` task counts as one when `has_chief`).
    num_ps: `int`, parameter-server tasks; they run `ps_command` until the job ends.
    has_chief: `bool`, add a separate `chief` job instead of making worker:0 the chief.
    has_evaluator: `bool`, add one `evaluator` task running the training command.
    timeout_secs: `float`, hard deadline for the whole job; tasks still running are killed.
    fail_fast_secs: `float` or None, once a task fails, kill the rest after this long.
    stream_logs: `bool`, echo every task's output prefixed with `[worker:2]`.
    log_dir: where `<task>.log` files go (default: a new temporary directory).
    env: extra environment variables for every task.
    launch_workers: `int` (a job that may grow) the training tasks the launch's cluster lists:
      the ps tasks and the first this many chief and worker tasks get a TF_CONFIG listing only
      those; each later worker's lists the workers up to itself (a replica count raised on a
      running TFJob). None: every task's lists every task.
    on_line: `Callable[[str, str], None]`, called with (task name, line) for every line a
      task prints, from that task's log thread (e.g. to echo progress lines).

  Raises:
    ValueError: for counts below 1 or a non-positive timeout.
  """

  def __init__(self, num_workers: int = 3, num_ps: int = 1, *, has_chief: bool = False,
               has_evaluator: bool = False, timeout_secs: float = 120.0,
               fail_fast_secs: Optional[float] = 10.0, stream_logs: bool = False,
               log_dir: Optional[str] = None, env: Optional[Mapping[str, str]] = None,
               ps_command: Sequence[str] = PS_COMMAND,
               on_line: Optional[Callable[[str, str], None]] = None,
               launch_workers: Optional[int] = None):
    if num_workers < 1 or num_ps < 1:
      raise ValueError(f"num_workers={num_workers}, num_ps={num_ps}: both must be >= 1")
    if timeout_secs <= 0:
      raise ValueError(f"timeout_secs={timeout_secs} must be > 0")
    self.timeout_secs = timeout_secs
    self.fail_fast_secs = fail_fast_secs
    self.stream_logs = stream_logs
    self.log_dir = log_dir or tempfile.mkdtemp(prefix="epochsync-cluster-")
    os.makedirs(self.log_dir, exist_ok=True)
    self._env = dict(env or {})
    self._ps_command = tuple(ps_command)
    self._on_line = on_line
    self._launch_workers = launch_workers
    jobs = {"ps": num_ps, "worker": num_workers - 1 if has_chief else num_workers}
    if has_chief:
      jobs["chief"] = 1
    if has_evaluator:
      jobs["evaluator"] = 1
    self.cluster: Dict[str, List[str]] = {
        job: [f"localhost:{portpicker.pick_unused_port()}" for _ in range(n)]
        for job, n in jobs.items() if n}
    self._tasks: Dict[str, _Task] = {}
    self._deadline: Optional[float] = None

  @property
  def training_task_names(self) -> List[str]:
    names = ["chief:0"] if "chief" in self.cluster else []
    names += [f"worker:{i}" for i in range(len(self.cluster.get("worker", [])))]
    return names + (["evaluator:0"] if "evaluator" in self.cluster else [])

  def tf_config(self, task_type: str, index: int) -> str:
    """The TF_CONFIG JSON that task `task_type:index` is started with (evaluator excluded)."""
    cluster = {job: addrs for job, addrs in self.cluster.items() if job != "evaluator"}
    if self._launch_workers is not None:  # the launch's workers, or the workers up to this one
      listed = self._launch_workers - ("chief" in cluster)
      cluster["worker"] = cluster["worker"][:max(listed, index + 1 if task_type == "worker"
                                                 else 0)]
    return json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}})

  def target(self, task_name: str) -> str:
    """The gRPC target (`grpc://localhost:port`) of a task such as `ps:0`."""
    job, index = task_name.split(":")
    return "grpc://" + self.cluster[job][int(index)]

  def start(self, command: Sequence[str],
            per_task_args: Optional[Mapping[str, Sequence[str]]] = None) -> None:
    """Starts every ps task, then every training task running `command` (+ its extra args).

    `per_task_args` maps a task name ("worker:1", "ps:0") to extra arguments of its command.
    """
    if self._tasks:
      raise RuntimeError("LocalCluster.start() was already called")
    self._deadline = time.monotonic() + self.timeout_secs
    per_task_args = per_task_args or {}
    for i in range(len(self.cluster["ps"])):
      self._spawn(f"ps:{i}", list(self._ps_command) + list(per_task_args.get(f"ps:{i}", ())))
    for name in self.training_task_names:
      self._spawn(name, list(command) + list(per_task_args.get(name, ())))

  def kill_task(self, name: str, sig: int = signal.SIGKILL) -> float:
    """Sends `sig` to task `name`'s process group (a fault test's kill); returns the time.

    Returns:
      time.monotonic() just after the signal was sent.
    """
    _signal_group(self._tasks[name].proc.pid, sig)
    return time.monotonic()

  def restart_task(self, name: str, argv: Optional[Sequence[str]] = None) -> None:
    """Starts task `name` again at the same address (as Kubernetes restarts a pod).

    The old process must have exited (e.g. after kill_task); its log is kept as
    `<task>.log.<n>`. `argv` replaces its command (default: the same one).
    """
    old = self._tasks[name]
    if old.poll() is None:
      raise RuntimeError(f"{name} is still running; kill it first")
    old.kill()
    n = sum(1 for f in os.listdir(self.log_dir) if f.startswith(os.path.basename(old.log_path)))
    os.rename(old.log_path, f"{old.log_path}.{n}")
    self._tasks[name] = _Task(name, argv or old.argv, old.env, old.log_path, old.stream,
                              old._on_line)

  def _spawn(self, name: str, argv: Sequence[str]) -> None:
    task_type, index = name.split(":")
    env = dict(os.environ)
    env.update(self._env)
    env["TF_CONFIG"] = self.tf_config(task_type, int(index))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_PROJECT_ROOT, env.get("PYTHONPATH")) if p)
    for variable, value in forked_process.TASK_ENV_DEFAULTS.items():
      env.setdefault(variable, value)
    log_path = os.path.join(self.log_dir, name.replace(":", "-") + ".log")
    self._tasks[name] = _Task(name, argv, env, log_path, self.stream_logs, self._on_line)

  def wait(self) -> ClusterResult:
    """Waits (bounded by the job deadline) for every training task; ps tasks keep running."""
    if self._deadline is None:
      raise RuntimeError("call LocalCluster.start() before wait()")
    training = [self._tasks[n] for n in self.training_task_names]
    first_failure: Optional[float] = None
    while any(t.poll() is None for t in training):
      now = time.monotonic()
      failed = [t for t in self._tasks.values() if t.poll() not in (None, 0)]
      crashed_ps = [t for t in self._tasks.values() if t.name.startswith("ps:") and
                    t.poll() is not None]
      if (failed or crashed_ps) and first_failure is None:
        first_failure = now
      fail_fast = (first_failure is not None and self.fail_fast_secs is not None and
                   now - first_failure > self.fail_fast_secs)
      if now > self._deadline or fail_fast:
        for t in training:
          if t.poll() is None:
            t.timed_out = True
            t.kill()
        break
      time.sleep(_POLL_SECS)
    results = {t.name: t.result() for t in training}
    for t in self._tasks.values():
      if t.name.startswith("ps:") and t.poll() is not None:
        results[t.name] = t.result()  # a ps must never exit on its own
    return ClusterResult(results, time.monotonic() - (self._deadline - self.timeout_secs))

  def results(self) -> Dict[str, TaskResult]:
    """The training tasks' current state (returncode None: still running), without waiting."""
    for name in self.training_task_names:
      self._tasks[name].poll()
    return {name: self._tasks[name].result() for name in self.training_task_names}

  @property
  def pids(self) -> Dict[str, int]:
    return {name: t.proc.pid for name, t in self._tasks.items()}

  def close(self) -> None:
    """Kills every process group this cluster started; safe to call twice."""
    for t in self._tasks.values():
      t.kill()

  def __enter__(self) -> "LocalCluster":
    return self

  def __exit__(self, *exc) -> None:
    self.close()


def run_cluster(command: Sequence[str], **kwargs) -> ClusterResult:
  """Starts a LocalCluster (kwargs as its constructor), waits for it and tears it down."""
  per_task_args = kwargs.pop("per_task_args", None)
  with LocalCluster(**kwargs) as cluster:
    cluster.start(command, per_task_args)
    return cluster.wait()
