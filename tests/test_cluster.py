"""Tests for hooks/config/cluster.py: ClusterConfig, resolve() and worker_problems()."""

import copy
import dataclasses
import json
import os
import pickle
import subprocess
import sys
import textwrap
from unittest import mock

from absl import flags
import pytest

from hooks.config import cluster as cluster_lib
from hooks.config import flags as flags_lib
from hooks.config.cluster import ClusterConfig
from hooks.errors import ConfigError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CLUSTER = {
    "chief": ["h0:2222"],
    "worker": ["h1:2222", "h2:2222", "h3:2222"],
    "ps": ["p0:2222", "p1:2222"],
    "evaluator": ["e0:2222"],
}
NO_CHIEF = {"worker": ["h1:2222", "h2:2222"], "ps": ["p0:2222"]}


def tf_config(cluster=None, task_type="worker", task_index=0, **overrides):
  config = {"cluster": CLUSTER if cluster is None else cluster,
            "task": {"type": task_type, "index": task_index}}
  config.update(overrides)
  return json.dumps(config)


def all_tasks(cluster):
  return [(job, i) for job, addrs in cluster.items() for i in range(len(addrs))]


def test_exports():
  assert sorted(cluster_lib.__all__) == ["ClusterConfig", "resolve", "worker_problems"]


class TestWorkerProblems:

  def test_valid_triples_have_no_problem(self):
    assert cluster_lib.worker_problems(3, 2, ("chief:0", "worker:0", "worker:1")) == []
    assert cluster_lib.worker_problems(1, 0) == []

  @pytest.mark.parametrize("args,expected", [
      ((0, 0), ["num_workers=0 must be an integer >= 1 (pass ClusterConfig.num_workers)"]),
      ((True, 0), ["num_workers=True must be an integer >= 1 (pass ClusterConfig.num_workers)"]),
      ((3, 3), ["worker_id=3 is out of range: it must be in [0, 3) (pass ClusterConfig.worker_id)"]),
      ((3, -1, ("a", "b")),
       ["worker_id=-1 is out of range: it must be in [0, 3) (pass ClusterConfig.worker_id)",
        "worker_names has 2 names but num_workers=3 (pass ClusterConfig.worker_names)"]),
  ])
  def test_each_problem_is_named_with_its_fix(self, args, expected):
    assert cluster_lib.worker_problems(*args) == expected


def test_import_does_not_import_tensorflow():
  code = "import sys, hooks.config.cluster; assert 'tensorflow' not in sys.modules, 'tensorflow imported'"
  result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
  assert result.returncode == 0, result.stderr


