"""Turns TF_CONFIG or the classic --job_name/--*_hosts flags into one validated, frozen config.

Typical usage:
  config = hooks.config.cluster.resolve(num_workers=FLAGS.epochsync_num_workers)
"""

import dataclasses
import json
import os
import types
from typing import Any, List, Mapping, Optional, Tuple, Union

from absl import flags as absl_flags

from hooks import log as logging
from hooks.config import joining
from hooks.config.cluster_checks import (CHIEF as _CHIEF, EVALUATOR as _EVALUATOR,
                                         JOBS as _JOBS, MASTER as _MASTER, PS as _PS,
                                         WHERE as _WHERE, WORKER as _WORKER,
                                         cluster_problems as _cluster_problems,
                                         growth_problems,
                                         task_problems as _task_problems,
                                         worker_problems)
from hooks.errors import raise_if_problems

__all__ = ["ClusterConfig", "resolve", "worker_problems"]

_TF_CONFIG_ENV = "TF_CONFIG"
_CLUSTER_KEY, _TASK_KEY, _TYPE_KEY, _INDEX_KEY = "cluster", "task", "type", "index"
_CLUSTER_FLAGS = ("job_name", "task_index", "ps_hosts", "worker_hosts", "chief_hosts",
                  "evaluator_hosts")


