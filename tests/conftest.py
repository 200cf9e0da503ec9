"""Shared fixtures: the project root on sys.path, and the --stress-runs option."""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)


def pytest_addoption(parser):
  parser.addoption(
      "--stress-runs", type=int, default=1, metavar="N",
      help="How many times each barrier stress test runs its job (default 1; e.g. "
           "./es test tests/test_barrier_stress.py --stress-runs=10).")


def pytest_generate_tests(metafunc):
  if "stress_run" in metafunc.fixturenames:
    runs = max(1, metafunc.config.getoption("--stress-runs"))
    metafunc.parametrize("stress_run", range(runs), ids=[f"run{i}" for i in range(runs)])