class TestClusterConfig:

  def test_properties_from_tf_config_with_chief(self):
    config = ClusterConfig.from_tf_config(tf_config(task_type="worker", task_index=1))
    assert config.task_name == "worker:1"
    assert (config.task_type, config.task_index, config.source) == ("worker", 1, "TF_CONFIG")
    assert not config.is_chief and not config.is_ps and not config.is_evaluator
    assert config.num_workers == 4
    assert config.worker_names == ("chief:0", "worker:0", "worker:1", "worker:2")
    assert config.worker_id == 2
    assert config.ps_names == ("ps:0", "ps:1") and config.num_ps == 2
    assert config.evaluator_name == "evaluator:0"
    assert config.target == "grpc://h2:2222"
    assert config.job_device == "/job:worker/task:1"
    assert config.device_filters == ["/job:ps", "/job:worker/task:1"]
    assert config.describe() == (
        "worker:1 of cluster {chief: 1, worker: 3, ps: 2, evaluator: 1} from TF_CONFIG")
    assert str(config) == config.describe()

  def test_chief_task_with_chief_job(self):
    config = ClusterConfig.from_tf_config(tf_config(task_type="chief", task_index=0))
    assert config.is_chief and config.worker_id == 0 and config.target == "grpc://h0:2222"
    worker0 = ClusterConfig.from_tf_config(tf_config(task_type="worker", task_index=0))
    assert not worker0.is_chief and worker0.worker_id == 1

  def test_worker0_is_chief_without_chief_job(self):
    config = ClusterConfig.from_tf_config(tf_config(NO_CHIEF, "worker", 0))
    assert config.is_chief and config.worker_id == 0
    assert config.worker_names == ("worker:0", "worker:1") and config.num_workers == 2
    assert config.evaluator_name is None
    other = ClusterConfig.from_tf_config(tf_config(NO_CHIEF, "worker", 1))
    assert not other.is_chief and other.worker_id == 1

  @pytest.mark.parametrize("cluster", [CLUSTER, NO_CHIEF], ids=["chief", "no_chief"])
  def test_exactly_one_chief_and_dense_worker_ids(self, cluster):
    configs = [ClusterConfig(cluster, job, i) for job, i in all_tasks(cluster)]
    assert sum(c.is_chief for c in configs) == 1
    training = [c for c in configs if not (c.is_ps or c.is_evaluator)]
    assert sorted(c.worker_id for c in training) == list(range(len(training)))
    assert [c.task_name for c in sorted(training, key=lambda c: c.worker_id)] == list(
        training[0].worker_names)

  def test_ps_task(self):
    config = ClusterConfig(CLUSTER, "ps", 1)
    assert config.is_ps and not config.is_chief
    assert config.device_filters == [] and config.target == "grpc://p1:2222"
    with pytest.raises(ValueError, match="check is_ps / is_evaluator first"):
      _ = config.worker_id

  def test_evaluator_left_out_of_its_own_cluster_as_kubeflow_does(self):
    config = ClusterConfig.from_tf_config(tf_config(NO_CHIEF, "evaluator", 0))
    assert config.is_evaluator and not config.is_chief and config.task_name == "evaluator:0"
    assert config.target == "" and config.evaluator_name == "evaluator:0"
    assert config.worker_names == ("worker:0", "worker:1")
    with pytest.raises(ValueError, match="check is_ps / is_evaluator first"):
      config.worker_id

  def test_evaluator_task(self):
    config = ClusterConfig(CLUSTER, "evaluator", 0)
    assert config.is_evaluator and not config.is_chief
    assert config.device_filters == ["/job:ps", "/job:evaluator/task:0"]
    with pytest.raises(ValueError, match="only defined for chief and worker tasks"):
      _ = config.worker_id

  def test_master_is_an_alias_of_chief(self):
    cluster = {"master": ["m:1"], "worker": ["w:1"], "ps": ["p:1"]}
    config = ClusterConfig.from_tf_config(tf_config(cluster, "master", 0))
    assert config.task_type == "chief" and config.is_chief
    assert dict(config.cluster) == {"chief": ("m:1",), "worker": ("w:1",), "ps": ("p:1",)}
    assert config.job_device == "/job:chief/task:0"

  def test_from_environment_and_mapping(self, monkeypatch):
    monkeypatch.setenv("TF_CONFIG", tf_config(task_type="ps", task_index=1))
    from_env = ClusterConfig.from_tf_config()
    from_mapping = ClusterConfig.from_tf_config(json.loads(tf_config(task_type="ps", task_index=1)))
    assert from_env == from_mapping and from_env.task_name == "ps:1"

  def test_from_flags(self):
    config = ClusterConfig.from_flags("worker", 1, ps_hosts="p0:1, p1:1", worker_hosts="w0:1,w1:1,",
                                      chief_hosts="c:1", evaluator_hosts="e:1")
    assert config.source == "flags" and config.task_name == "worker:1"
    assert dict(config.cluster) == {"chief": ("c:1",), "worker": ("w0:1", "w1:1"),
                                    "ps": ("p0:1", "p1:1"), "evaluator": ("e:1",)}
    assert config.worker_id == 2 and config.target == "grpc://w1:1"
    assert str(config) == (
        "worker:1 of cluster {chief: 1, worker: 2, ps: 2, evaluator: 1} from flags")

  def test_from_flags_without_chief(self):
    config = ClusterConfig.from_flags("worker", 0, "p:1", "w0:1,w1:1")
    assert config.is_chief and config.worker_names == ("worker:0", "worker:1")
    assert "chief" not in config.cluster and "evaluator" not in config.cluster

  def test_cluster_spec_excludes_evaluator(self):
    spec = ClusterConfig(CLUSTER, "evaluator", 0).cluster_spec()
    assert sorted(spec.jobs) == ["chief", "ps", "worker"]
    assert spec.task_address("worker", 2) == "h3:2222"
    assert spec.as_dict()["ps"] == ["p0:2222", "p1:2222"]

  def test_session_config_sets_device_filters(self):
    proto = ClusterConfig(CLUSTER, "worker", 2).session_config()
    assert list(proto.device_filters) == ["/job:ps", "/job:worker/task:2"]
    assert list(ClusterConfig(CLUSTER, "ps", 0).session_config().device_filters) == []

  def test_to_tf_config_round_trip(self):
    config = ClusterConfig.from_tf_config(tf_config(task_type="worker", task_index=2))
    assert ClusterConfig.from_tf_config(config.to_tf_config()) == config
    ps1 = ClusterConfig.from_tf_config(config.to_tf_config("ps", 1))
    assert ps1.task_name == "ps:1" and ps1.cluster == config.cluster
    assert json.loads(config.to_tf_config("chief"))["task"] == {"type": "chief", "index": 0}
    from_flags = ClusterConfig.from_flags("ps", 0, "p:1", "w:1,x:1")
    parsed = ClusterConfig.from_tf_config(from_flags.to_tf_config())
    assert parsed == dataclasses.replace(from_flags, source="TF_CONFIG")

  def test_to_tf_config_rejects_missing_task(self):
    with pytest.raises(ConfigError, match=r"task_index=5 is out of range: job 'ps' has 2 task"):
      ClusterConfig(CLUSTER, "worker", 0).to_tf_config("ps", 5)

  def test_docstring_example_runs(self, monkeypatch):
    doc = ClusterConfig.__doc__
    example = textwrap.dedent(doc[doc.index("Example (checkable):") + 21:doc.index("  Args:")])
    monkeypatch.setenv("TF_CONFIG", "")  # The example sets it; monkeypatch restores it.
    namespace = {"os": os, "json": json, "ClusterConfig": ClusterConfig}
    exec(compile(example, "ClusterConfig.__doc__", "exec"), namespace)  # pylint: disable=exec-used
    assert namespace["config"].worker_id == 2

  def test_frozen_pickle_and_copy(self):
    config = ClusterConfig(CLUSTER, "worker", 0)
    with pytest.raises(dataclasses.FrozenInstanceError):
      config.task_index = 1
    with pytest.raises(TypeError):
      config.cluster["ps"] = ("x:1",)
    assert pickle.loads(pickle.dumps(config)) == config == copy.deepcopy(config)
    assert hash(config) == hash(ClusterConfig(CLUSTER, "worker", 0))


