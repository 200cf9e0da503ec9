"""examples/k8s/: every replica's TF_CONFIG (as the training operator builds it) and EPOCHSYNC_*
environment give one consistent cluster and one set of settings (tfjob.yaml, ctr-tfjob.yaml,
elastic-tfjob.yaml); the
CTR job reads what ctr-data.yaml writes; each NetworkPolicy admits its own job's pods only; and
every manifest uses the restart policy docs/deploy.md and docs/quickstart-k8s.md recommend."""

import copy
import json
import os
import sys
import re
import subprocess

from absl import flags
from absl.testing import flagsaver
import pytest

from hooks.config import flags as epochsync_flags
from hooks.config.cluster import ClusterConfig

yaml = pytest.importorskip("yaml", reason="PyYAML is in the `test` extra of setup.cfg")

MANIFEST = os.path.join(os.path.dirname(os.path.dirname(__file__)), "examples", "k8s",
                        "tfjob.yaml")
DEFAULT_PORT = 2222  # the operator's default when no port is named tfjob-port


def _load(path=MANIFEST):
  with open(path) as f:
    return yaml.safe_load(f)


def _container(spec):
  containers = spec["template"]["spec"]["containers"]
  return next(c for c in containers if c["name"] == "tensorflow")


def _port(spec):
  ports = _container(spec).get("ports", [])
  return next((p["containerPort"] for p in ports if p.get("name") == "tfjob-port"), DEFAULT_PORT)


def operator_tf_configs(job):
  """{(type, index): TF_CONFIG JSON} as Kubeflow's training operator generates them.

  Each replica type becomes a lower-case job of "<name>-<type>-<i>.<namespace>.svc:<port>";
  the evaluator is left out of the cluster (also of its own TF_CONFIG), as the operator does.
  """
  name, namespace = job["metadata"]["name"], job["metadata"].get("namespace", "default")
  specs = job["spec"]["tfReplicaSpecs"]
  cluster = {}
  for rtype, spec in specs.items():
    rt = rtype.lower()
    if rt == "evaluator":
      continue
    cluster[rt] = [f"{name}-{rt}-{i}.{namespace}.svc:{_port(spec)}"
                   for i in range(spec.get("replicas", 1))]
  return {(rtype.lower(), i): json.dumps({"cluster": cluster,
                                          "task": {"type": rtype.lower(), "index": i},
                                          "environment": "cloud"})
          for rtype, spec in specs.items() for i in range(spec.get("replicas", 1))}


def _env(spec):
  return {e["name"]: e["value"] for e in _container(spec).get("env", [])}


def test_shape_is_chief_workers_two_ps_and_an_evaluator():
  job = _load()
  assert (job["apiVersion"], job["kind"]) == ("kubeflow.org/v1", "TFJob")
  replicas = {t: s["replicas"] for t, s in job["spec"]["tfReplicaSpecs"].items()}
  assert replicas == {"Chief": 1, "Worker": 3, "PS": 2, "Evaluator": 1}
  assert all(s["restartPolicy"] == "OnFailure" for s in job["spec"]["tfReplicaSpecs"].values())
  assert job["spec"]["runPolicy"]["cleanPodPolicy"] == "Running"


def test_every_replica_agrees_on_worker_ids_and_the_chief():
  job = _load()
  configs = {key: ClusterConfig.from_tf_config(tf_config)
             for key, tf_config in operator_tf_configs(job).items()}
  assert len(configs) == 7
  training = {k: c for k, c in configs.items() if not (c.is_ps or c.is_evaluator)}
  names = {c.worker_names for c in configs.values()}
  assert names == {("chief:0", "worker:0", "worker:1", "worker:2")}  # one view, everywhere
  assert sorted(c.worker_id for c in training.values()) == [0, 1, 2, 3]
  assert [c.task_name for c in configs.values() if c.is_chief] == ["chief:0"]
  assert configs[("chief", 0)].worker_id == 0 and configs[("worker", 2)].worker_id == 3
  assert all(c.num_ps == 2 for c in configs.values())
  assert sorted(c.task_name for c in configs.values() if c.is_ps) == ["ps:0", "ps:1"]
  evaluator = configs[("evaluator", 0)]
  assert evaluator.is_evaluator and evaluator.target == ""  # local: not in the cluster
  assert {c.cluster_spec().as_dict()["ps"][0] for c in configs.values()} == {
      "epochsync-example-ps-0.default.svc:2222"}


