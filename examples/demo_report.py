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

__all__ = ["epoch_table", "progress_printer"]


def progress_printer(out=sys.stdout):
  """An on_line callback that echoes the progress lines of the tasks' absl logs."""
  lock = threading.Lock()

  def on_line(task: str, line: str) -> None:
    message = line.split("] ", 1)[1].rstrip() if "] " in line else ""
    if message.startswith("progress ") or (message.startswith("epoch ") and
                                           " done on all " in message):
      with lock:
        print(f"  {message if message.startswith('progress ') else task + ': ' + message}",
              file=out, flush=True)

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
