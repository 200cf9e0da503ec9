"""docs/troubleshooting.md stays true: every error class has a row, and the audit reference has
every field the chief writes, with a healthy example shaped as a real audit line."""

import inspect
import json
import os
import re
import types

from hooks.epoch import audit as audit_lib
from hooks import errors

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, "docs", "troubleshooting.md")

# Fields that only some lines carry, and who writes them (the test below checks the names in
# the code, so a renamed or added field fails here until the doc says it).
OPTIONAL_FIELDS = {
    "attempts": "hooks/checkpoint/mid_epoch.py", "resumed_from": "hooks/checkpoint/mid_epoch.py",
    "eval": "estimator_ext/in_loop.py", "evaluated_at": "estimator_ext/in_loop.py",
    "early_stop": "estimator_ext/in_loop.py",
}


def _doc():
  with open(DOC) as f:
    return f.read()


def _section(text, title):
  start = text.index(f"## {title}\n")
  end = text.find("\n## ", start + 1)
  return text[start:end if end >= 0 else len(text)]


def _error_rows(text):
  """The first cell's error name of every row of the Errors table."""
  return re.findall(r"^\| `(\w+)`", _section(text, "Errors"), re.M)


def test_every_error_the_library_raises_has_a_row():
  classes = {name for name, obj in vars(errors).items()
             if inspect.isclass(obj) and issubclass(obj, errors.EpochSyncError)}
  classes.discard("SyncTimeoutError")  # the base of the timeouts: each has its own row
  classes.add("EvaluatorTimeoutError")  # estimator_ext.evaluator's (imports TensorFlow's estimator)
  rows = set(_error_rows(_doc()))
  assert classes - rows == set(), f"errors without a row in docs/troubleshooting.md: {classes - rows}"
  assert "TaskDiedError" in classes and "BarrierTimeoutError" in classes  # the scan found them


def test_the_evaluators_error_is_the_one_named():
  with open(os.path.join(ROOT, "estimator_ext", "evaluator.py")) as f:
    assert "class EvaluatorTimeoutError(SyncTimeoutError)" in f.read()


def _example_line(text):
  block = re.search(r"```json\n(.*?)```", _section(text, "The epoch audit"), re.S).group(1)
  return json.loads(block)


def _documented_fields(text):
  return set(re.findall(r"^\| `([\w.*]+)` \|", _section(text, "The epoch audit"), re.M))


def test_the_healthy_example_has_the_fields_of_a_line_the_chief_writes(tmp_path):
  stats = types.SimpleNamespace(batches=9, examples=72, started_at=1.0, ended_at=2.0)
  # What ChiefSaveAfterBarrierHook adds to every line (hooks/checkpoint/epoch_save.py, _save).
  written = audit_lib.EpochAudit(str(tmp_path)).write(
      epoch=0, arrivals={"worker:0": stats}, released_at=3.0,
      fields={"checkpoint": "ckpt", "saved_at": 2.5}, global_step=9)
  example = _example_line(_doc())
  assert set(example) == set(written)
  for worker in example["workers"].values():
    assert set(worker) == set(written["workers"]["worker:0"])
  with open(os.path.join(ROOT, "hooks", "checkpoint", "epoch_save.py")) as f:
    assert 'return {"checkpoint": path, "saved_at": saved_at}' in f.read()


def test_the_healthy_example_is_consistent():
  line = _example_line(_doc())
  batches = [w["batches"] for w in line["workers"].values()]
  assert line["global_step"] == (line["epoch"] + 1) * max(batches)  # sync: longest shard
  assert all(w["examples"] == 8 * w["batches"] for w in line["workers"].values())
  assert line["saved_at"] <= line["released_at"]
  for w in line["workers"].values():
    assert w["started_at"] <= w["arrived_at"] <= line["released_at"]
    assert abs(line["released_at"] - w["arrived_at"] - w["barrier_wait_secs"]) < 1e-3


def test_every_field_is_documented():
  text = _doc()
  example = _example_line(text)
  want = set(example) | {f"workers.*.{k}" for w in example["workers"].values() for k in w}
  want |= set(OPTIONAL_FIELDS)
  documented = _documented_fields(text)
  assert want - documented == set(), want - documented
  for field, path in OPTIONAL_FIELDS.items():
    with open(os.path.join(ROOT, path)) as f:
      assert f'"{field}"' in f.read(), (field, path)


def _anchor(heading):
  return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_link_of_the_troubleshooting_and_quick_start_docs_resolves():
  for doc in ("troubleshooting.md", "quickstart-k8s.md"):
    path = os.path.join(ROOT, "docs", doc)
    with open(path) as f:
      links = re.findall(r"\]\(([^)#\s]*)(?:#([^)\s]+))?\)", f.read())
    assert links, doc
    for target, anchor in links:
      if target.startswith("http"):
        continue
      linked = os.path.normpath(os.path.join(os.path.dirname(path), target)) if target else path
      assert os.path.exists(linked), (doc, target)
      if anchor:
        with open(linked) as f:
          headings = [_anchor(h) for h in re.findall(r"^#+ (.*)$", f.read(), re.M)]
        assert anchor in headings, (doc, target, anchor)


def test_the_count_of_bad_input_kinds_is_the_reliability_tables():
  """README and troubleshooting say how many kinds of bad input are refused: the rows of
  reliability.md's table, numbered 1..N."""
  with open(os.path.join(ROOT, "docs", "reliability.md")) as f:
    table = _section(f.read(), "Bad input")
  numbers = [int(n) for n in re.findall(r"^\| (\d+) \|", table, re.M)]
  assert numbers == list(range(1, len(numbers) + 1)), numbers
  with open(os.path.join(ROOT, "README.md")) as f:
    readme = f.read()
  assert re.findall(r"(\d+) kinds of misconfiguration", readme) == [str(len(numbers))]
  assert re.findall(r"all (\d+) kinds", _doc()) == [str(len(numbers))]
