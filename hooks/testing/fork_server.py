"""A process that has imported TensorFlow once and forks every task process from there.

Each task of a LocalCluster used to pay TensorFlow's import (about 2.5 s of CPU) on its own;
a test of 5 tasks on 2 cores waited about 6 s for it before anything ran. This server imports
TensorFlow once; each task is a fork of it: a real separate process with its own pid, process
group, environment, working directory, stdout/stderr pipe and exit status, that runs
`python -m <module> <args>` or `python <script.py> <args>` the way the interpreter would
(runpy, SystemExit, atexit).

The server is single-threaded (it must be, to fork safely): one loop over its listening socket,
a SIGCHLD wake-up pipe and its stdin, which is its parent's lifeline (EOF: it exits). A client
sends one request per connection (a JSON message and the stdout pipe's write end); the server
answers the child's pid, then its exit status when it has reaped it, and closes the connection.

Typical usage (what hooks.testing.forked_process does for LocalCluster):
  python -m hooks.testing.fork_server /tmp/dir/fork.sock   # serves until its stdin closes
"""

import atexit
import io
import json
import os
import runpy
import select
import signal
import socket
import sys
import threading
import traceback

_MAX_REQUEST_BYTES = 1 << 20
_REQUEST_TIMEOUT_SECS = 10.0


def _preload() -> None:
  """What every task imports first: TensorFlow's v1 training API (and the estimator, if any)."""
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  tf.compat.v1.train.MonitoredTrainingSession  # pylint: disable=pointless-statement
  try:
    import tensorflow_estimator  # pylint: disable=import-outside-toplevel,unused-import
  except ImportError:
    pass


def _run_child(request: dict, out_fd: int, server_fds: list) -> None:
  """In the forked child: becomes the task's process and never returns."""
  code = 1
  try:
    os.setsid()  # its own process group: LocalCluster kills the group
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for fd in server_fds:
      os.close(fd)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(out_fd, 1)
    os.dup2(out_fd, 2)
    os.close(null)
    os.close(out_fd)
    env = request["env"]
    os.environ.clear()
    os.environ.update(env)
    os.chdir(request["cwd"])
    sys.path[0:0] = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    script = request.get("script")  # python path/to/script.py: its folder first, as python does
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)) if script else request["cwd"])
    unbuffered = bool(env.get("PYTHONUNBUFFERED"))
    for stream in (sys.stdout, sys.stderr):
      if isinstance(stream, io.TextIOWrapper):
        stream.reconfigure(line_buffering=True, write_through=unbuffered)
    # `random` reseeds itself in a fork (os.register_at_fork); numpy's global state does not.
    if "numpy" in sys.modules:
      sys.modules["numpy"].random.seed()
    code = _run_main(request.get("module"), script, request["args"], request["argv0"])
  except BaseException:  # pylint: disable=broad-except
    traceback.print_exc()
  finally:
    for stream in (sys.stdout, sys.stderr):
      try:
        stream.flush()
      except Exception:  # pylint: disable=broad-except
        pass
    os._exit(code)  # pylint: disable=protected-access


def _run_main(module: str, script: str, args: list, argv0: str) -> int:
  """Runs `module` (or the file `script`) as __main__; returns the exit code python would."""
  sys.argv = [script or argv0] + list(args)
  code = 0
  try:
    if script:
      runpy.run_path(script, run_name="__main__")
    else:
      runpy.run_module(module, run_name="__main__", alter_sys=True)
  except SystemExit as e:
    code = _exit_code(e.code)
  except BaseException:  # pylint: disable=broad-except
    traceback.print_exc()
    code = 1
  threading._shutdown()  # pylint: disable=protected-access  # waits for non-daemon threads
  atexit._run_exitfuncs()  # pylint: disable=protected-access
  return code


def _exit_code(value) -> int:
  if value is None:
    return 0
  if isinstance(value, int):
    return value
  print(value, file=sys.stderr)
  return 1


def serve(socket_path: str) -> None:
  """Accepts requests on `socket_path` until stdin closes; forks one child per request."""
  listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
  listener.bind(socket_path)
  listener.listen(64)
  wake_r, wake_w = os.pipe()
  os.set_blocking(wake_w, False)
  signal.signal(signal.SIGCHLD, lambda *_: None)
  signal.set_wakeup_fd(wake_w)
  waiting = {}  # pid -> the connection that asked for it
  print("ready", flush=True)
  parent_alive = True
  while parent_alive:
    readable, _, _ = select.select([listener, wake_r, sys.stdin], [], [])
    if sys.stdin in readable and not os.read(sys.stdin.fileno(), 1024):
      parent_alive = False  # its parent is gone (or done with it): forks nothing more
      continue
    if listener in readable:
      conn, _ = listener.accept()
      conn.settimeout(_REQUEST_TIMEOUT_SECS)  # a client sends its request as it connects
      try:
        message, fds, _, _ = socket.recv_fds(conn, _MAX_REQUEST_BYTES, 1)
      except OSError:
        conn.close()
        continue
      if len(fds) != 1:
        conn.close()  # the client then starts its task by Popen
        continue
      server_fds = [listener.fileno(), wake_r, wake_w, conn.fileno()] + [
          c.fileno() for c in waiting.values()]
      pid = os.fork()
      if pid == 0:
        _run_child(json.loads(message), fds[0], server_fds)
      os.close(fds[0])
      conn.sendall(json.dumps({"pid": pid}).encode())
      waiting[pid] = conn
    if wake_r in readable:
      os.read(wake_r, 1024)
      _reap(waiting)


def _reap(waiting: dict) -> None:
  """Sends each exited child's status to its client (as Popen's returncode) and closes it."""
  while waiting:
    try:
      pid, status = os.waitpid(-1, os.WNOHANG)
    except ChildProcessError:
      return
    if pid == 0:
      return
    conn = waiting.pop(pid, None)
    if conn is not None:
      try:
        conn.sendall(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}).encode())
      except OSError:
        pass  # the client is gone
      conn.close()


if __name__ == "__main__":
  _preload()
  serve(sys.argv[1])
