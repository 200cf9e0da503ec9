"""Draws docs/architecture.png: hooks/'s layers, their modules and the allowed imports.

  ./es bench --only=none >/dev/null; .venv/bin/python docs/architecture_png.py

The layers and modules are read from tests/test_layers.py's LAYERS and from hooks/ itself, so
the picture shows the tree as it is.
"""

import os
import sys
import textwrap

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top,wrong-import-position

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
from test_layers import LAYERS, _modules  # pylint: disable=g-import-not-at-top,wrong-import-position

OWNS = {
    "session": "creators, wiring (epoch_sync_hooks), the drop-in",
    "sync": "optimizer, tokens, aggregation",
    "checkpoint": "epoch, mid-epoch saves; resume",
    "elastic": "lost workers, rejoin",
    "epoch": "run start, barrier, audit, progress",
    "workqueue": "units, the queue on ps:0, claims, unit audit",
    "data": "EpochInput, look-ahead, determinism",
    "faults": "liveness, bounded waits, recovery guard, stuck steps",
    "config": "cluster, settings, flags, preflight",
    "bottom": "errors, log, graph_keys",
}


def main():
  modules = _modules()
  rows = {}
  for name, rank in LAYERS.items():
    key = "bottom" if rank == 0 else name
    rows.setdefault(rank, [])
    if key not in rows[rank]:
      rows[rank].append(key)
  fig, ax = plt.subplots(figsize=(11, 8.5))
  ax.set_xlim(0, 10)
  ax.set_ylim(-0.6, max(rows) + 0.8)
  ax.axis("off")
  centers = {}
  for rank, names in rows.items():
    width = 8.6 / len(names)
    for i, name in enumerate(names):
      x = 0.7 + i * width
      inner = sorted(m.split(".")[-1] for m in modules
                     if m.count(".") == 2 and m.split(".")[1] == name)
      label = "hooks/" + ("{errors,log,graph_keys}.py" if name == "bottom" else name + "/")
      ax.add_patch(plt.Rectangle((x, rank - 0.38), width - 0.3, 0.76, fc="#e8eef7",
                                 ec="#35508a", lw=1.2))
      ax.text(x + 0.1, rank + 0.24, f"{label}  (layer {rank})", fontsize=10, weight="bold",
              va="center")
      ax.text(x + 0.1, rank + 0.07, OWNS[name], fontsize=8.5, va="center", style="italic")
      lines = textwrap.wrap(", ".join(inner), int((width - 0.3) * 16))  # what fits the box
      ax.text(x + 0.1, rank - 0.04, "\n".join(lines), fontsize=5.5 if len(lines) > 3 else 6.5,
              va="top")
      centers[name] = (x + (width - 0.3) / 2, rank)
  for rank in sorted(rows)[1:]:
    ax.annotate("", xy=(0.35, rank - 0.7), xytext=(0.35, rank - 0.3),
                arrowprops=dict(arrowstyle="->", color="#35508a", lw=1.5))
  ax.text(0.05, max(rows) + 0.55, "Each layer imports only the layers below it (arrows); "
          "sync, checkpoint and elastic (and epoch and workqueue) are siblings: neither imports the other.\n"
          "estimator_ext sits on top of hooks.session; hooks.testing stands apart. "
          "tests/test_layers.py enforces this.", fontsize=9)
  out = os.path.join(ROOT, "docs", "architecture.png")
  fig.savefig(out, dpi=110, bbox_inches="tight")
  print(out)


if __name__ == "__main__":
  main()