def test_every_replica_gets_the_same_valid_epochsync_settings():
  job = _load()
  specs = job["spec"]["tfReplicaSpecs"]
  envs = [_env(s) for s in specs.values()]
  assert all(env == envs[0] for env in envs)
  env = dict(envs[0])
  names = {epochsync_flags.env_var(h.name) for h in epochsync_flags.EPOCHSYNC_FLAGS}
  assert {k for k in env if k.startswith("EPOCHSYNC_")} <= names  # no misspelt variable
  tf_configs = operator_tf_configs(job)
  with flagsaver.flagsaver():
    was_parsed = flags.FLAGS.is_parsed()
    if was_parsed:
      flags.FLAGS.unparse_flags()
    settings = epochsync_flags.settings_from_flags(env=env)
    for (rtype, i), tf_config in tf_configs.items():  # EPOCHSYNC_NUM_WORKERS matches TF_CONFIG
      config = epochsync_flags.cluster_from_flags(env=dict(env, TF_CONFIG=tf_config))
      assert config.task_name == f"{rtype}:{i}"
  if was_parsed:
    flags.FLAGS(["prog"])
  assert settings.num_epochs == 3 and settings.sync
  assert settings.startup_timeout_secs == 900 and settings.warn_after_secs == 120


def test_every_replica_runs_the_example_on_the_shared_model_dir():
  job = _load()
  specs = job["spec"]["tfReplicaSpecs"]
  for rtype, spec in specs.items():
    container = _container(spec)
    command = container["command"]
    assert command[:3] == ["python", "-m", "examples.train"], rtype
    model_dir = next(a.split("=", 1)[1] for a in command if a.startswith("--model_dir="))
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["template"]["spec"]["volumes"]}
    mount = next(p for p in mounts if model_dir.startswith(p.rstrip("/") + "/"))
    assert "persistentVolumeClaim" in volumes[mounts[mount]], rtype
    shards = next(a.split("=", 1)[1] for a in command if a.startswith("--shard_batches="))
    assert len(shards.split(",")) == 4  # one shard per training task


# --- examples/k8s/networkpolicy.yaml: the training port admits the job's own pods only ------

POLICY = os.path.join(os.path.dirname(MANIFEST), "networkpolicy.yaml")


def _policy(path=POLICY):
  with open(path) as f:
    return yaml.safe_load(f)


def operator_pod_labels(job, rtype, index):
  """The labels Kubeflow's training operator (v1) puts on the pod of replica `rtype` `index`."""
  return {"training.kubeflow.org/job-name": job["metadata"]["name"],
          "training.kubeflow.org/operator-name": "tfjob-controller",
          "training.kubeflow.org/replica-type": rtype.lower(),
          "training.kubeflow.org/replica-index": str(index)}


def _selects(selector, labels):
  """A label selector with matchLabels only (anything else is refused, so the check is exact)."""
  assert set(selector) <= {"matchLabels"}, selector
  return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def admits(policy, dest_labels, dest_namespace, src_labels, src_namespace, port, protocol="TCP"):
  """Whether `policy` lets a pod (src) open a connection to pod (dest) on `port`.

  NetworkPolicy's ingress semantics for the rule shapes used here: a pod the policy selects
  admits only what one of its ingress rules lists; a podSelector peer without a
  namespaceSelector means the policy's own namespace.
  """
  meta, spec = policy["metadata"], policy["spec"]
  if dest_namespace != meta.get("namespace", "default") or not _selects(spec["podSelector"],
                                                                         dest_labels):
    return True  # not selected: this policy does not restrict it
  for rule in spec.get("ingress", []):
    peers_ok = any(set(peer) == {"podSelector"} and src_namespace == dest_namespace and
                   _selects(peer["podSelector"], src_labels) for peer in rule.get("from", []))
    ports_ok = any(p.get("protocol", "TCP") == protocol and p["port"] == port
                   for p in rule.get("ports", []))
    if peers_ok and ports_ok:
      return True
  return False


def test_the_network_policy_selects_every_pod_of_the_job():
  job, policy = _load(), _policy()
  assert (policy["apiVersion"], policy["kind"]) == ("networking.k8s.io/v1", "NetworkPolicy")
  assert policy["metadata"]["namespace"] == job["metadata"]["namespace"]
  assert policy["spec"]["policyTypes"] == ["Ingress"]
  pods = [operator_pod_labels(job, rtype, i)
          for rtype, spec in job["spec"]["tfReplicaSpecs"].items()
          for i in range(spec.get("replicas", 1))]
  assert len(pods) == 7
  assert all(_selects(policy["spec"]["podSelector"], labels) for labels in pods)
  other_job = dict(pods[0], **{"training.kubeflow.org/job-name": "another-job"})
  assert not _selects(policy["spec"]["podSelector"], other_job)