BAD_TF_CONFIGS = [
    ('{"cluster": {"ps": ["a:1"]}, task: 1}',
     r"not valid JSON: .* line 1 column 30: .*<<HERE>>task.*fix the JSON"),
    ("[1, 2]", r"is not a JSON object; write \{\"cluster\""),
    (json.dumps({"task": {"type": "worker", "index": 0}}), r'no "cluster"; add "cluster": \{"ps"'),
    (json.dumps({"cluster": NO_CHIEF}), r'no "task"; add "task": \{"type": "worker", "index": 0\}'),
    (tf_config(task_type="trainer"),
     r"\"type\"\]='trainer' is not a known task type; use one of chief, worker, ps, evaluator"),
    (tf_config(task_type="worker", task_index=3),
     r"\"index\"\]=3 is out of range: job 'worker' has 3 task\(s\) in TF_CONFIG\[\"cluster\"\]; "
     r"use an index below 3 or add addresses to TF_CONFIG\[\"cluster\"\]\[\"worker\"\]"),
    (tf_config(NO_CHIEF, "evaluator", 1), r"job 'evaluator' has 0 task\(s\).*add addresses to"),
    (tf_config(task_index=-1), r"\"index\"\]=-1 is negative; task indices start at 0"),
    (tf_config(task_index="1"), r"\"index\"\]='1' is not an integer; set it to the task's index"),
    (json.dumps({"cluster": NO_CHIEF, "task": {"type": "worker"}}),
     r"\"index\"\] is not set; set it"),
    (tf_config(dict(NO_CHIEF, chief=["c:1"], master=["m:1"])),
     r'both a "chief" and a "master" job; keep only "chief"'),
    (tf_config(dict(NO_CHIEF, chief=["c:1", "c:2"])),
     r"\[\"chief\"\] has 2 addresses \['c:1', 'c:2'\]; at most one chief is supported: keep one "
     r"and list the others under \"worker\""),
    (tf_config(dict(NO_CHIEF, master=["c:1", "c:2"])),
     r"at most one master is supported: keep one"),
    (tf_config({"worker": ["w:1"]}),
     r"no ps task: .*\[\"ps\"\] is missing or empty; .* add a ps job"),
    (tf_config({"worker": ["w:1"], "ps": []}), r"add a ps job with at least one \"host:port\""),
    (tf_config({"ps": ["p:1"]}, "ps", 0), r"no training task: .*add at least one worker"),
    (tf_config(dict(NO_CHIEF, evaluator=["e:1", "e:2"])),
     r"at most one evaluator is supported: keep one$"),
    (tf_config({"worker": ["w:1", "p:1"], "ps": ["p:1"]}),
     r"address 'p:1' is used by both worker:1 and ps:0 in TF_CONFIG\[\"cluster\"\]; give every "
     r"task its own host:port"),
    (tf_config({"worker": ["localhost"], "ps": ["p:1"]}),
     r"\[\"worker\"\]\[0\]='localhost' is not host:port with an integer port; write it like"),
    (tf_config({"worker": ["w:x"], "ps": ["p:1"]}), r"'w:x' is not host:port"),
    (tf_config({"worker": [":2222"], "ps": ["p:1"]}), r"':2222' is not host:port"),
    (tf_config({"worker": ["w:0"], "ps": ["p:70000"]}), r"'p:70000' is not host:port"),
    (tf_config({"worker": "w:1,w:2", "ps": ["p:1"]}), r"='w:1,w:2' is not a list; write \["),
    (tf_config(dict(NO_CHIEF, trainer=["t:1"])),
     r"has unknown job 'trainer'; use only chief, worker, ps, evaluator"),
    (tf_config(["w:1"]), r"TF_CONFIG\[\"cluster\"\]=\['w:1'\] is not a mapping; write"),
    ("  ", r"TF_CONFIG is not set or empty; export TF_CONFIG or use the flags"),
]


