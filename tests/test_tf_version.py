"""hooks/config/tf_version.py: `import hooks` needs TensorFlow 2.15-2.21, `import estimator_ext` 2.15 with
tensorflow-estimator; the messages name the version found, the range and what to install.

The import checks run in a subprocess with importlib.metadata faked, so this process's imports
are not disturbed."""

import ast
import glob
import json
import os
import subprocess
import sys

import pytest

from hooks.config import tf_version as _tf_version
from hooks.errors import EpochSyncError, EstimatorUnavailableError, UnsupportedTensorFlowError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("version", ["2.15.0", "2.15.1", "2.16.0rc0", "2.18.1", "2.21.0"])
def test_supported_versions_pass(version):
  assert _tf_version.check_tensorflow([("tensorflow", version)]) == [("tensorflow", version)]


@pytest.mark.parametrize("version", ["2.14.1", "2.22.0rc0", "2.22.0", "2.23.0.dev20270101",
                                     "3.0.0", "1.15.5"])
def test_unsupported_versions_name_the_version_the_range_and_what_to_install(version):
  with pytest.raises(UnsupportedTensorFlowError) as e:
    _tf_version.check_tensorflow([("tensorflow-cpu", "2.15.1"), ("tensorflow", version)])
  message = str(e.value)
  assert f"found TensorFlow {version} (distribution tensorflow)" in message
  assert "TensorFlow 2.15 to 2.21" in message
  assert "pip install 'tf-epochsync[cpu]'" in message and "'tensorflow>=2.15,<2.22'" in message
  assert isinstance(e.value, ImportError) and isinstance(e.value, EpochSyncError)


def test_no_tensorflow_says_so_and_what_to_install():
  with pytest.raises(UnsupportedTensorFlowError, match=r"no TensorFlow is installed .*"
                     r"pip install 'tf-epochsync\[cpu\]'"):
    _tf_version.check_tensorflow([])


def test_an_unreadable_version_is_refused_with_the_range():
  with pytest.raises(UnsupportedTensorFlowError, match=r"cannot read the TensorFlow version "
                     r"'unknown'.*2\.15 to 2\.21"):
    _tf_version.check_tensorflow([("tensorflow", "unknown")])


def test_estimator_reasons():
  reason = _tf_version.estimator_unavailable_reason
  assert reason([("tensorflow-cpu", "2.15.1")], "2.15.0") is None
  on_221 = reason([("tensorflow-cpu", "2.21.0")], "2.15.0")
  assert "TensorFlow 2.16 and later no longer ship" in on_221 and "found TensorFlow 2.21.0" in on_221
  missing = reason([("tensorflow", "2.15.1")], None)
  assert "tensorflow-estimator 2.15, which is not installed" in missing
  assert "pip install 'tf-epochsync[estimator]'" in missing
  assert "found 2.14.0" in reason([("tensorflow", "2.15.1")], "2.14.0")
  for text in (on_221, missing):
    assert "the `hooks` API" in text and "works on TensorFlow 2.15 to 2.21" in text
  with pytest.raises(UnsupportedTensorFlowError):
    reason([("tensorflow", "2.14.0")], "2.14.0")


def test_this_environment_has_a_supported_tensorflow():
  found = _tf_version.installed_tensorflow()
  assert found and _tf_version.check_tensorflow(found) == found


# Runs `import <module>` in a fresh interpreter whose importlib.metadata reports `versions`
# for TensorFlow's distributions and tensorflow-estimator (None: not installed) and prints
# what happened as JSON.
_FAKE_IMPORT = """
import importlib.metadata as m, json, sys
fake, module, no_tf_package = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3] == "1"
real = m.version
def version(name):
  if name in fake:
    if fake[name] is None:
      raise m.PackageNotFoundError(name)
    return fake[name]
  return real(name)
m.version = version
if no_tf_package:
  sys.modules["tensorflow"] = None  # importlib.util.find_spec("tensorflow") is None
try:
  __import__(module)
  error = None
except ImportError as e:
  error = [type(e).__name__, str(e)]
print(json.dumps({"error": error, "tensorflow_imported": bool(sys.modules.get("tensorflow"))}))
"""