def test_the_network_policy_admits_the_jobs_pods_on_the_training_port_and_nothing_else():
  job, policy = _load(), _policy()
  namespace = job["metadata"]["namespace"]
  ports = {_port(spec) for spec in job["spec"]["tfReplicaSpecs"].values()}
  assert ports == {2222}
  chief, ps = operator_pod_labels(job, "Chief", 0), operator_pod_labels(job, "PS", 0)
  evaluator = operator_pod_labels(job, "Evaluator", 0)
  other_job = dict(chief, **{"training.kubeflow.org/job-name": "another-job"})
  for src in (chief, ps, evaluator):  # every task reaches every task's training port
    for dest in (chief, ps, evaluator):
      assert admits(policy, dest, namespace, src, namespace, 2222)
  refused = [
      (other_job, namespace, 2222),  # a pod of another job
      ({"app": "debug-shell"}, namespace, 2222),  # any other pod of the namespace
      ({}, namespace, 2222),
      (chief, "other-namespace", 2222),  # the job's labels, copied in another namespace
      (chief, namespace, 6006),  # another port of a job pod (e.g. a forwarded TensorBoard)
      (chief, namespace, 22),
  ]
  for src, src_namespace, port in refused:
    assert not admits(policy, ps, namespace, src, src_namespace, port), (src, src_namespace, port)
  assert not admits(policy, ps, namespace, chief, namespace, 2222, protocol="UDP")
  rules = policy["spec"]["ingress"]  # no rule beyond the one: no ipBlock, no namespaceSelector
  assert len(rules) == 1 and [set(p) for p in rules[0]["from"]] == [{"podSelector"}]
  assert "egress" not in policy["spec"]


# --- docs/quickstart-k8s.md: the Estimator CTR job, its data, its policy, the restart policy ---

K8S = os.path.dirname(MANIFEST)
CTR_MANIFEST = os.path.join(K8S, "ctr-tfjob.yaml")
ELASTIC_MANIFEST = os.path.join(K8S, "elastic-tfjob.yaml")
CTR_DATA = os.path.join(K8S, "ctr-data.yaml")
DOCS = os.path.join(os.path.dirname(os.path.dirname(__file__)), "docs")


def _flag(command, name):
  return next(a.split("=", 1)[1] for a in command if a.startswith(f"--{name}="))


def _recommended_policies():
  """{doc: the restart policy it recommends}, from its "Recommendation: `restartPolicy: X`"."""
  found = {}
  for doc in ("quickstart-k8s.md", "deploy.md"):
    with open(os.path.join(DOCS, doc)) as f:
      found[doc] = re.findall(r"Recommendation: `restartPolicy: (\w+)`", f.read())
  return found


def test_the_documented_restart_policy_is_the_one_every_tested_manifest_uses():
  recommended = _recommended_policies()
  assert all(len(v) == 1 for v in recommended.values()), recommended  # one each, stated once
  policies = {p for v in recommended.values() for p in v}
  assert len(policies) == 1, recommended
  policy = policies.pop()
  for path in (MANIFEST, CTR_MANIFEST, ELASTIC_MANIFEST):
    job = _load(path)
    used = {s["restartPolicy"] for s in job["spec"]["tfReplicaSpecs"].values()}
    assert used == {policy}, (path, used, recommended)
    pods = sum(s.get("replicas", 1) for s in job["spec"]["tfReplicaSpecs"].values())
    # One fault restarts up to every pod once; the limit must let at least one through.
    assert job["spec"]["runPolicy"]["backoffLimit"] >= pods, path


def test_no_doc_tells_to_use_another_restart_policy():
  """Every "use `restartPolicy: X`" in docs/ names the recommended policy."""
  told = {}
  for doc in sorted(os.listdir(DOCS)):
    if doc.endswith(".md"):
      with open(os.path.join(DOCS, doc)) as f:
        told[doc] = re.findall(r"(?:[Uu]se|Recommendation:) `restartPolicy: (\w+)`", f.read())
  assert sum(len(v) for v in told.values()) >= 3, told
  assert {p for v in told.values() for p in v} == {"OnFailure"}, told