class TestClusterConfigValidation:

  @pytest.mark.parametrize("text, match", BAD_TF_CONFIGS)
  def test_bad_tf_config(self, text, match):
    with pytest.raises(ConfigError, match=match) as info:
      ClusterConfig.from_tf_config(text)
    assert str(info.value).startswith("invalid cluster from TF_CONFIG (")

  def test_every_problem_is_reported_at_once(self):
    bad = {"cluster": {"worker": ["w:1", "w:1", "nohost"], "evaluator": ["e:1", "e:2"]},
           "task": {"type": "trainer", "index": 0}}
    with pytest.raises(ConfigError, match=r"\(5 problem\(s\)\)") as info:
      ClusterConfig.from_tf_config(json.dumps(bad))
    for fix in ("give every task its own host:port", "write it like", "keep one",
                "add a ps job", "is not a known task type"):
      assert fix in str(info.value)

  def test_missing_cluster_and_task_are_both_reported(self):
    with pytest.raises(ConfigError, match=r'(?s)no "cluster".*no "task"'):
      ClusterConfig.from_tf_config("{}")

  def test_flag_sources_are_named(self):
    with pytest.raises(ConfigError, match=r"--task_index is not set; set it") as info:
      ClusterConfig.from_flags("worker", None, ps_hosts="", worker_hosts="w:1,bad")
    assert "--worker_hosts[1]='bad' is not host:port" in str(info.value)
    assert "no ps task: --ps_hosts is missing or empty" in str(info.value)
    with pytest.raises(ConfigError, match=r"--job_name is not set; set it to one of chief"):
      ClusterConfig.from_flags("", 0, "p:1", "w:1")

  def test_argument_source_and_bad_source(self):
    with pytest.raises(ConfigError, match=r"task_index=2 is out of range: job 'worker' has 2"):
      ClusterConfig(NO_CHIEF, "worker", 2)
    with pytest.raises(ConfigError, match=r"source='env' is not one of TF_CONFIG, flags, argum"):
      ClusterConfig(NO_CHIEF, "worker", 0, source="env")


def _cluster_flags(*argv):
  flag_values = flags.FlagValues()
  flags_lib.define_cluster_flags(flag_values)
  flag_values(["prog", *argv])
  return flag_values


