"""The chief's per-epoch audit: one JSON line per finished epoch in the model directory.

Each line says what every worker trained in that epoch (batches, examples), when it
started and arrived at the barrier, how long it waited there, the global step, the
checkpoint the chief saved, and which attempt (1, then 2 after a restart, ...) trained it. It
is the proof that every shard was trained exactly once. An epoch resumed from a mid-epoch
checkpoint counts what the model holds from every attempt (`attempts`; `resumed_from` gives
the step each attempt resumed from and what each worker skipped): its batches and examples
equal the shard's; a worker's `started_at`, `arrived_at` and `barrier_wait_secs` are those of
the attempt that finished the epoch (the worker's `attempt`).

Typical usage:
  for line in hooks.epoch.audit.read_audit(model_dir):
    print(line["epoch"], {w: s["batches"] for w, s in line["workers"].items()})
"""

import json
import os
from typing import Dict, List, Mapping, Optional

from hooks import log as logging


__all__ = ["EpochAudit", "read_audit", "AUDIT_FILENAME"]

AUDIT_FILENAME = "epochsync_epochs.jsonl"


class EpochAudit:
  """Appends one line per epoch to `<directory>/epochsync_epochs.jsonl` and logs a summary.

    audit = EpochAudit(model_dir)
    audit.write(epoch=0, arrivals={"worker:0": stats}, released_at=time.time(),
                fields={"checkpoint": path}, global_step=9)

  Args:
    directory: `str`, the model directory (created if missing).
  """

  def __init__(self, directory: str):
    self.path = os.path.join(directory, AUDIT_FILENAME)
    self._directory = directory
    # Which start of the job on this model_dir wrote a line: 1, then 2 after a restart, ...
    self.attempt = 1 + max((int(line.get("attempt", 1)) for line in read_audit(directory)),
                           default=0)

  def write(self, epoch: int, arrivals: Mapping[str, object], released_at: float,
            fields: Mapping[str, object], global_step: Optional[int]) -> Dict[str, object]:
    """Appends the line for `epoch`; `arrivals` maps task name -> EpochStats."""
    fields = dict(fields)
    # (a work queue's resumed epoch) every attempt's counts, also of workers this one lacks
    across = fields.pop("trained_across_attempts", {})
    workers = {
        name: {"batches": s.batches, "examples": s.examples, "started_at": s.started_at,
               "arrived_at": s.ended_at, "barrier_wait_secs": round(released_at - s.ended_at, 4)}
        for name, s in sorted(arrivals.items())}
    record = {"epoch": epoch, "global_step": global_step, "released_at": released_at,
              "attempt": self.attempt, "workers": workers, **fields}
    for stats in workers.values():  # Whose times these are (the whole epoch's counts).
      stats["attempt"] = record["attempt"]
    for name, counts in sorted(across.items()):
      workers.setdefault(name, {"started_at": None, "arrived_at": None,
                                "barrier_wait_secs": None, "attempt": None}).update(counts)
    record["workers"] = dict(sorted(workers.items()))
    lost = set(fields.get("lost_workers", ()))  # Elastic: the chief arrived for them,
    spares = set(fields.get("spare_workers", ()))  # and for the spares standing by,
    optional = set(fields.get("optional_workers", ()))  # or the optional ones not joined yet.
    for name in (lost | spares | optional) & set(workers):
      workers[name].update(examples=None, started_at=None, arrived_at=None,
                           barrier_wait_secs=None, **{"spare" if name in spares else
                                                      "optional" if name in optional else
                                                      "lost": True})
    os.makedirs(self._directory, exist_ok=True)
    with open(self.path, "a") as f:
      f.write(json.dumps(record, sort_keys=True) + "\n")
    slowest = max((w for w in workers if w not in lost | spares | optional and
                   workers[w]["arrived_at"] is not None),
                  key=lambda w: workers[w]["arrived_at"])
    attempts = record.get("attempts", [record["attempt"]])
    resumed = "" if len(attempts) < 2 else (
        f" over attempts {attempts[0]}-{attempts[-1]} (resumed at global_step " +
        ", ".join(str(r["global_step"]) for r in record.get("resumed_from", ())) + ")")
    logging.info(
        "epoch %d done on all %d workers%s%s: %s; global_step %s; checkpoint %s; last to "
        "arrive %s", epoch, len(workers),
        "".join(f" ({len(names)} {what})" for names, what in (
            (lost, "lost"), (spares, "spare"), (optional, "optional, not joined yet")) if names),
        resumed,
        ", ".join(f"{w} lost ({s['batches']} batches in the model)" if w in lost else
                  f"{w} a spare standing by" if w in spares else
                  f"{w} optional, not joined yet" if w in optional else
                  f"{w} {s['batches']} batches/{s['examples']} examples"
                  for w, s in workers.items()),
        global_step, fields.get("checkpoint"), slowest)
    return record


def read_audit(directory: str) -> List[Dict[str, object]]:
  """The audit lines of `directory`, oldest first ([] if there is no audit yet)."""
  path = os.path.join(directory, AUDIT_FILENAME)
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]