@dataclasses.dataclass(frozen=True)
class ClusterConfig:
  """Who is in a parameter-server cluster and which task this process is; validated, read-only.

  Build it with `resolve()` (TF_CONFIG first, then the classic flags), `from_tf_config` or
  `from_flags`. A "master" job or task type is renamed "chief". The chief is the chief task if a
  chief job exists, else worker:0. The evaluator is not part of `cluster_spec()`; an evaluator
  task may be missing from the cluster itself (Kubeflow's TF_CONFIG leaves it out). Usage:

      config = ClusterConfig.from_tf_config()  # reads os.environ["TF_CONFIG"]
      server = config.start_server()  # (or tf.distribute.Server(config.cluster_spec(), ...))
      sess = tf.compat.v1.Session(config.target, config=config.session_config())

  Example (checkable):

      cluster = {"chief": ["h0:1"], "worker": ["h1:1", "h2:1"], "ps": ["h3:1"]}
      task = {"type": "worker", "index": 1}
      os.environ["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": task})
      config = ClusterConfig.from_tf_config()
      assert config.task_name == "worker:1" and config.num_workers == 3 and config.worker_id == 2
      assert not config.is_chief and config.target == "grpc://h2:1"

  Args:
    cluster: `Mapping[str, Sequence[str]]` job (chief, worker, ps, evaluator) -> "host:port"s.
    task_type: `str` this task's job: chief, worker, ps or evaluator ("master" means chief).
    task_index: `int` this task's index within its job.
    source: `str` "TF_CONFIG", "flags" or "arguments"; named in errors and in `describe()`.
    launch_workers: `int` (a job that may grow) the chief and worker tasks the job was launched
      with: the ps tasks know only those; a worker with a higher id is beyond the launch
      (`beyond_launch`) and joins through `start_server()` and `session_config()`. 0: the
      cluster's.
    max_workers: `int` (a job that may grow) the most chief and worker tasks: `worker_names`
      has this many slots, those past the cluster's without an address until their worker
      joins (docs/elastic.md, "More workers than the launch's"). 0: the cluster's.

  Raises:
    ConfigError: listing every problem at once (bad or duplicate addresses, no ps job, no training
      task, several chiefs or evaluators, unknown task type, index out of range), each with its fix.
  """

  cluster: Mapping[str, Tuple[str, ...]] = dataclasses.field(hash=False)
  task_type: str
  task_index: int
  source: str = "arguments"
  launch_workers: int = 0
  max_workers: int = 0

  def __post_init__(self):
    w = _WHERE.get(self.source)
    raise_if_problems([f"source={self.source!r} is not one of {', '.join(_WHERE)}"] if w is None else [],
           "ClusterConfig")
    problems, jobs = _cluster_problems(self.cluster, w)
    raise_if_problems(problems + _task_problems(jobs, self.task_type, self.task_index, w),
           f"cluster from {self.source}")
    canon = {job: jobs.get(job) or (jobs.get(_MASTER) if job == _CHIEF else None) for job in _JOBS}
    canon = types.MappingProxyType({job: addrs for job, addrs in canon.items() if addrs})
    object.__setattr__(self, "cluster", canon)
    object.__setattr__(self, "task_type", _CHIEF if self.task_type == _MASTER else self.task_type)
    raise_if_problems(growth_problems(self.launch_workers, self.max_workers,
                                      len(self.listed_workers), w), f"cluster from {self.source}")

  def __reduce__(self):  # A MappingProxyType cannot be pickled or deep-copied: rebuild instead.
    return (ClusterConfig, (dict(self.cluster), self.task_type, self.task_index, self.source,
                            self.launch_workers, self.max_workers))

  @classmethod
  def from_tf_config(cls, tf_config: Union[str, Mapping[str, Any], None] = None) -> "ClusterConfig":
    """Parses the Kubeflow TFJob format; `tf_config` defaults to os.environ["TF_CONFIG"]."""
    what = "cluster from TF_CONFIG"
    tf_config = os.environ.get(_TF_CONFIG_ENV, "") if tf_config is None else tf_config
    if isinstance(tf_config, str):
      if not tf_config.strip():
        raise_if_problems(["TF_CONFIG is not set or empty; export TF_CONFIG or use the flags"], what)
      try:
        tf_config = json.loads(tf_config)
      except json.JSONDecodeError as e:
        here = e.doc[max(0, e.pos - 20):e.pos] + "<<HERE>>" + e.doc[e.pos:e.pos + 20]
        raise_if_problems([f"TF_CONFIG is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}: "
                f"{here!r}; fix the JSON (keys and strings need double quotes)"], what)
    if not isinstance(tf_config, Mapping):
      raise_if_problems([f"TF_CONFIG={tf_config!r} is not a JSON object; write "
              '{"cluster": ..., "task": ...}'], what)
    problems = [f'TF_CONFIG has no "{key}"; add "{key}": {example}' for key, example in (
        (_CLUSTER_KEY, '{"ps": ["host:port"], "worker": ["host:port", ...]}'),
        (_TASK_KEY, '{"type": "worker", "index": 0}')) if key not in tf_config]
    jobs, task = None, tf_config.get(_TASK_KEY)
    if _CLUSTER_KEY in tf_config:
      cluster_problems, jobs = _cluster_problems(tf_config[_CLUSTER_KEY], _WHERE["TF_CONFIG"])
      problems += cluster_problems
    if task is not None and not isinstance(task, Mapping):
      problems.append(f'TF_CONFIG["task"]={task!r} is not an object; write {{"type": "worker", '
                      '"index": 0}')
    elif task is not None:
      problems += _task_problems(jobs, task.get(_TYPE_KEY), task.get(_INDEX_KEY),
                                 _WHERE["TF_CONFIG"])
    raise_if_problems(problems, what)
    return cls(tf_config[_CLUSTER_KEY], task[_TYPE_KEY], task[_INDEX_KEY], "TF_CONFIG")

  @classmethod
  def from_flags(cls, job_name: Optional[str], task_index: Optional[int], ps_hosts: str,
                 worker_hosts: str, chief_hosts: str = "", evaluator_hosts: str = ""
                 ) -> "ClusterConfig":
    """Builds a config from the classic mnist_replica.py flags (comma-separated host:port lists)."""
    hosts = {_CHIEF: chief_hosts, _WORKER: worker_hosts, _PS: ps_hosts, _EVALUATOR: evaluator_hosts}
    cluster = {job: [h.strip() for h in (v or "").split(",") if h.strip()]
               for job, v in hosts.items()}
    return cls({job: a for job, a in cluster.items() if a}, job_name or None, task_index, "flags")

  def describe(self) -> str:
    """One line, e.g. "worker:1 of cluster {chief: 1, worker: 3, ps: 2} from TF_CONFIG"."""
    counts = ", ".join(f"{job}: {len(addrs)}" for job, addrs in self.cluster.items())
    grows = (f", launched with {self.launch_workers} of at most {self.max_workers} chief and "
             f"worker tasks{' (this one beyond the launch)' if self.beyond_launch else ''}"
             if self.max_workers else "")
    return f"{self.task_name} of cluster {{{counts}}} from {self.source}{grows}"

  __str__ = describe

  # Read-only views; the frozen fields above are the whole state.
  task_name = property(lambda self: f"{self.task_type}:{self.task_index}",
                       doc='This task as "worker:1", "chief:0" or "ps:0".')
  is_chief = property(lambda self: self.task_name == self.worker_names[0],
                      doc="True on the chief task if a chief job exists, else on worker:0.")
  is_ps = property(lambda self: self.task_type == _PS, doc="True on a ps task.")
  is_evaluator = property(lambda self: self.task_type == _EVALUATOR, doc="True on the evaluator.")
  num_workers = property(lambda self: len(self.worker_names),
                         doc="Number of chief+worker tasks (slots, in a job that may grow).")
  listed_workers = property(
      lambda self: tuple(f"{job}:{i}" for job in (_CHIEF, _WORKER)
                         for i in range(len(self.cluster.get(job, ())))),
      doc="The chief and worker tasks the cluster lists (with an address), in worker id order.")
  worker_names = property(
      lambda self: self.listed_workers + tuple(
          f"{_WORKER}:{i}" for i in range(len(self.cluster.get(_WORKER, ())),
                                          self.max_workers - (_CHIEF in self.cluster))),
      doc='Training tasks in a fixed order: "chief:0" (if any), then "worker:0".."worker:N-1"; '
          "in a job that may grow, `max_workers` of them.")
  num_ps = property(lambda self: len(self.cluster[_PS]), doc="Number of ps tasks.")
  ps_names = property(lambda self: tuple(f"{_PS}:{i}" for i in range(self.num_ps)),
                      doc='("ps:0", ..., "ps:N-1").')
  evaluator_name = property(
      lambda self: f"{_EVALUATOR}:0" if _EVALUATOR in self.cluster or self.is_evaluator else None,
      doc='"evaluator:0" if the cluster has an evaluator (or this task is it), else None.')
  target = property(
      lambda self: ("grpc://" + self.cluster[self.task_type][self.task_index]
                    if self.task_type in self.cluster else ""),
      doc='"grpc://host:port" of this task; "" for an evaluator outside the cluster (local).')
  job_device = property(lambda self: f"/job:{self.task_type}/task:{self.task_index}",
                        doc='This task\'s device prefix, e.g. "/job:worker/task:1".')

  @property
  def worker_id(self) -> int:
    """This task's position in `worker_names`; raises ValueError on a ps or evaluator task."""
    if self.task_name not in self.worker_names:
      raise ValueError(f"worker_id is only defined for chief and worker tasks, not "
                       f"{self.task_name}; check is_ps / is_evaluator first")
    return self.worker_names.index(self.task_name)

  @property
  def beyond_launch(self) -> bool:
    """True on a worker task that the ps tasks' cluster (the launch's) does not list."""
    return (bool(self.launch_workers) and self.task_name in self.listed_workers
            and self.worker_id >= self.launch_workers)

  @property
  def device_filters(self) -> List[str]:
    """["/job:ps", own job_device]; [] on a ps task. Keeps a task from waiting on its peers."""
    return [] if self.is_ps else [f"/job:{_PS}", self.job_device]

  def cluster_spec(self) -> Any:
    """The training cluster as a tf.train.ClusterSpec, without the evaluator (as in Estimator)."""
    # Imported here so that `import hooks.config.cluster` stays free of TensorFlow.
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    return tf.train.ClusterSpec({j: list(a) for j, a in self.cluster.items() if j != _EVALUATOR})

  def session_config(self) -> Any:
    """A tf.compat.v1.ConfigProto with `device_filters` set (and, on a worker beyond the launch,
    the cluster its sessions bring to the ps tasks: `with_propagated_cluster`)."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    return self.with_propagated_cluster(tf.compat.v1.ConfigProto(
        device_filters=self.device_filters))

  def with_propagated_cluster(self, session_config: Any) -> Any:
    """`session_config` itself, or on a worker beyond the launch with the cluster its sessions
    bring to the ps tasks, which know only the launch's workers (hooks.config.joining)."""
    if not self.beyond_launch:
      return session_config
    return joining.with_propagated_cluster(session_config, self.cluster[_PS], self.task_index,
                                           self.cluster[_WORKER][self.task_index])

  def start_server(self, config: Any = None, protocol: Optional[str] = None) -> Any:
    """This task's started `tf.distribute.Server`; `config`: a ConfigProto (default: the device
    filters). A worker beyond the launch boots as a joiner (hooks.config.joining).

        server = config.start_server()
        session = tf.compat.v1.Session(server.target, config=config.session_config())
    """
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    own = self.cluster[_WORKER][self.task_index] if self.beyond_launch else None
    return joining.start_server(
        self.cluster_spec(), self.task_type, self.task_index, own,
        config or tf.compat.v1.ConfigProto(device_filters=self.device_filters), protocol)

  def to_tf_config(self, task_type: Optional[str] = None, task_index: Optional[int] = None) -> str:
    """TF_CONFIG JSON for a task of this cluster, e.g. to hand to a launched process.

    Args:
      task_type: `str` the task's job; defaults to this task's (and task_index then defaults to 0).
      task_index: `int` the task's index; defaults to this task's when task_type is also omitted.

    Raises:
      ConfigError: the cluster has no such task.
    """
    if task_type is not None or task_index is not None:
      return dataclasses.replace(self, task_type=task_type or self.task_type,
                                 task_index=task_index or 0, source="arguments").to_tf_config()
    return json.dumps({_CLUSTER_KEY: {job: list(a) for job, a in self.cluster.items()},
                       _TASK_KEY: {_TYPE_KEY: self.task_type, _INDEX_KEY: self.task_index}})


