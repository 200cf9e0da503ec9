"""Shared fixtures: the project root on sys.path, absl flag parsing, the --stress-runs and
--matrix-seeds and --kill-seeds options, and the Estimator tests' skip where estimator_ext cannot work."""

import fnmatch
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

# The Estimator half's test files (they import estimator_ext or tensorflow_estimator, in this
# process or in their tasks) and the `estimator` marker for single tests elsewhere: skipped,
# with the reason in the -rs summary, where estimator_ext cannot work (TensorFlow 2.16+, e.g.
# ./es test --tf=2.21). Anywhere else they run, and an import error in them fails as usual.
ESTIMATOR_TEST_FILES = ("test_estimator_*.py", "test_warm_start.py", "test_canned_optimizers.py",
                        "test_mid_epoch_estimator.py")

# The hooks half's cluster tests, marked `hooks_cluster`: CI runs them on TensorFlow 2.21 as
# well (.ci/run: -m "not slow or hooks_cluster"). All cluster files but the Estimator's (the
# mid-epoch kills and TensorFlow's own MonitoredTrainingSession's faults included), the
# randomized matrix cut to seeds 0-3 (each mode, each with and without a chief job), and
# test_log's two jobs (no cluster: where the lines go under TensorFlow's and absl's idioms).
HOOKS_CLUSTER_TESTS = tuple(f"tests/{name}" for name in (
    "test_barrier_stress.py::*", "test_epoch_sync_cluster.py::*", "test_faults.py::*",
    "test_local_cluster.py::*", "test_migration.py::*", "test_restarts.py::*",
    "test_security.py::*", "test_sync_optimizer.py::*", "test_tokens.py::*",
    "test_healthy_logs.py::*", "test_sparse_cluster.py::*", "test_mid_epoch_cluster.py::*",
    "test_faults_stock_session.py::*", "test_log.py::*", "test_progress_waits.py::*",
    "test_matrix.py::test_draws_*", "test_matrix.py::*[[]seed[0-3]-*"))


def estimator_skip_reason():
  """Why the Estimator tests cannot run in this environment, or None where they run."""
  from hooks.config import tf_version as _tf_version  # pylint: disable=g-import-not-at-top
  reason = _tf_version.estimator_unavailable_reason()
  return reason and f"Estimator test: {reason}"


class _SkippedModule(pytest.Module):
  """An Estimator test file, reported as skipped (with its number of tests) and not imported."""

  def collect(self):
    with open(self.path, encoding="utf-8") as f:
      count = sum(line.lstrip().startswith("def test_") for line in f)
    raise pytest.skip.Exception(f"{self.path.name} ({count} test functions): "
                                f"{estimator_skip_reason()}", allow_module_level=True)


def pytest_pycollect_makemodule(module_path, parent):
  if (any(fnmatch.fnmatch(module_path.name, p) for p in ESTIMATOR_TEST_FILES)
      and estimator_skip_reason()):
    return _SkippedModule.from_parent(parent, path=module_path)
  return None


VARIANT_REASON = ("a variant of a test the default suite runs in another form (the suite "
                  "stays near 20 minutes): runs with --all-variants")


def pytest_configure(config):
  config.addinivalue_line("markers", "variant: one more victim, kill point or session form of "
                          "a fault test; runs with --all-variants")


def pytest_collection_modifyitems(config, items):
  all_variants = config.getoption("--all-variants")
  reason = None
  for item in items:
    if item.get_closest_marker("variant") and not all_variants:
      item.add_marker(pytest.mark.skip(reason=VARIANT_REASON))
    if any(fnmatch.fnmatch(item.nodeid, p) for p in HOOKS_CLUSTER_TESTS):
      item.add_marker(pytest.mark.hooks_cluster)
    if item.get_closest_marker("estimator"):
      reason = reason or estimator_skip_reason() or ""
      if reason:
        item.add_marker(pytest.mark.skip(reason=reason))


