"""docs/migration.md backs each step with a test named beside it: every named test exists."""

import ast
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _tests_in(path):
  """{"test_x", "TestClass::test_y", "TestClass"} defined in a test file."""
  with open(os.path.join(ROOT, path)) as f:
    tree = ast.parse(f.read())
  names = set()
  for node in tree.body:
    if isinstance(node, ast.FunctionDef):
      names.add(node.name)
    elif isinstance(node, ast.ClassDef):
      names.add(node.name)
      names.update(f"{node.name}::{item.name}" for item in node.body
                   if isinstance(item, ast.FunctionDef))
  return names


def test_every_test_named_in_docs_migration_exists():
  with open(os.path.join(ROOT, "docs", "migration.md")) as f:
    text = f.read()
  named = re.findall(r"`(tests/[\w/]+\.py)((?:::\w+)*)`", text)
  assert len(named) >= 15, named
  last_file, missing = None, []
  for path, test in named:
    assert os.path.exists(os.path.join(ROOT, path)), path
    last_file = path
    if test and test.lstrip(":") not in _tests_in(path):
      missing.append(path + test)
  # "`::name`" continues the file named just before it.
  for test in re.findall(r"`::(\w+)`", text):
    if not any(test in _tests_in(p) or any(n.endswith("::" + test) for n in _tests_in(p))
               for p, _ in named):
      missing.append("::" + test)
  assert last_file and not missing, missing
