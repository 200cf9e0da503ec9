"""How a worker beyond the launch's cluster reaches its ps tasks (--epochsync_max_workers,
docs/elastic.md, "More workers than the launch's"): TensorFlow's ClusterSpec propagation, pinned.

A ps receives a worker's tensors by calling that worker (RecvTensor), so it must know the
worker's address. Its cluster is the one it was launched with: a worker that is not in it fails
its first step, even if its own cluster lists it. A session can bring its own cluster instead
(`ConfigProto.cluster_def`): each task then serves the session in a worker session that knows
that cluster. Two conditions, both pinned here: the new worker's server must boot under a job
name the propagated cluster does not give it (TensorFlow refuses a cluster naming the server's
own task), and the ps must share the launch's variables with that session
(`experimental.share_session_state_in_clusterspec_propagation`; without it the session sees
fresh, empty resource containers).

hooks.config.cluster.ClusterConfig does both for such a worker (`start_server`,
`session_config`); tests/test_elastic_growth.py runs a whole job that grows. If one of these tests
fails, a TensorFlow release changed the runtime that growth rests on.
"""

import subprocess
import sys

import portpicker
import pytest
import tensorflow as tf

_v1 = tf.compat.v1

# The worker beyond the launch: its own process and server; it adds 1.0 to ps:0's `v` 3 times
# (its add runs on /job:worker/task:1, so ps:0 receives the 1.0 from it) and prints the sums.
_BEYOND = r"""
import sys
import tensorflow as tf
_v1 = tf.compat.v1
_v1.disable_eager_execution()
ps, own, mode = sys.argv[1:4]
if mode == "grown":   # the launch's cluster with this worker added; the ps's lacks it
  server = tf.distribute.Server(tf.train.ClusterSpec({"ps": [ps], "worker": ["unused:1", own]}),
                                job_name="worker", task_index=1)
else:                 # booted as job "beyond"; the session brings a cluster naming it worker:1
  server = tf.distribute.Server(tf.train.ClusterSpec({"beyond": [own]}), job_name="beyond",
                                task_index=0)
with _v1.device("/job:ps/task:0"):
  v = _v1.get_variable("v", [], tf.float32, use_resource=True)
with _v1.device("/job:worker/task:1"):
  one = _v1.random.uniform([]) * 0.0 + 1.0
add = v.assign_add(one)
config = _v1.ConfigProto(device_filters=["/job:ps", "/job:worker/task:1"])
if mode != "grown":
  cluster = tf.train.ClusterSpec({"ps": [ps], "worker": {1: own}})
  config.cluster_def.CopyFrom(cluster.as_cluster_def())
  config.experimental.share_session_state_in_clusterspec_propagation = mode == "shared"
with _v1.Session(server.target, config=config) as session:
  try:
    for _ in range(3):
      print("sum", session.run(add, options=_v1.RunOptions(timeout_in_ms=20000)), flush=True)
  except tf.errors.OpError as error:
    print("error", type(error).__name__, " ".join(error.message.split()), flush=True)
"""


@pytest.fixture(scope="module")
def launch():
  """ps:0 and worker:0 of a launch of 1 worker (in this process); `v` on ps:0 starts at 0."""
  ps, worker = (f"localhost:{portpicker.pick_unused_port()}" for _ in range(2))
  spec = tf.train.ClusterSpec({"ps": [ps], "worker": [worker]})
  servers = [tf.distribute.Server(spec, job_name=job, task_index=0) for job in ("ps", "worker")]
  graph = tf.Graph()
  with graph.as_default():
    with _v1.device("/job:ps/task:0"):
      v = _v1.get_variable("v", [], tf.float32, _v1.zeros_initializer(), use_resource=True)
    read = v.read_value()
    value = _v1.placeholder(tf.float32, [])
    assign = v.assign(value)
  config = _v1.ConfigProto(device_filters=["/job:ps", "/job:worker/task:0"])
  session = _v1.Session(servers[1].target, graph=graph, config=config)
  session.run(v.initializer)

  def reset_and_read(start=None):
    if start is not None:
      session.run(assign, {value: start})
    return session.run(read)

  yield ps, reset_and_read
  session.close()


def _beyond(ps: str, mode: str):
  """The beyond worker's printed lines: ["sum", value] each, or ["error", kind, message]."""
  own = f"localhost:{portpicker.pick_unused_port()}"
  result = subprocess.run([sys.executable, "-c", _BEYOND, ps, own, mode], capture_output=True,
                          text=True, timeout=120, start_new_session=True, check=False)
  lines = [line.split(" ", 2) for line in result.stdout.splitlines()]
  assert lines, result.stderr[-3000:]
  return lines


def _error(ps: str, mode: str):
  """(kind, message) of the beyond worker's one line, an error."""
  ((said, kind, message),) = _beyond(ps, mode)
  assert said == "error", message
  return kind, message


def test_a_worker_the_ps_was_not_launched_with_fails_its_first_step(launch):
  ps, state = launch
  state(0.0)
  kind, message = _error(ps, "grown")
  assert kind == "InternalError", message
  assert "No worker known as /job:worker/replica:0/task:1" in message
  assert state() == 0.0


def test_a_propagated_cluster_lets_it_train_on_the_launchs_variables(launch):
  ps, state = launch
  state(10.0)
  assert _beyond(ps, "shared") == [["sum", "11.0"], ["sum", "12.0"], ["sum", "13.0"]]
  assert state() == 13.0  # the launch's worker sees the beyond worker's adds


def test_without_shared_state_the_propagated_session_sees_no_variable(launch):
  ps, state = launch
  state(0.0)
  kind, message = _error(ps, "isolated")
  assert kind == "NotFoundError", message
  assert "Could not find resource: ps/v" in message
  assert state() == 0.0


# A worker beyond the launch whose server booted as the task it is (the old way); its session
# creator (hooks.session.creators) says how to start it.
_BOOTED_AS_ITSELF = r"""
import sys
import tensorflow as tf
from hooks.config.cluster import ClusterConfig
from hooks.session.creators import FastWorkerSessionCreator
_v1 = tf.compat.v1
_v1.disable_eager_execution()
ps, own = sys.argv[1:3]
config = ClusterConfig({"ps": [ps], "worker": ["unused:1", own]}, "worker", 1,
                       launch_workers=1, max_workers=2)
server = tf.distribute.Server(config.cluster_spec(), config.task_type, config.task_index)
with _v1.device("/job:ps/task:0"):
  v = _v1.get_variable("v", [], tf.float32, use_resource=True)
creator = FastWorkerSessionCreator(master=server.target, config=config.session_config(),
                                   max_wait_secs=30, task_name=config.task_name)
try:
  creator.create_session()
  print("error none: the session was created")
except Exception as error:  # pylint: disable=broad-except
  print("error", type(error).__name__, " ".join(str(error).split()), flush=True)
"""


def test_a_worker_beyond_the_launch_booted_as_itself_is_told_to_start_its_server_so(launch):
  ps, _ = launch
  own = f"localhost:{portpicker.pick_unused_port()}"
  result = subprocess.run([sys.executable, "-c", _BOOTED_AS_ITSELF, ps, own],
                          capture_output=True, text=True, timeout=120, start_new_session=True,
                          check=False)
  said, kind, message = result.stdout.strip().splitlines()[-1].split(" ", 2)
  assert (said, kind) == ("error", "ConfigError"), result.stdout + result.stderr[-3000:]
  assert "worker:1 is beyond the launch's cluster" in message
  assert "Start this task's server with config.start_server()" in message