def resolve(env: Optional[Mapping[str, str]] = None, flag_values: Any = None,
            num_workers: Optional[int] = None, max_workers: Optional[int] = None
            ) -> ClusterConfig:
  """This process's ClusterConfig: from TF_CONFIG if set and non-empty, else the classic flags.

  Args:
    env: `Mapping` the environment holding TF_CONFIG; defaults to os.environ.
    flag_values: `absl.flags.FlagValues` with --job_name etc. (parsed); defaults to absl's FLAGS.
    num_workers: `int` expected number of chief+worker tasks (--epochsync_num_workers), or None;
      with `max_workers`, the launch's (a task may list more: it is beyond the launch).
    max_workers: `int` the most chief+worker tasks of a job that may grow
      (--epochsync_max_workers), or None.

  Raises:
    ConfigError: the cluster is invalid, neither source is set, or num_workers disagrees.
  """
  tf_config = (os.environ if env is None else env).get(_TF_CONFIG_ENV) or ""
  if tf_config.strip():
    config = ClusterConfig.from_tf_config(tf_config)
  else:
    if flag_values is None:  # hooks.config.flags defines --job_name... on it
      flag_values = absl_flags.FLAGS
    undefined = [f"--{n}" for n in _CLUSTER_FLAGS[:4] if n not in flag_values]
    raise_if_problems([f"TF_CONFIG is not set and {', '.join(undefined)} not defined; set TF_CONFIG or call "
            "hooks.config.flags.define_cluster_flags(flag_values) before parsing"] if undefined else [],
           "cluster")
    values = {n: getattr(flag_values, n) for n in _CLUSTER_FLAGS if n in flag_values}
    raise_if_problems([] if values["job_name"] else [
        "neither TF_CONFIG nor --job_name is set; export TF_CONFIG (Kubeflow TFJob format) or "
        "pass --job_name, --task_index, --ps_hosts and --worker_hosts"], "cluster")
    config = ClusterConfig.from_flags(**values)
  if max_workers:
    config = dataclasses.replace(config, launch_workers=num_workers or 0, max_workers=max_workers)
  elif num_workers is not None and num_workers != config.num_workers:
    where = "TF_CONFIG" if config.source == "TF_CONFIG" else "--chief_hosts/--worker_hosts"
    raise_if_problems([f"num_workers={num_workers} but {where} lists {config.num_workers} chief+worker "
            f"tasks; set --epochsync_num_workers={config.num_workers} or fix {where}"],
           f"cluster from {config.source}")
  _log_once(config)
  return config


_logged: set = set()  # The configs this process has logged (flags, optimizer, session resolve it).


def _log_once(config: "ClusterConfig") -> None:
  """Logs the cluster at INFO the first time this process resolves this config."""
  line = f"tf-epochsync cluster: {config.describe()}"
  if line not in _logged:
    _logged.add(line)
    logging.info("%s", line)
