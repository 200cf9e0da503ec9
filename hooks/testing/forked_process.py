"""Starts a task process as a fork of the fork server (TensorFlow imported once), else by Popen.

`start` returns either a `subprocess.Popen` or a `ForkedProcess` with the same surface (pid,
stdout, poll, wait, returncode). A task is forked when its command is `python -m <module>` or
`python <script.py>` and its environment agrees with the server's (this process's at the
server's start, with LocalCluster's TF_CPP_MIN_LOG_LEVEL=1) on every variable read before a
task's own code runs, which a fork would not read again: the dynamic linker's (LD_*), the
interpreter's (PYTHON*), TensorFlow's import's (TF_*), the C and math libraries' (MALLOC_*,
GLIBC_*, OMP_*, KMP_*, MKL_*, CUDA_*); TF_CONFIG, PYTHONPATH and PYTHONUNBUFFERED are applied
per task. A task that differs in one of them gets a process of its own; any other variable
(GRPC_*, EPOCHSYNC_*, ...) is the task's own, read at run time. Set
EPOCHSYNC_TEST_FORK_SERVER=0 to start every task by Popen.

Typical usage (inside hooks.testing.task_process._Task):
  proc = forked_process.start([sys.executable, "-m", "hooks.testing.ps_task"], env, cwd)
  for line in iter(proc.stdout.readline, b""): ...
  proc.wait(3.0)
  print(proc.pid, proc.returncode)
"""

import atexit
import json
import os
import select
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Mapping, Optional, Sequence, Union

ENABLE_ENV = "EPOCHSYNC_TEST_FORK_SERVER"
# What LocalCluster gives every task unless told otherwise; the server imports with the same.
TASK_ENV_DEFAULTS = {"TF_CPP_MIN_LOG_LEVEL": "1", "PYTHONUNBUFFERED": "1"}
_READ_AT_START = ("LD_", "PYTHON", "TF_", "MALLOC_", "GLIBC_", "OMP_", "KMP_", "MKL_", "CUDA_")
_PER_TASK = frozenset({"TF_CONFIG", "PYTHONPATH", "PYTHONUNBUFFERED"})
_READY_TIMEOUT_SECS = 120.0
_REPLY_TIMEOUT_SECS = 60.0
_GONE_POLL_SECS = 0.1
_PROJECT_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class ForkedProcess:
  """A task forked by the fork server; its exit status arrives on the request's connection."""

  def __init__(self, conn: socket.socket, pid: int, stdout_fd: int, argv: Sequence[str]):
    self.pid, self.args = pid, list(argv)
    self.stdout = os.fdopen(stdout_fd, "rb")
    self.returncode: Optional[int] = None
    self._conn = conn
    self._exited = threading.Event()
    threading.Thread(target=self._watch, daemon=True, name=f"forked-{pid}").start()

  def _watch(self) -> None:
    message = self._conn.recv(4096)
    self._conn.close()
    if message:
      self.returncode = json.loads(message)["returncode"]
    else:  # the server died first: wait for the pid to go, its status is lost
      while _exists(self.pid):
        time.sleep(_GONE_POLL_SECS)
      self.returncode = -9
    self._exited.set()

  def poll(self) -> Optional[int]:
    return self.returncode if self._exited.is_set() else None

  def wait(self, timeout: Optional[float] = None) -> int:
    if not self._exited.wait(timeout):
      raise subprocess.TimeoutExpired(self.args, timeout)
    return self.returncode


class _ForkServer:
  """The fork server process this process started, and the environment it imported with."""

  def __init__(self):
    env = dict(TASK_ENV_DEFAULTS, **os.environ)
    env.pop(ENABLE_ENV, None)
    self.env = {k: v for k, v in env.items() if _read_at_start(k)}
    self._dir = tempfile.mkdtemp(prefix="epochsync-fork-")
    self.socket_path = os.path.join(self._dir, "fork.sock")
    server_env = dict(env, PYTHONPATH=_PROJECT_ROOT)
    server_env.pop("TF_CONFIG", None)
    self._proc = subprocess.Popen(
        [sys.executable, "-m", "hooks.testing.fork_server", self.socket_path], env=server_env,
        cwd=_PROJECT_ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        start_new_session=True)
    ready, _, _ = select.select([self._proc.stdout], [], [], _READY_TIMEOUT_SECS)
    if not ready or self._proc.stdout.readline().strip() != b"ready":
      self.close()
      raise OSError(f"the fork server was not ready within {_READY_TIMEOUT_SECS:.0f} s")

  def agrees(self, env: Mapping[str, str]) -> bool:
    keys = {k for k in env if _read_at_start(k)} | set(self.env)
    return all(env.get(k) == self.env.get(k) for k in keys)

  def start(self, argv: Sequence[str], env: Mapping[str, str], cwd: str) -> ForkedProcess:
    read_fd, write_fd = os.pipe()
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    conn.settimeout(_REPLY_TIMEOUT_SECS)  # a fork takes milliseconds; a stuck server: Popen
    try:
      conn.connect(self.socket_path)
      main = {"module": argv[2], "args": list(argv[3:])} if argv[1] == "-m" else {
          "script": os.path.join(cwd, argv[1]), "args": list(argv[2:])}
      request = dict(main, argv0=argv[0], env=dict(env), cwd=cwd)
      socket.send_fds(conn, [json.dumps(request).encode()], [write_fd])
      reply = conn.recv(4096)
      if not reply:
        raise OSError("the fork server closed the connection without forking")
      conn.settimeout(None)  # the exit status comes when the task ends
    except OSError:
      conn.close()
      os.close(read_fd)
      raise
    finally:
      os.close(write_fd)
    return ForkedProcess(conn, json.loads(reply)["pid"], read_fd, argv)

  def close(self) -> None:
    self._proc.stdin.close()  # its lifeline: it exits
    try:
      self._proc.wait(5.0)
    except subprocess.TimeoutExpired:
      self._proc.kill()
      self._proc.wait()
    if os.path.exists(self.socket_path):
      os.unlink(self.socket_path)
    os.rmdir(self._dir)


_lock = threading.Lock()
_server: Optional[_ForkServer] = None
_server_failed = False


def start(argv: Sequence[str], env: Mapping[str, str],
          cwd: str) -> Union[subprocess.Popen, ForkedProcess]:
  """Starts `argv` in its own session with stdout+stderr on one pipe: forked when it can be."""
  server = _server_for(argv, env)
  if server is not None:
    try:
      return server.start(argv, env, cwd)
    except OSError:
      pass  # the server is gone: Popen below
  return subprocess.Popen(list(argv), env=dict(env), cwd=cwd, stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          start_new_session=True)


def _server_for(argv: Sequence[str], env: Mapping[str, str]) -> Optional[_ForkServer]:
  global _server, _server_failed
  if os.environ.get(ENABLE_ENV, "1") == "0" or not _forkable(argv):
    return None
  with _lock:
    if _server is None and not _server_failed:
      try:
        _server = _ForkServer()
        atexit.register(_server.close)
      except OSError:
        _server_failed = True
    return _server if _server is not None and _server.agrees(env) else None


def _read_at_start(key: str) -> bool:
  return key.startswith(_READ_AT_START) and key not in _PER_TASK


def _forkable(argv: Sequence[str]) -> bool:
  """`python -m module ...` or `python script.py ...`, with no interpreter options."""
  if len(argv) < 2 or argv[0] != sys.executable:
    return False
  return (argv[1] == "-m" and len(argv) >= 3) or argv[1].endswith(".py")


def _exists(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  return True
