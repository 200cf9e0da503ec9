"""The TensorFlow versions tf-epochsync supports, checked on import without importing TensorFlow.

`import hooks` calls `check_tensorflow()` and `import estimator_ext` calls `check_estimator()`;
both read the installed distributions' metadata (a few milliseconds), so that `import hooks`
stays free of TensorFlow until a hook is used.

Typical usage:
  from hooks.config import tf_version as _tf_version
  reason = _tf_version.estimator_unavailable_reason()  # None where estimator_ext works
"""

import importlib.util
from importlib import metadata
import re
from typing import List, Optional, Tuple

from hooks.errors import EstimatorUnavailableError, UnsupportedTensorFlowError

# hooks: 2.15 <= TensorFlow < 2.22. estimator_ext: TensorFlow 2.15 + tensorflow-estimator 2.15.
SUPPORTED = ((2, 15), (2, 22))
ESTIMATOR_TF = (2, 15)
SUPPORTED_TEXT = "2.15 to 2.21"
INSTALL_HINT = ("pip install 'tf-epochsync[cpu]' (tensorflow-cpu) or pip install "
                "'tensorflow>=2.15,<2.22' (the GPU build)")

# The distributions that install the `tensorflow` package (the same import, one per build).
DISTRIBUTIONS = ("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tensorflow-intel",
                 "tensorflow-macos", "tensorflow-aarch64", "tensorflow-cpu-aws",
                 "tensorflow-rocm", "intel-tensorflow", "tf-nightly", "tf-nightly-cpu")


def installed_tensorflow() -> List[Tuple[str, str]]:
  """[(distribution, version)] of every installed distribution that provides `tensorflow`.

  Empty if TensorFlow is not importable. A `tensorflow` package without metadata (a source
  tree on sys.path) is imported once to read its `__version__`.
  """
  found = []
  for name in DISTRIBUTIONS:
    try:
      found.append((name, metadata.version(name)))
    except metadata.PackageNotFoundError:
      pass
  if found or importlib.util.find_spec("tensorflow") is None:
    return found
  for name in metadata.packages_distributions().get("tensorflow", []):
    found.append((name, metadata.version(name)))
  if not found:
    import tensorflow  # pylint: disable=g-import-not-at-top
    found.append(("tensorflow", tensorflow.__version__))
  return found


def parse(version: str) -> Tuple[int, int]:
  """(major, minor) of a version string: "2.21.0" -> (2, 21), "2.16.0rc0" -> (2, 16)."""
  match = re.match(r"\s*(\d+)\.(\d+)", version)
  if not match:
    raise UnsupportedTensorFlowError(
        f"tf-epochsync cannot read the TensorFlow version {version!r}; it supports TensorFlow "
        f"{SUPPORTED_TEXT}: {INSTALL_HINT}")
  return int(match.group(1)), int(match.group(2))


def check_tensorflow(found: Optional[List[Tuple[str, str]]] = None) -> List[Tuple[str, str]]:
  """Raises UnsupportedTensorFlowError unless TensorFlow 2.15-2.21 is installed.

  Args:
    found: `[(distribution, version)]`; default `installed_tensorflow()`.

  Returns:
    `found`.

  Raises:
    UnsupportedTensorFlowError: no TensorFlow, or a version outside 2.15-2.21; the message
      names the version found, the supported range and what to install.
  """
  found = installed_tensorflow() if found is None else found
  if not found:
    raise UnsupportedTensorFlowError(
        f"tf-epochsync needs TensorFlow {SUPPORTED_TEXT}, and no TensorFlow is installed "
        f"(no module named 'tensorflow'): {INSTALL_HINT}")
  low, high = SUPPORTED
  for name, version in found:
    if not low <= parse(version) < high:
      raise UnsupportedTensorFlowError(
          f"tf-epochsync supports TensorFlow {SUPPORTED_TEXT} and found TensorFlow {version} "
          f"(distribution {name}): install a supported one, e.g. {INSTALL_HINT}")
  return found


def estimator_unavailable_reason(found: Optional[List[Tuple[str, str]]] = None,
                                 estimator_version: Optional[str] = "") -> Optional[str]:
  """Why `estimator_ext` cannot work here, or None where it can.

  Args:
    found: `[(distribution, version)]` of TensorFlow; default `installed_tensorflow()`.
    estimator_version: tensorflow-estimator's version, None if it is not installed; default:
      read from the installed metadata.
  """
  found = check_tensorflow(found)
  if estimator_version == "":
    try:
      estimator_version = metadata.version("tensorflow-estimator")
    except metadata.PackageNotFoundError:
      estimator_version = None
  hooks_api = ("; the `hooks` API (tf.compat.v1 MonitoredTrainingSession, docs/mts.md) works "
               "on TensorFlow " + SUPPORTED_TEXT)
  versions = ", ".join(version for _, version in found)
  if any(parse(version) != ESTIMATOR_TF for _, version in found):
    return (f"estimator_ext needs tf.estimator, which TensorFlow 2.16 and later no longer ship "
            f"(found TensorFlow {versions}): it runs on TensorFlow 2.15 with "
            f"tensorflow-estimator 2.15.0 only{hooks_api}")
  if estimator_version is None:
    return ("estimator_ext needs tensorflow-estimator 2.15, which is not installed: pip install "
            f"'tf-epochsync[estimator]'{hooks_api}")
  if parse(estimator_version) != ESTIMATOR_TF:
    return (f"estimator_ext needs tensorflow-estimator 2.15 and found {estimator_version}: "
            f"pip install 'tf-epochsync[estimator]'{hooks_api}")
  return None


def check_estimator() -> None:
  """Raises EstimatorUnavailableError (naming the reason) unless estimator_ext can work here."""
  reason = estimator_unavailable_reason()
  if reason:
    raise EstimatorUnavailableError(reason)
