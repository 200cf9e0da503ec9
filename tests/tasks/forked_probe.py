"""What a forked task sees, for tests/test_fork_server.py: prints it as one JSON line, then acts.

Typical usage:
  python -m tests.tasks.forked_probe exit 3     # prints its view, exits 3
  python -m tests.tasks.forked_probe sleep      # prints its view, sleeps until killed
  python -m tests.tasks.forked_probe raise      # an uncaught exception (exit 1)
  python -m tests.tasks.forked_probe thread     # a non-daemon thread outlives main; atexit runs
"""

import atexit
import json
import os
import random
import sys
import threading
import time

import numpy as np


def main() -> None:
  action = sys.argv[1]
  print(json.dumps({"pid": os.getpid(), "pgid": os.getpgid(0), "cwd": os.getcwd(),
                    "argv": sys.argv[1:], "path0": sys.path[0],
                    "main_file": os.path.abspath(sys.modules["__main__"].__file__), "tf_config": os.environ.get("TF_CONFIG"),
                    "env": {k: os.environ[k] for k in ("GRPC_FAIL_FAST", "EPOCHSYNC_NUM_EPOCHS")
                            if k in os.environ},
                    "random": random.random(), "np_random": float(np.random.random())}),
        flush=True)
  if action == "exit":
    sys.exit(int(sys.argv[2]))
  if action == "sleep":
    time.sleep(600)
  if action == "raise":
    raise RuntimeError("the probe raised")
  if action == "thread":
    atexit.register(lambda: print("atexit ran", flush=True))
    threading.Thread(target=lambda: (time.sleep(0.5), print("thread done", flush=True))).start()


if __name__ == "__main__":
  main()
