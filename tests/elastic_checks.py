"""Shared by the elastic cluster tests: waiting for a log line, a kill inside a unit, and the
steps of a synchronous elastic job as its workers recorded them (tests/tasks/epoch_task.py
--record_steps_dir), for the oracle (cluster_checks.steps_sgd)."""

import json
import os
import re
import signal
import time
from typing import Dict, List, Sequence, Tuple

import numpy as np


def wait_for(path: str, pattern: str, deadline: float, after: int = 0) -> int:
  """Waits until `pattern` is in the file at `path` after offset `after`; the offset of its
  end."""
  while time.monotonic() < deadline:
    text = open(path).read() if os.path.exists(path) else ""
    found = re.compile(pattern).search(text, after)
    if found:
      return found.end()
    time.sleep(0.05)
  raise AssertionError(f"{pattern!r} never appeared in {path}")


def logged_at(log: str, pattern: str, near: float, levels: str = "IW") -> float:
  """The time (epoch seconds) of the first line at one of `levels` (absl's I, W) matching
  `pattern` in `log`; the logs are in local time, HH:MM:SS.f, of the day of `near`."""
  found = re.search(rf"^[{levels}]\d{{4}} (\d\d):(\d\d):(\d\d\.\d+) .*" + pattern, log,
                    re.M)
  assert found, (pattern, log[-3000:])
  h, m, s = found.groups()
  day = time.localtime(near)
  return time.mktime(day[:3] + (int(h), int(m), 0) + day[6:]) + float(s)


def assert_rejoined(audit: List[dict], relaunched_log: str, name: str = "worker:1"
                    ) -> Tuple[int, bool]:
  """A relaunched `name` joined epoch N (its log says so): the chief arrived for it at every
  epoch before N; at N's gather it was found rejoined (it arrived itself), unless a synchronous
  guest's steps ended first (then at N + 1's); from then on it is a member. Returns (N, whether
  it arrived itself at N's end)."""
  joined = re.search(re.escape(name) + r" joined epoch (\d+) ", relaunched_log)
  assert joined, relaunched_log[-3000:]
  epoch = int(joined.group(1))
  arrived = "lost_workers" not in audit[epoch]
  back = epoch if arrived else epoch + 1
  for line in audit:
    lost, rejoined = line.get("lost_workers", []), line.get("rejoined_workers", [])
    expected = ([name], []) if line["epoch"] < back else (
        ([], [name]) if line["epoch"] == back else ([], []))
    assert (lost, rejoined) == expected, (epoch, back, line)
  return epoch, arrived


def kill_inside_a_unit(cluster, log_path: str, units: Sequence[int], deadline: float,
                       sig: int = signal.SIGKILL, victim: str = "worker:1",
                       inside_secs: float = 1.0, min_batches: int = 4) -> Tuple[int, float]:
  """Sends `victim` `sig` `inside_secs` into the first unit of `min_batches` or more batches it
  takes in epoch 0; the unit's index and the time of the signal."""
  _, unit, at = kill_inside_a_unit_of(cluster, log_path, units, deadline, (0,), sig, victim,
                                      inside_secs, min_batches)
  return unit, at


def kill_inside_a_unit_of(cluster, log_path: str, units: Sequence[int], deadline: float,
                          epochs: Sequence[int], sig: int = signal.SIGKILL,
                          victim: str = "worker:1", inside_secs: float = 1.0,
                          min_batches: int = 4) -> Tuple[int, int, float]:
  """kill_inside_a_unit in the first of `epochs` in which `victim` takes a unit of
  `min_batches` or more (a slow victim may take only small ones in an epoch): (the epoch, the
  unit's index, the time of the signal)."""
  took = re.compile(re.escape(victim) + r" took unit (\d+) .* in epoch (\d+)")
  while time.monotonic() < deadline:
    text = open(log_path).read() if os.path.exists(log_path) else ""
    big = [(int(e), int(u)) for u, e in took.findall(text)
           if int(e) in epochs and units[int(u)] >= min_batches]
    if big:
      time.sleep(inside_secs)
      cluster.kill_task(victim, sig)
      return big[0][0], big[0][1], time.time()
    time.sleep(0.02)
  raise AssertionError(f"{victim} never took a unit of {min_batches} or more batches in epochs "
                       f"{list(epochs)}")


def _stream(line: dict, name: str) -> List[Tuple[int, int]]:
  """(unit, batch) of every batch `name` put in the model in the epoch, in its order: (an epoch
  resumed from a mid-epoch checkpoint) what its earlier attempt put in the model, whole units
  and the parts of the units resumed, in the order it took them; then its units in the order it
  took them; then (lost) the part of its last unit another worker resumed."""
  before = sorted([(u["first_batch"] + u.get("resumed_after", 0), u["index"],
                    u.get("resumed_after", 0), u["batches"]) for u in line["units"]
                   if u["worker"] == name and u.get("before_resume")] +
                  [(p["first_batch"], p["index"], p["from"], p["to"])
                   for p in line.get("unit_parts", ()) if p["worker"] == name])
  stream = [(unit, k) for _, unit, start, end in before for k in range(start, end)]
  # A unit's first_batch is its worker's count at the claim less the batches it skipped.
  mine = sorted((u for u in line["units"] if u["worker"] == name and not u.get("before_resume")),
                key=lambda u: u["first_batch"] + u.get("resumed_after", 0))
  stream += [(u["index"], k) for u in mine for k in range(u.get("resumed_after", 0), u["batches"])]
  for u in line["units"]:  # The parts taken back end where the unit's finisher resumed it.
    first = u.get("resumed_after", 0) - sum(p["batches"] for p in u.get("taken_back", ()))
    for part in u.get("taken_back", ()):
      if part["worker"] == name:
        stream += [(u["index"], k) for k in range(first, first + part["batches"])]
      first += part["batches"]
  return stream


