"""The checks of a cluster description: every problem of a cluster, a task or a worker id.

hooks.config.cluster's ClusterConfig runs them when it is built (from TF_CONFIG, the classic
flags or arguments); each message names the key or flag to fix (`WHERE`).

Typical usage:
  problems, jobs = cluster_problems({"ps": ["h:1"], "worker": ["h:2"]}, WHERE["arguments"])
  problems += task_problems(jobs, "worker", 0, WHERE["arguments"])
"""

from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

__all__ = ["cluster_problems", "task_problems", "worker_problems", "growth_problems",
           "is_address", "WHERE", "JOBS"]

CHIEF, WORKER, PS, EVALUATOR, MASTER = "chief", "worker", "ps", "evaluator", "master"
JOBS = (CHIEF, WORKER, PS, EVALUATOR)  # Canonical order; a "master" job becomes "chief".
# Where a value came from, so that each message points at the exact key or flag to fix.
WHERE = {
    "TF_CONFIG": dict(cluster='TF_CONFIG["cluster"]', job='TF_CONFIG["cluster"]["{}"]',
                      type='TF_CONFIG["task"]["type"]', index='TF_CONFIG["task"]["index"]'),
    "flags": dict(cluster="the --*_hosts flags", job="--{}_hosts", type="--job_name",
                  index="--task_index"),
    "arguments": dict(cluster="cluster", job='cluster["{}"]', type="task_type",
                      index="task_index"),
}


def is_address(addr: Any) -> bool:
  host, sep, port = addr.rpartition(":") if isinstance(addr, str) else ("", "", "")
  return bool(sep and host and host.strip() == host and port.isdigit() and 0 < int(port) < 65536)


def cluster_problems(cluster: Any, w: Mapping[str, str]
                     ) -> Tuple[List[str], Optional[Dict[str, Tuple[str, ...]]]]:
  """The problems of a job -> addresses mapping, and its well-formed jobs (None: not a mapping)."""
  job, out, jobs = w["job"].format, [], {}
  if not isinstance(cluster, Mapping):
    return [f'{w["cluster"]}={cluster!r} is not a mapping; write {{"ps": ["host:port"], ...}}'
            ], None
  for name, addrs in cluster.items():
    if name not in JOBS + (MASTER,):
      out.append(f"{w['cluster']} has unknown job {name!r}; use only {', '.join(JOBS)}")
    elif isinstance(addrs, str) or not isinstance(addrs, (list, tuple)):
      out.append(f'{job(name)}={addrs!r} is not a list; write ["host:port", ...]')
    else:
      jobs[name] = tuple(addrs)
  if CHIEF in jobs and MASTER in jobs:
    out.append(f'{w["cluster"]} has both a "chief" and a "master" job; keep only "chief"')
  seen = {}
  for name, addrs in jobs.items():
    for i, addr in enumerate(addrs):
      if not is_address(addr):
        out.append(f"{job(name)}[{i}]={addr!r} is not host:port with an integer port; "
                   'write it like "localhost:2222"')
      elif addr in seen:
        out.append(f"address {addr!r} is used by both {seen[addr]} and {name}:{i} in "
                   f"{w['cluster']}; give every task its own host:port")
      else:
        seen[addr] = f"{name}:{i}"
    if name in (CHIEF, MASTER, EVALUATOR) and len(addrs) > 1:
      rest = "" if name == EVALUATOR else ' and list the others under "worker"'
      out.append(f"{job(name)} has {len(addrs)} addresses {list(addrs)}; at most one {name} "
                 f"is supported: keep one{rest}")
  not_lists = set(cluster) - set(jobs)  # Already reported above.
  if not jobs.get(PS) and PS not in not_lists:
    out.append(f"no ps task: {job(PS)} is missing or empty; tf-epochsync is for parameter-"
               'server training: add a ps job with at least one "host:port"')
  if not any(jobs.get(j) for j in (CHIEF, MASTER, WORKER)) and not not_lists & {WORKER}:
    out.append(f"no training task: {job(CHIEF)} and {job(WORKER)} are missing or empty; "
               "add at least one worker (or a chief)")
  return out, jobs