class TestResolve:

  def test_tf_config_takes_precedence_over_flags(self):
    flag_values = _cluster_flags("--job_name=ps", "--task_index=0", "--ps_hosts=p:1",
                                 "--worker_hosts=w:1")
    config = cluster_lib.resolve(env={"TF_CONFIG": tf_config(task_index=1)},
                                 flag_values=flag_values)
    assert config.source == "TF_CONFIG" and config.task_name == "worker:1"

  @pytest.mark.parametrize("env", [{}, {"TF_CONFIG": ""}, {"TF_CONFIG": " \n"}])
  def test_flags_when_tf_config_unset_or_empty(self, env):
    flag_values = _cluster_flags("--job_name=worker", "--task_index=1", "--ps_hosts=p:1",
                                 "--worker_hosts=w:1,w:2", "--chief_hosts=c:1")
    config = cluster_lib.resolve(env=env, flag_values=flag_values, num_workers=3)
    assert config.source == "flags" and config.worker_id == 2

  def test_neither_source(self):
    with pytest.raises(ConfigError, match=r"neither TF_CONFIG nor --job_name is set; export "
                                          r"TF_CONFIG .* or pass --job_name, --task_index"):
      cluster_lib.resolve(env={}, flag_values=_cluster_flags())

  def test_cluster_flags_not_defined(self):
    with pytest.raises(ConfigError, match=r"call hooks.config.flags.define_cluster_flags\(flag_values\)"):
      cluster_lib.resolve(env={}, flag_values=flags.FlagValues())

  def test_num_workers_mismatch_with_tf_config(self):
    with pytest.raises(ConfigError, match=r"num_workers=3 but TF_CONFIG lists 4 chief\+worker "
                                          r"tasks; set --epochsync_num_workers=4 or fix TF_CONFIG"):
      cluster_lib.resolve(env={"TF_CONFIG": tf_config()}, num_workers=3)
    assert cluster_lib.resolve(env={"TF_CONFIG": tf_config()}, num_workers=4).num_workers == 4

  def test_num_workers_mismatch_with_flags(self):
    flag_values = _cluster_flags("--job_name=worker", "--task_index=0", "--ps_hosts=p:1",
                                 "--worker_hosts=w:1,w:2")
    with pytest.raises(ConfigError, match=r"set --epochsync_num_workers=2 or fix "
                                          r"--chief_hosts/--worker_hosts"):
      cluster_lib.resolve(env={}, flag_values=flag_values, num_workers=5)

  def test_logs_the_cluster_once(self):
    """Once per process and config, though flags, the optimizer and the session resolve it."""
    with mock.patch.object(cluster_lib.logging, "info") as info, \
        mock.patch.object(cluster_lib, "_logged", set()):
      for _ in range(3):
        config = cluster_lib.resolve(env={"TF_CONFIG": tf_config(task_index=1)})
      info.assert_called_once()
      assert config.describe() in info.call_args.args[0] % info.call_args.args[1:]
      other = cluster_lib.resolve(env={"TF_CONFIG": tf_config(task_index=2)})
      assert info.call_count == 2
      assert other.describe() in info.call_args.args[0] % info.call_args.args[1:]




class TestAJobThatMayGrow:
  """launch_workers / max_workers (--epochsync_num_workers with --epochsync_max_workers)."""

  CLUSTER = {"chief": ["h0:1"], "worker": ["h1:1", "h2:1"], "ps": ["p0:1", "p1:1"]}

  def test_the_slots_past_the_cluster_are_named_and_only_its_workers_have_addresses(self):
    config = ClusterConfig(self.CLUSTER, "worker", 0, launch_workers=3, max_workers=5)
    assert config.worker_names == ("chief:0", "worker:0", "worker:1", "worker:2", "worker:3")
    assert config.listed_workers == ("chief:0", "worker:0", "worker:1")
    assert config.num_workers == 5 and not config.beyond_launch
    assert "launched with 3 of at most 5 chief and worker tasks" in config.describe()
    assert not config.session_config().HasField("cluster_def")
    assert pickle.loads(pickle.dumps(config)) == config

  def test_a_worker_beyond_the_launch_brings_its_cluster_to_the_ps_tasks(self):
    config = ClusterConfig(self.CLUSTER, "worker", 1, launch_workers=2, max_workers=4)
    assert config.beyond_launch and config.worker_id == 2
    session_config = config.session_config()
    assert list(session_config.device_filters) == ["/job:ps", "/job:worker/task:1"]
    jobs = {job.name: dict(job.tasks) for job in session_config.cluster_def.job}
    assert jobs == {"ps": {0: "p0:1", 1: "p1:1"}, "worker": {1: "h2:1"}}
    assert session_config.experimental.share_session_state_in_clusterspec_propagation
    assert "(this one beyond the launch)" in config.describe()

  @pytest.mark.parametrize("launch, most, match", [
      (3, 2, r"max_workers=2 is below num_workers=3"),
      (4, 5, r"lists 3 chief and worker tasks: a job launched with num_workers=4"),
      (1, 2, r"lists 3 chief and worker tasks: .* grows to at most max_workers=2"),
      (0, 5, r"max_workers=5 needs num_workers"),
      (2, 0, r"max_workers=0 needs num_workers"),
      (-1, 4, r"launch_workers=-1 must be an integer >= 0")])
  def test_counts_that_do_not_fit_the_cluster_are_refused_with_the_fix(self, launch, most, match):
    with pytest.raises(ConfigError, match=match):
      ClusterConfig(self.CLUSTER, "worker", 0, launch_workers=launch, max_workers=most)
