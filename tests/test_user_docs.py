"""README.md and docs/*.md as an adopter reads them: the README's first screen answers what,
whether it fits and how to try it before any figure, and no user doc carries the project's
issue numbers (TensorFlow's own issues, cited as "TensorFlow issue N", are references)."""

import glob
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
USER_DOCS = [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
# "issue 22", "issues 19 and 22", "issue #8", a bare "#10"; not "TensorFlow issue 11753".
_PROJECT_ISSUE = re.compile(r"(?<!tensorflow )\bissues? #?\d+|(?<![\w&/#])#\d+\b", re.IGNORECASE)


def _read(path):
  with open(path, encoding="utf-8") as f:
    return f.read()


def _headings(text):
  return [line.lstrip("#").strip() for line in text.splitlines() if line.startswith("## ")]


def test_the_readme_says_what_fits_and_how_to_try_before_any_figure():
  text = _read(os.path.join(ROOT, "README.md"))
  headings = _headings(text)
  assert headings[:2] == ["Supported versions", "Try it (a fresh machine with Python 3.11 and pip)"]
  first_figures = min(i for i, h in enumerate(headings) if "benchmarks" in h or "costs" in h)
  assert first_figures > 1, headings
  fits = text.split("## Supported versions", 1)[1].split("\n## ", 1)[0]
  for needed in ("TensorFlow 2.15 to 2.21", "TensorFlow 2.15 only", "tensorflow-estimator",
                 "parameter servers", "Keras", "tf.distribute", "TensorFlow 1.x"):
    assert needed in fits, needed
  # The two set-up commands: the first runs the demo, the second the tests (what CI runs).
  try_block = text.split("## Try it", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
  commands = [line.split("#")[0].strip() for line in try_block.splitlines()]
  assert commands == ["./es demo", "./es test"], commands
  assert "./es test" in _read(os.path.join(ROOT, ".ci", "run"))
  # The figures are one table that links to docs/benchmarks.md.
  figures = text.split("## " + headings[first_figures], 1)[1].split("\n## ", 1)[0]
  assert "docs/benchmarks.md" in figures and "| --- |" in figures


def test_setup_cfg_cites_readme_sections_that_exist():
  headings = _headings(_read(os.path.join(ROOT, "README.md")))
  cited = re.findall(r'README, "([^"]+)"', _read(os.path.join(ROOT, "setup.cfg")))
  assert cited and all(c in headings for c in cited), (cited, headings)


def test_no_user_doc_carries_project_issue_numbers():
  found = [f"{os.path.relpath(path, ROOT)}: {m.group(0)!r}"
           for path in USER_DOCS for m in _PROJECT_ISSUE.finditer(_read(path))]
  assert not found, found