def pytest_addoption(parser):
  parser.addoption(
      "--all-variants", action="store_true", default=False,
      help="Also run the fault tests' other victims, kill points and session forms (marker "
           "`variant`; default: one or a few of each, e.g. ./es test --all-variants "
           "tests/test_restarts.py).")
  parser.addoption(
      "--stress-runs", type=int, default=1, metavar="N",
      help="How many times each barrier stress test runs its job (default 1; e.g. "
           "./es test tests/test_barrier_stress.py --stress-runs=10).")
  parser.addoption(
      "--matrix-seeds", type=int, default=None, metavar="N",
      help="The randomized cluster matrix runs seeds 0..N-1, each synchronous and asynchronous "
           "(default: seeds 0..3 once each, 2 synchronous and 2 asynchronous, each mode with and "
           "without a chief job; e.g. ./es test tests/test_matrix.py --matrix-seeds=10).")
  parser.addoption(
      "--estimator-kill-seeds", type=int, default=0, metavar="N",
      help="The Estimator path's randomized mid-epoch kill matrix runs seeds 0..N-1 (even "
           "seeds synchronous, odd asynchronous; default: none, the fixed chief kill runs); "
           "e.g. ./es test tests/test_mid_epoch_estimator.py --estimator-kill-seeds=10).")
  parser.addoption(
      "--kill-seeds", type=int, default=None, metavar="N",
      help="The randomized mid-epoch kill matrix runs seeds 0..N-1, each synchronous and "
           "asynchronous (default: seed 0, synchronous; e.g. ./es test "
           "tests/test_mid_epoch_cluster.py --kill-seeds=10).")
  parser.addoption(
      "--elastic-seeds", type=int, default=0, metavar="N",
      help="The elastic kill matrix runs seeds 0..N-1, each through MonitoredTrainingSession "
           "and the Estimator, asynchronous and synchronous: a worker killed, frozen, "
           "relaunched, killed twice or two at once "
           "(default: none; e.g. ./es test tests/test_elastic_matrix.py --elastic-seeds=10).")
  parser.addoption(
      "--scale", type=int, default=0, metavar="N",
      help="The many-worker jobs of tests/test_scale_cluster.py run with N workers and 4 ps "
           "(default: skipped; e.g. ./es test tests/test_scale_cluster.py --scale=48).")
  parser.addoption(
      "--unit-kill-seeds", type=int, default=None, metavar="N",
      help="The work queue's randomized mid-epoch kill matrix runs seeds 0..N-1, each "
           "synchronous and asynchronous (default: none; the fixed resumes run; e.g. ./es test "
           "tests/test_work_queue_cluster.py --unit-kill-seeds=10).")


# Two seeds (the whole suite must stay near 20 minutes): each mode once, the synchronous one with
# a chief job (an even seed), the asynchronous one without (an odd seed).
_DEFAULT_MATRIX = [(0, True), (1, False)]  # synchronous with a chief job, asynchronous without


def _parametrize_seeds(metafunc, fixture: str, seeds, default) -> None:
  """(seed, sync) cases: `default` without the option, else seeds 0..N-1 in both modes."""
  cases = (default if seeds is None else
           [(seed, sync) for seed in range(max(1, seeds)) for sync in (True, False)])
  metafunc.parametrize(fixture, cases, ids=[
      f"seed{seed}-{'sync' if sync else 'async'}" for seed, sync in cases])


def pytest_generate_tests(metafunc):
  if "stress_run" in metafunc.fixturenames:
    runs = max(1, metafunc.config.getoption("--stress-runs"))
    metafunc.parametrize("stress_run", range(runs), ids=[f"run{i}" for i in range(runs)])
  for fixture, option, default in (("matrix_case", "--matrix-seeds", _DEFAULT_MATRIX),
                                    ("kill_case", "--kill-seeds", [(0, True)]),
                                    ("unit_kill_case", "--unit-kill-seeds", [])):
    if fixture in metafunc.fixturenames:
      _parametrize_seeds(metafunc, fixture, metafunc.config.getoption(option), default)
  if "elastic_case" in metafunc.fixturenames:  # Only when asked: ~1 min a seed.
    seeds = metafunc.config.getoption("--elastic-seeds")
    cases = [(seed, front, mode) for seed in range(seeds or 1) for front in ("mts", "estimator")
             for mode in ("async", "sync")]
    metafunc.parametrize("elastic_case", [
        pytest.param(case, marks=([pytest.mark.estimator] if case[1] == "estimator" else []) +
                     ([] if seeds else [pytest.mark.skip(
                         reason="the elastic kill matrix runs with --elastic-seeds=N")]))
        for case in cases], ids=[f"seed{seed}-{front}-{mode}" for seed, front, mode in cases])
  if "estimator_kill_seed" in metafunc.fixturenames:  # Only when asked: ~60 s a seed.
    seeds = metafunc.config.getoption("--estimator-kill-seeds")
    metafunc.parametrize("estimator_kill_seed", [
        pytest.param(seed, marks=[] if seeds else pytest.mark.skip(
            reason="the Estimator kill matrix runs with --estimator-kill-seeds=N"))
        for seed in range(seeds or 1)], ids=lambda seed: f"seed{seed}")


@pytest.fixture
def parse(monkeypatch):
  """Parses argv into absl's FLAGS (no EPOCHSYNC_* variables); every value is restored after."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  from absl.testing import flagsaver  # pylint: disable=g-import-not-at-top
  for name in list(os.environ):
    if name.startswith("EPOCHSYNC_"):
      monkeypatch.delenv(name)
  was_parsed = flags.FLAGS.is_parsed()
  with flagsaver.flagsaver():
    yield lambda *argv: flags.FLAGS(["prog", *argv])
  if not was_parsed:
    flags.FLAGS.unparse_flags()