def _fake_import(module, tensorflow=None, estimator="2.15.0", no_tf_package=False):
  fake = {name: None for name in _tf_version.DISTRIBUTIONS}
  fake.update(tensorflow or {})
  fake["tensorflow-estimator"] = estimator
  out = subprocess.run(
      [sys.executable, "-c", _FAKE_IMPORT, json.dumps(fake), module, str(int(no_tf_package))],
      cwd=ROOT, capture_output=True, text=True, timeout=120, check=True)
  return json.loads(out.stdout.strip().splitlines()[-1])


def test_import_hooks_refuses_an_unsupported_tensorflow_without_importing_it():
  result = _fake_import("hooks", {"tensorflow-cpu": "2.14.1"})
  assert result["error"][0] == "UnsupportedTensorFlowError"
  assert "found TensorFlow 2.14.1 (distribution tensorflow-cpu)" in result["error"][1]
  assert "tf-epochsync[cpu]" in result["error"][1]
  assert not result["tensorflow_imported"]
  assert _fake_import("hooks", {"tensorflow": "2.22.0"})["error"][0] == (
      "UnsupportedTensorFlowError")


def test_import_hooks_without_tensorflow_says_what_to_install():
  result = _fake_import("hooks", no_tf_package=True)
  assert result["error"][0] == "UnsupportedTensorFlowError"
  assert "no TensorFlow is installed" in result["error"][1]


def test_import_hooks_on_supported_versions_does_not_import_tensorflow():
  for version in ("2.15.1", "2.21.0"):
    assert _fake_import("hooks", {"tensorflow": version}) == {
        "error": None, "tensorflow_imported": False}


def test_import_estimator_ext_on_tf_2_16_and_later_points_to_the_hooks_api():
  result = _fake_import("estimator_ext", {"tensorflow-cpu": "2.21.0"})
  assert result["error"][0] == "EstimatorUnavailableError"
  assert "TensorFlow 2.16 and later no longer ship" in result["error"][1]
  assert "the `hooks` API" in result["error"][1]
  assert not result["tensorflow_imported"]


def test_import_estimator_ext_without_tensorflow_estimator_says_what_to_install():
  result = _fake_import("estimator_ext", {"tensorflow": "2.15.1"}, estimator=None)
  assert result["error"][0] == "EstimatorUnavailableError"
  assert "pip install 'tf-epochsync[estimator]'" in result["error"][1]


def test_estimator_error_is_an_import_error_of_the_library():
  assert issubclass(EstimatorUnavailableError, ImportError)
  assert issubclass(EstimatorUnavailableError, EpochSyncError)


def test_the_packages_parse_as_python_3_9_as_python_requires_says():
  """setup.cfg's python_requires starts at 3.9 (TensorFlow 2.15's oldest): no newer syntax,
  and no `X | Y` annotation evaluated at definition time (a TypeError before 3.10)."""
  files = [f for d in ("hooks", "estimator_ext") for f in
           glob.glob(os.path.join(ROOT, d, "**", "*.py"), recursive=True)]
  assert len(files) > 20
  problems = []
  for path in files:
    with open(path, encoding="utf-8") as f:
      source = f.read()
    tree = ast.parse(source, path, feature_version=(3, 9))
    if "from __future__ import annotations" in source:
      continue
    for node in ast.walk(tree):
      annotations = []
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        args = node.args
        annotations = [a.annotation for a in args.posonlyargs + args.args + args.kwonlyargs
                       + [args.vararg, args.kwarg] if a is not None] + [node.returns]
      elif isinstance(node, ast.AnnAssign):
        annotations = [node.annotation]
      for annotation in annotations:
        if annotation is not None and any(
            isinstance(n, ast.BinOp) and isinstance(n.op, ast.BitOr)
            for n in ast.walk(annotation)):
          problems.append(f"{os.path.relpath(path, ROOT)}:{annotation.lineno}")
  assert not problems, f"X | Y annotations (Python 3.10+): {problems}"