def test_the_ctr_job_is_a_chief_workers_two_ps_and_an_evaluator_that_agree():
  job = _load(CTR_MANIFEST)
  replicas = {t: s["replicas"] for t, s in job["spec"]["tfReplicaSpecs"].items()}
  assert replicas == {"Chief": 1, "Worker": 3, "PS": 2, "Evaluator": 1}
  configs = {key: ClusterConfig.from_tf_config(tf_config)
             for key, tf_config in operator_tf_configs(job).items()}
  assert {c.worker_names for c in configs.values()} == {
      ("chief:0", "worker:0", "worker:1", "worker:2")}
  envs = [_env(s) for s in job["spec"]["tfReplicaSpecs"].values()]
  assert all(env == envs[0] for env in envs)
  names = {epochsync_flags.env_var(h.name) for h in epochsync_flags.EPOCHSYNC_FLAGS}
  assert {k for k in envs[0] if k.startswith("EPOCHSYNC_")} <= names
  with flagsaver.flagsaver():
    was_parsed = flags.FLAGS.is_parsed()
    if was_parsed:
      flags.FLAGS.unparse_flags()
    settings = epochsync_flags.settings_from_flags(env=envs[0])
    for (rtype, i), tf_config in operator_tf_configs(job).items():
      config = epochsync_flags.cluster_from_flags(env=dict(envs[0], TF_CONFIG=tf_config))
      assert config.task_name == f"{rtype}:{i}"
  if was_parsed:
    flags.FLAGS(["prog"])
  assert settings.startup_timeout_secs == 900 and settings.save_checkpoint_secs == 600


def test_the_ctr_job_reads_the_data_the_data_job_writes_on_the_same_volume():
  job, data = _load(CTR_MANIFEST), _load(CTR_DATA)
  assert (data["apiVersion"], data["kind"]) == ("batch/v1", "Job")
  writer = data["spec"]["template"]["spec"]["containers"][0]
  assert writer["command"][:3] == ["python", "-m", "examples.ctr_data"]
  claims = {v["persistentVolumeClaim"]["claimName"]
            for v in data["spec"]["template"]["spec"]["volumes"]}
  training = {t: _container(s) for t, s in job["spec"]["tfReplicaSpecs"].items()}
  for rtype, container in training.items():
    command = container["command"]
    assert command[:3] == ["python", "-m", "examples.ctr_train"], rtype
    assert _flag(command, "data_dir") == _flag(writer["command"], "data_dir"), rtype
    spec = job["spec"]["tfReplicaSpecs"][rtype]["template"]["spec"]
    assert {v["persistentVolumeClaim"]["claimName"] for v in spec["volumes"]} == claims, rtype
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    for path in (_flag(command, "data_dir"), _flag(command, "model_dir")):
      assert any(path.startswith(m.rstrip("/") + "/") for m in mounts), (rtype, path)
  files = _flag(writer["command"], "train_files").split(",")
  assert len(files) % 4 == 0  # file i -> training task i % 4: every task gets whole files


_PARSE_CTR_FLAGS = """
import json, sys
from absl import flags
from examples import ctr_train
from hooks.config import flags as epochsync_flags
argv, env = json.loads(sys.argv[1]), json.loads(sys.argv[2])
flags.FLAGS(["examples.ctr_train"] + argv)  # an unknown or bad flag raises here
settings = epochsync_flags.settings_from_flags(flags.FLAGS, env=env)
print(json.dumps({"num_epochs": flags.FLAGS["num_epochs"].value,
                  "startup": settings.startup_timeout_secs,
                  "barrier": settings.barrier_timeout_secs}))
"""