def task_problems(jobs: Optional[Mapping[str, Tuple[str, ...]]], task_type: Any,
                   task_index: Any, w: Mapping[str, str]) -> List[str]:
  """The problems of (task_type, task_index); jobs=None skips the range check."""
  canon = CHIEF if task_type == MASTER else task_type
  if task_type is None:
    return [f"{w['type']} is not set; set it to one of {', '.join(JOBS)}"]
  if canon not in JOBS:
    return [f"{w['type']}={task_type!r} is not a known task type; use one of "
            f"{', '.join(JOBS)} (or master)"]
  if task_index is None:
    return [f"{w['index']} is not set; set it to this task's index in its job (0 for the first)"]
  if not isinstance(task_index, int) or isinstance(task_index, bool):
    return [f"{w['index']}={task_index!r} is not an integer; set it to the task's index in its job"]
  if task_index < 0:
    return [f"{w['index']}={task_index} is negative; task indices start at 0"]
  if jobs is None:
    return []
  n = len(jobs.get(canon) or (jobs.get(MASTER, ()) if canon == CHIEF else ()))
  if canon == EVALUATOR and n == 0 and task_index == 0:
    return []  # Kubeflow and Estimator leave the evaluator out of its own cluster: allowed.
  if task_index >= n:
    return [f"{w['index']}={task_index} is out of range: job {canon!r} has {n} task(s) in "
            f"{w['cluster']}; use an index below {n} or add addresses to {w['job'].format(canon)}"]
  return []


def worker_problems(num_workers: Any, worker_id: Any,
                    worker_names: Optional[Sequence[str]] = None) -> List[str]:
  """What is wrong with the (num_workers, worker_id, worker_names) a hook was given, if anything.

  Every hook and the sync optimizer validate these three the same way, with the same words:

      problems = worker_problems(3, config.worker_id, config.worker_names)  # [] when valid
  """
  if not isinstance(num_workers, int) or isinstance(num_workers, bool) or num_workers < 1:
    return [f"num_workers={num_workers!r} must be an integer >= 1 (pass ClusterConfig.num_workers)"]
  problems = []
  if not isinstance(worker_id, int) or isinstance(worker_id, bool) or not (
      0 <= worker_id < num_workers):
    problems.append(f"worker_id={worker_id!r} is out of range: it must be in [0, {num_workers}) "
                    "(pass ClusterConfig.worker_id)")
  if worker_names is not None and len(worker_names) != num_workers:
    problems.append(f"worker_names has {len(worker_names)} names but num_workers={num_workers} "
                    "(pass ClusterConfig.worker_names)")
  return problems


def growth_problems(launch_workers: Any, max_workers: Any, listed: int,
                    w: Mapping[str, str]) -> List[str]:
  """What is wrong with a job that may grow: `launch_workers` chief and worker tasks at its
  launch, at most `max_workers`, `listed` in this task's cluster (0, 0: a job that does not)."""
  ints = [f"{name}={value!r} must be an integer >= 0" for name, value in (
      ("launch_workers", launch_workers), ("max_workers", max_workers))
          if not isinstance(value, int) or isinstance(value, bool) or value < 0]
  if ints or not (launch_workers or max_workers):
    return ints
  if not launch_workers or not max_workers:
    return [f"max_workers={max_workers} needs num_workers, the chief and worker tasks the job "
            "is launched with (the ps tasks know only those); set --epochsync_num_workers "
            "(EPOCHSYNC_NUM_WORKERS) with --epochsync_max_workers (EPOCHSYNC_MAX_WORKERS), the "
            "same on every task"]
  if max_workers < launch_workers:
    return [f"max_workers={max_workers} is below num_workers={launch_workers}, the chief and "
            "worker tasks the job is launched with; set --epochsync_max_workers to the most the "
            "job may grow to, at least --epochsync_num_workers"]
  if not launch_workers <= listed <= max_workers:
    return [f"{w['cluster']} lists {listed} chief and worker tasks: a job launched with "
            f"num_workers={launch_workers} that grows to at most max_workers={max_workers} "
            f"lists from {launch_workers} to {max_workers}; fix {w['cluster']}, or raise "
            "--epochsync_max_workers on every task at the job's next launch"]
  return []
