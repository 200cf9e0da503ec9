"""hooks/ is layered by concern: no import goes up a layer or across to a sibling, no cycle.

The layers, bottom first (docs/architecture.md draws them):
  0 hooks.errors, hooks.log, hooks.graph_keys
  1 hooks.config   2 hooks.faults   3 hooks.data   4 hooks.epoch, hooks.workqueue (siblings)
  5 hooks.sync, hooks.checkpoint (siblings: neither imports the other)
  6 hooks.session
hooks.testing stands apart (the local cluster launcher, the numpy oracle): nothing in the
layers imports it. Every import counts, also one inside a function.
"""

import ast
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HOOKS = os.path.join(ROOT, "hooks")
LAYERS = {"errors": 0, "log": 0, "graph_keys": 0, "config": 1, "faults": 2, "data": 3,
          "epoch": 4, "workqueue": 4, "sync": 5, "checkpoint": 5, "elastic": 5, "session": 6}


def _modules():
  """{"hooks.epoch.barrier": path, ...} for every module of the layers (not hooks.testing)."""
  found = {}
  for directory, _, files in os.walk(HOOKS):
    rel = os.path.relpath(directory, ROOT).replace(os.sep, ".")
    if rel.startswith("hooks.testing") or "__pycache__" in rel:
      continue
    for name in files:
      if name.endswith(".py"):
        module = rel if name == "__init__.py" else f"{rel}.{name[:-3]}"
        found[module] = os.path.join(directory, name)
  return found


def _imports(path, module):
  """The hooks.* modules `module` imports (absolute names; `from hooks.x import y` counts x.y
  when y is a module, else x)."""
  tree = ast.parse(open(path).read(), path)
  names = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      names.update(a.name for a in node.names if a.name.startswith("hooks"))
    elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("hooks"):
      for alias in node.names:
        names.add(f"{node.module}.{alias.name}")
        names.add(node.module)
  modules = _modules()
  return {n for n in names if n in modules and n != module}


def _layer(module):
  parts = module.split(".")
  return None if len(parts) < 2 else parts[1]


def test_every_module_belongs_to_a_layer():
  strays = [m for m in _modules() if m != "hooks" and _layer(m) not in LAYERS]
  assert not strays, f"put these in a layer's subpackage (or add the layer here): {strays}"


def test_no_import_goes_up_a_layer_or_across_to_a_sibling():
  modules, wrong = _modules(), []
  for module, path in modules.items():
    if module == "hooks":  # the package's lazy exports of the public names
      continue
    own = _layer(module)
    for target in _imports(path, module):
      there = _layer(target)
      if there is None or there == own:
        continue
      if LAYERS[there] >= LAYERS[own]:
        wrong.append(f"{module} (layer {LAYERS[own]}) imports {target} (layer {LAYERS[there]})")
  assert not wrong, "\n".join(wrong)


def test_no_import_cycle():
  modules = _modules()
  graph = {m: {t for t in _imports(p, m) if not modules[t].endswith("__init__.py")}
           for m, p in modules.items() if m != "hooks"}
  state, cycles = {}, []

  def visit(node, trail):
    state[node] = "open"
    for nxt in sorted(graph.get(node, ())):
      if state.get(nxt) == "open":
        cycles.append(" -> ".join(trail[trail.index(nxt):] + [nxt]))
      elif nxt not in state:
        visit(nxt, trail + [nxt])
    state[node] = "done"

  for start in sorted(graph):
    if start not in state:
      visit(start, [start])
  assert not cycles, "\n".join(cycles)


# --- the documented import paths keep working -------------------------------------------------

# Module paths README.md, docs/ and examples/ showed before hooks/ was laid out by concern.
BEFORE_THE_LAYOUT = [
    "hooks.audit.read_audit", "hooks.audit.AUDIT_FILENAME", "hooks.cluster.ClusterConfig",
    "hooks.cluster.resolve", "hooks.determinism", "hooks.epoch_input.EpochInput",
    "hooks.epoch_summaries.read_epoch_summaries", "hooks.epoch_sync.epoch_sync_hooks",
    "hooks.flags.cluster_from_flags", "hooks.flags.settings_from_flags", "hooks.flags.apply_env",
    "hooks.flags_doc", "hooks.liveness.LivenessMonitor", "hooks.preflight.hooks_of_calling_session",
    "hooks.recovery_guard.RecoveryGuardHook", "hooks.run_start.RunStartHook",
    "hooks.session.session_creator", "hooks.session.FastWorkerSessionCreator",
    "hooks.session.EpochSyncChiefSessionCreator", "hooks.step_counter.SyncStepCounterHook",
    "hooks.sync_optimizer.WorkerDoneSyncReplicasOptimizer",
    "hooks.training_session.monitored_training_session", "hooks.waiting.BackgroundRun",
    "hooks.waiting.run_options", "hooks.graph_keys.STATE_VARIABLES", "hooks.errors.ConfigError",
    "hooks.testing.local_cluster.LocalCluster",
]
_SHOWN = re.compile(r"\bfrom (hooks(?:\.[a-z_]+)*) import ([A-Za-z_]+)|"
                    r"\bimport (hooks(?:\.[a-z_]+)*)|\b(hooks(?:\.[A-Za-z_]+)+)")


def _shown_in_docs():
  paths = set()
  for top in ("README.md", "docs", "examples"):
    top = os.path.join(ROOT, top)
    files = [top] if os.path.isfile(top) else [
        os.path.join(d, f) for d, _, fs in os.walk(top) for f in fs if f.endswith((".md", ".py"))]
    for path in files:
      for m in _SHOWN.finditer(open(path).read()):
        paths.add(f"{m.group(1)}.{m.group(2)}" if m.group(1) else m.group(3) or m.group(4))
  return sorted(p.rstrip(".") for p in paths)


def _resolve(path):
  """Imports the longest module prefix of `path`, then getattr's the rest."""
  import importlib  # pylint: disable=g-import-not-at-top
  parts = path.split(".")
  for cut in range(len(parts), 0, -1):
    try:
      obj = importlib.import_module(".".join(parts[:cut]))
    except ModuleNotFoundError:
      continue
    for name in parts[cut:]:
      obj = getattr(obj, name)
    return obj
  raise ModuleNotFoundError(path)


@pytest.mark.parametrize("path", BEFORE_THE_LAYOUT + _shown_in_docs())
def test_every_documented_path_imports(path):
  if path.endswith((".py", ".md")) or re.search(r"\.(py|md|json|jsonl)$", path):
    pytest.skip("a file name, not an import path")
  assert _resolve(path) is not None
