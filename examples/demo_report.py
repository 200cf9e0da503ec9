"""What `./es demo` prints: the tasks' progress lines while it trains, and the final table.

No flags here (examples.local_cluster and examples.train define theirs), so tests can import
it beside either.

Typical usage:
  cluster = LocalCluster(..., on_line=progress_printer())
  for row in epoch_table(read_audit(model_dir)): print(row)
"""

import sys
import threading
from typing import Dict, List, Sequence

__all__ = ["epoch_table", "progress_printer", "unit_table"]


def progress_printer(out=sys.stdout):
  """An on_line callback that echoes the progress lines of the tasks' absl logs."""
  lock = threading.Lock()

  def on_line(task: str, line: str) -> None:
    message = line.split("] ", 1)[1].rstrip() if "] " in line else ""
    own = (message.startswith("progress ") or " took unit " in message  # names its task
           or " is lost in epoch " in message)
    if own or (message.startswith("epoch ") and " done on all " in message):
      with lock:
        print(f"  {message if own else task + ': ' + message}", file=out, flush=True)

  return on_line

def epoch_table(audit: Sequence[dict]) -> List[str]:
  """Lines of a table epoch x worker: examples, seconds of the worker's epoch, barrier wait.

  An epoch resumed from a mid-epoch checkpoint is marked `*` and explained below the table:
  its examples count every attempt, its seconds and wait those of the attempt that finished it.
  """
  workers: List[str] = sorted({w for line in audit for w in line["workers"]})
  width = 24
  head = "epoch | " + " | ".join(f"{w:<{width}}" for w in workers) + " | global_step"
  sub = "      | " + " | ".join(f"{'examples   secs   wait':<{width}}" for _ in workers) + " |"
  rows, notes = [head, sub], []
  for line in audit:
    cells = []
    for w in workers:
      s: Dict[str, float] = line["workers"][w]
      if s.get("lost"):  # elastic: the chief arrived for it
        cells.append(f"{'lost':>8} ({s['batches']} batches)".ljust(width))
        continue
      if s.get("spare"):  # elastic: a spare standing by, arrived for by the chief
        cells.append(f"{'spare':>8} (idle)".ljust(width))
        continue
      cells.append(f"{s['examples']:>8} {s['arrived_at'] - s['started_at']:6.2f} "
                   f"{s['barrier_wait_secs']:6.2f}".ljust(width))
    attempts = line.get("attempts", [])
    mark = "*" if len(attempts) > 1 else ""
    if mark:
      steps = ", ".join(str(r["global_step"]) for r in line.get("resumed_from", ()))
      notes.append(f"* epoch {line['epoch']} took attempts {attempts[0]}-{attempts[-1]} "
                   f"(resumed at global_step {steps}): examples count every attempt, secs "
                   f"and wait are attempt {attempts[-1]}'s")
    rows.append(f"{str(line['epoch']) + mark:>5} | " + " | ".join(cells) +
                f" | {line['global_step']}")
  return rows + notes


def unit_table(audit: Sequence[dict]) -> List[str]:
  """Lines per epoch and worker of a work-queue job: its units in the order it took them."""
  rows = []
  for line in audit:
    by_worker: Dict[str, List[dict]] = {}
    for unit in line.get("units", ()):
      by_worker.setdefault(unit["worker"], []).append(unit)
    for worker, units in sorted(by_worker.items()):
      units = sorted(units, key=lambda u: u["first_batch"])
      rows.append(f"epoch {line['epoch']} {worker:<10} " + ", ".join(
          f"{_short(u['unit'])} ({u['batches']}{_taken_back(u)})" for u in units) +
                  f"  = {sum(u['batches'] for u in units)} batches")
  return rows


def _taken_back(unit: dict) -> str:
  """', the first 3 from lost worker:1' for a unit taken back from a lost worker (elastic);
  ', the first 3 from lost worker:1, then 2 from lost worker:2' for two."""
  parts = [f"{p['batches']} from lost {p['worker']}" for p in unit.get("taken_back", ())]
  return ", the first " + ", then ".join(parts) if parts else ""


def _short(unit: str) -> str:
  """A unit's name without its directory (`part-00003.tfrecord[0:]`)."""
  return unit.rsplit("/", 1)[-1]