def test_the_ctr_commands_are_valid_flags_of_the_example():
  """Each replica's command and environment parse as examples/ctr_train.py's flags (in a
  process of their own: examples.train, imported by other tests, defines --model_dir too)."""
  pytest.importorskip("tensorflow_estimator", reason="examples.ctr_train needs estimator_ext")
  job = _load(CTR_MANIFEST)
  spec = job["spec"]["tfReplicaSpecs"]["Worker"]
  command, env = _container(spec)["command"], _env(spec)
  done = subprocess.run([sys.executable, "-c", _PARSE_CTR_FLAGS, json.dumps(command[3:]),
                         json.dumps(env)], capture_output=True, text=True, timeout=120,
                        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  assert done.returncode == 0, done.stderr[-3000:]
  parsed = json.loads(done.stdout.strip().splitlines()[-1])
  assert parsed == {"num_epochs": 3, "startup": 900, "barrier": 1800}


def _k8s_documents():
  """{file name: its YAML document} of every manifest in examples/k8s."""
  found = {}
  for name in sorted(os.listdir(K8S)):
    if name.endswith(".yaml"):
      found[name] = _load(os.path.join(K8S, name))
  return found


def _tfjobs():
  return {name: doc for name, doc in _k8s_documents().items() if doc["kind"] == "TFJob"}


def test_every_tfjob_has_its_own_network_policy_and_its_apply_line_names_it():
  """Each TFJob's pods (also a Worker count raised 4 past the manifest's, an elastic job's
  growth) admit its own pods on its training port, and no pod of another job; the manifest's
  `kubectl apply` line applies that policy with it."""
  documents = _k8s_documents()
  policies = {n: d for n, d in documents.items() if d["kind"] == "NetworkPolicy"}
  jobs = _tfjobs()
  assert set(jobs) == {"tfjob.yaml", "ctr-tfjob.yaml", "elastic-tfjob.yaml"}  # found them all
  for name, job in jobs.items():
    namespace, specs = job["metadata"]["namespace"], job["spec"]["tfReplicaSpecs"]
    pods = [operator_pod_labels(job, rtype, i) for rtype, spec in specs.items()
            for i in range(spec.get("replicas", 1) + (4 if rtype == "Worker" else 0))]
    mine = [p for p, policy in policies.items()
            if all(_selects(policy["spec"]["podSelector"], labels) for labels in pods)]
    assert len(mine) == 1, (name, mine)
    policy, ports = policies[mine[0]], {_port(spec) for spec in specs.values()}
    assert len(ports) == 1, (name, ports)
    port = ports.pop()
    for src in pods:
      assert admits(policy, pods[0], namespace, src, namespace, port), (name, src)
    for other in {j["metadata"]["name"] for j in jobs.values()} - {job["metadata"]["name"]}:
      stranger = dict(pods[0], **{"training.kubeflow.org/job-name": other})
      assert not admits(policy, pods[0], namespace, stranger, namespace, port), (name, other)
    with open(os.path.join(K8S, name)) as f:
      applies = re.findall(r"kubectl apply((?: -f \S+)+)", f.read())
    assert f"-f examples/k8s/{mine[0]} -f examples/k8s/{name}" in applies[0], (name, applies)


def test_every_test_the_quick_start_names_exists():
  with open(os.path.join(DOCS, "quickstart-k8s.md")) as f:
    named = re.findall(r"`(tests/\w+\.py)::(\w+)`", f.read())
  assert len(named) >= 2, named
  root = os.path.dirname(DOCS)
  for path, test in named:
    with open(os.path.join(root, path)) as f:
      assert re.search(rf"^def {test}\(", f.read(), re.M), f"{path}::{test}"


def test_the_elastic_job_agrees_on_the_cluster_and_turns_elastic_synchronous_training_on():
  job = _load(ELASTIC_MANIFEST)
  specs = job["spec"]["tfReplicaSpecs"]
  assert {t: s["replicas"] for t, s in specs.items()} == {"Chief": 1, "Worker": 3, "PS": 2}
  configs = [ClusterConfig.from_tf_config(c) for c in operator_tf_configs(job).values()]
  assert {c.worker_names for c in configs} == {("chief:0", "worker:0", "worker:1", "worker:2")}
  envs = [_env(s) for s in specs.values()]
  assert all(env == envs[0] for env in envs)
  with flagsaver.flagsaver():
    was_parsed = flags.FLAGS.is_parsed()
    if was_parsed:
      flags.FLAGS.unparse_flags()
    settings = epochsync_flags.settings_from_flags(env=envs[0])
  if was_parsed:
    flags.FLAGS(["prog"])
  assert settings.elastic and settings.sync
  _check_growth(job, envs[0])
  commands = {tuple(_container(s)["command"]) for s in specs.values()}
  assert len(commands) == 1 and any(a.startswith("--unit_batches=") for a in commands.pop())


def _check_growth(job, env):
  """Worker's replicas raised from 3 to 7 on the running job: the pods created then get a
  TF_CONFIG of 8 training tasks and are beyond the launch; those of the launch are not, and
  every task counts 8 slots (EPOCHSYNC_NUM_WORKERS=4, EPOCHSYNC_MAX_WORKERS=8)."""
  grown = copy.deepcopy(job)
  grown["spec"]["tfReplicaSpecs"]["Worker"]["replicas"] = 7
  launch = operator_tf_configs(job)
  with flagsaver.flagsaver():
    was_parsed = flags.FLAGS.is_parsed()
    if was_parsed:
      flags.FLAGS.unparse_flags()
    for (rtype, i), tf_config in {**operator_tf_configs(grown), **launch}.items():
      config = epochsync_flags.cluster_from_flags(env=dict(env, TF_CONFIG=tf_config))
      assert config.num_workers == 8 and config.task_name == f"{rtype}:{i}"
      assert config.beyond_launch == ((rtype, i) not in launch), (rtype, i)
  if was_parsed:
    flags.FLAGS(["prog"])
