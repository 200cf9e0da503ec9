"""One task process of a LocalCluster, and what it left: its exit status and its log.

Each task runs in a process group of its own, with its output copied to a log file (and
optionally to this process, each line prefixed with the task's name); killing a task kills its
group only, SIGTERM first, SIGKILL after a grace period.

Typical usage (inside LocalCluster):
  task = _Task("worker:1", argv, env, log_path, stream=False, on_line=None)
  if task.poll() is not None: result = task.result(timed_out=False)
"""

import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Callable, List, Mapping, Optional, Sequence

from hooks.errors import ClusterLaunchError
from hooks.testing import forked_process

__all__ = ["TaskResult", "ClusterResult"]

_PROJECT_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_KILL_GRACE_SECS = 3.0
_TAIL_LINES = 15


@dataclasses.dataclass(frozen=True)
class TaskResult:
  """How one task ended: `returncode` is None while it ran, `timed_out` if it was killed."""
  name: str
  pid: int
  returncode: Optional[int]
  timed_out: bool
  log_path: str
  elapsed_secs: float
  ended_at: Optional[float] = None  # time.monotonic() when it exited (None: still running)

  @property
  def log(self) -> str:
    with open(self.log_path, errors="replace") as f:
      return f.read()

  @property
  def ok(self) -> bool:
    return self.returncode == 0 and not self.timed_out

  def tail(self, lines: int = _TAIL_LINES) -> str:
    return "\n".join(self.log.rstrip().splitlines()[-lines:])


@dataclasses.dataclass(frozen=True)
class ClusterResult:
  """The training tasks' results (chief, workers, evaluator), by task name."""
  tasks: Mapping[str, TaskResult]
  elapsed_secs: float

  @property
  def failed(self) -> List[TaskResult]:
    return [t for t in self.tasks.values() if not t.ok]

  def check(self) -> "ClusterResult":
    """Returns self if every task exited 0, else raises ClusterLaunchError naming each failure."""
    if not self.failed:
      return self
    parts = []
    for t in self.failed:
      why = (f"killed at the job deadline after {t.elapsed_secs:.1f} s" if t.timed_out
             else f"exited with code {t.returncode}")
      parts.append(f"{t.name} {why}; last lines of {t.log_path}:\n{_indent(t.tail())}")
    raise ClusterLaunchError(f"{len(parts)} task(s) failed:\n" + "\n".join(parts))


class _Task:
  """One running process of the cluster and the thread that copies its output to a log."""

  def __init__(self, name: str, argv: Sequence[str], env: Mapping[str, str], log_path: str,
               stream: bool, on_line: Optional[Callable[[str, str], None]] = None):
    self.name = name
    self.argv, self.env, self.stream = list(argv), dict(env), stream
    self._on_line = on_line
    self.log_path = log_path
    self.started = time.monotonic()
    self.ended: Optional[float] = None
    self.timed_out = False
    self._log = open(log_path, "w")
    self.proc = forked_process.start(argv, env, _PROJECT_ROOT)
    self._copier = threading.Thread(target=self._copy, args=(stream,), daemon=True)
    self._copier.start()

  def _copy(self, stream: bool) -> None:
    for raw in iter(self.proc.stdout.readline, b""):
      line = raw.decode(errors="replace")
      self._log.write(line)
      self._log.flush()
      if self._on_line is not None:
        self._on_line(self.name, line)
      if stream:
        sys.stdout.write(f"[{self.name}] {line}")
        sys.stdout.flush()

  def poll(self) -> Optional[int]:
    code = self.proc.poll()
    if code is not None and self.ended is None:
      self.ended = time.monotonic()
    return code

  def kill(self) -> None:
    """SIGTERM then SIGKILL to this task's own process group (and nothing else)."""
    if self.poll() is None:
      _signal_group(self.proc.pid, signal.SIGTERM)
      try:
        self.proc.wait(_KILL_GRACE_SECS)
      except subprocess.TimeoutExpired:
        pass
    _signal_group(self.proc.pid, signal.SIGKILL)  # also stray children of an exited leader
    self.proc.wait()
    self.poll()
    self._copier.join(timeout=_KILL_GRACE_SECS)
    self._log.close()

  def result(self) -> TaskResult:
    end = self.ended if self.ended is not None else time.monotonic()
    return TaskResult(self.name, self.proc.pid, self.proc.returncode, self.timed_out,
                      self.log_path, end - self.started, self.ended)


def _signal_group(pid: int, sig: int) -> None:
  try:
    os.killpg(pid, sig)  # pid == pgid: every task leads its own session
  except ProcessLookupError:
    pass


def _indent(text: str) -> str:
  return "\n".join("    " + line for line in text.splitlines())