def recorded_steps(records_dir: str, line: dict) -> Dict[int, List[Tuple[int, int]]]:
  """{step: [(unit, batch) of each worker's batch in it]} of an audit line, from the workers'
  records (one line per step, written before it ran, with the writing process). A process that
  died or was fenced may have written one line of a step its batch never reached (its run in
  flight): a lost worker's last lines past the batches the audit says the model holds of it
  are dropped, and so is the last line of each earlier process of a worker relaunched in the
  epoch when the worker has that many lines too many."""
  steps: Dict[int, List[Tuple[int, int]]] = {}
  for name in line["workers"]:
    path = os.path.join(records_dir, f"steps-worker-{name.split(':')[1]}.jsonl")
    every = [json.loads(r) for r in open(path)] if os.path.exists(path) else []
    # A process's last line, followed by another process's: that process died or was fenced.
    last = {i for i in range(len(every) - 1) if every[i].get("pid") != every[i + 1].get("pid")}
    kept = [i for i, r in enumerate(every) if r["epoch"] == line["epoch"]]
    stream = _stream(line, name)
    lost = line["workers"][name].get("lost")
    in_flight = [i for i in kept if i in last]
    if 0 < len(kept) - len(stream) == len(in_flight):  # each ended process's run in flight
      kept = [i for i in kept if i not in in_flight]
    mine = [every[i]["step"] for i in kept]
    assert len(mine) == len(stream) or (lost and len(mine) > len(stream)), (name, mine, stream)
    for step, batch in zip(mine, stream):
      steps.setdefault(step, []).append(batch)
  return steps


def records_across_a_relaunch(first_dir: str, again_dir: str, out_dir: str) -> str:
  """The step records of a job killed whole and relaunched from a mid-epoch checkpoint, as one
  run's: each worker's records of the first run before the relaunch's first step (the
  checkpoint's global step; later ones were lost with the kill), then the relaunch's. Written
  to `out_dir`, which is returned."""
  def rows(directory):
    return {name: [json.loads(r) for r in open(os.path.join(directory, name))]
            for name in os.listdir(directory) if name.startswith("steps-worker-")}
  first, again = rows(first_dir), rows(again_dir)
  resumed_at = min(r["step"] for kept in again.values() for r in kept)
  os.makedirs(out_dir, exist_ok=True)
  for name in set(first) | set(again):
    kept = [r for r in first.get(name, ()) if r["step"] < resumed_at] + again.get(name, [])
    with open(os.path.join(out_dir, name), "w") as f:
      f.writelines(json.dumps(r) + "\n" for r in kept)
  return out_dir


def assert_equals_the_oracle(records_dir: str, audit: list, units: Sequence[int], batch: int,
                             features: int = 16, learning_rate: float = 0.05,
                             model: str = "linear") -> None:
  """Each epoch has every batch in exactly one step, its steps follow on, and the model equals
  the oracle of the recorded steps (examples.train's `model`, plain SGD) to 1e-5."""
  from examples import train  # pylint: disable=g-import-not-at-top
  from hooks.testing import oracle  # pylint: disable=g-import-not-at-top
  from cluster_checks import checkpoint_value, steps_sgd  # pylint: disable=g-import-not-at-top
  inputs, labels = train.unit_arrays(model, list(units), batch, features)
  starts = np.cumsum([0] + list(units[:-1])) * batch
  rows = lambda unit, k: slice(starts[unit] + k * batch, starts[unit] + (k + 1) * batch)
  if model == "embedding":
    params = {"emb": np.zeros((features, train.EMBEDDING_DIM)), "b": np.zeros(())}
    gradients = oracle.embedding_mse_gradients
  else:
    params, gradients = {"w": np.zeros(features), "b": np.zeros(())}, oracle.linear_mse_gradients
  total = 0
  for line in audit:
    steps = recorded_steps(records_dir, line)
    assert sorted(b for s in steps.values() for b in s) == sorted(
        (u, k) for u in range(len(units)) for k in range(units[u])), "a batch twice or never"
    assert sorted(steps) == list(range(total, total + len(steps))), "a step without a batch"
    params = steps_sgd(params, [[(inputs[rows(*b)], labels[rows(*b)]) for b in steps[s]]
                                for s in sorted(steps)], gradients, learning_rate)
    total += len(steps)
  checkpoint = audit[-1]["checkpoint"]
  assert checkpoint_value(checkpoint, "global_step") == total
  for name, value in params.items():
    np.testing.assert_allclose(checkpoint_value(checkpoint, name), value, atol=1e-5)
