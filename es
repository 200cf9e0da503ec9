#!/usr/bin/env bash
# tf-epochsync's three entry points. Each installs what it needs into .venv on first use.
#   ./es demo [flags]    the main job: a real 1 ps + 3 worker cluster on this machine
#   ./es test [args]     the test suite (pytest args pass through, e.g. -m "not slow")
#   ./es bench [args]    the benchmarks (docs/benchmarks.md): --full for all, --only=NAME for one
set -euo pipefail
cd "$(dirname "$0")"
venv=.venv
stamp="$venv/.installed-setup.cfg"

ensure_venv() {
  if [ -x "$venv/bin/python" ] && cmp -s setup.cfg "$stamp"; then
    return
  fi
  local python="${PYTHON:-python3}"
  "$python" -c 'import sys; assert sys.version_info[:2] == (3, 11), sys.version' || {
    echo "tf-epochsync needs Python 3.11 (TensorFlow 2.15.1); set PYTHON=/path/to/python3.11" >&2
    exit 2
  }
  echo "Installing into $venv (first use only)..." >&2
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip >&2
  "$venv/bin/python" -m pip install -q -e '.[test]' >&2
  cp setup.cfg "$stamp"
}

cmd="${1:-}"
[ $# -gt 0 ] && shift
case "$cmd" in
  demo)  ensure_venv; exec "$venv/bin/python" -m examples.local_cluster "$@" ;;
  test)  ensure_venv; exec "$venv/bin/python" -m pytest "$@" ;;
  bench) ensure_venv
         "$venv/bin/python" -c 'import matplotlib' 2>/dev/null ||
           "$venv/bin/python" -m pip install -q -e '.[test,bench]' >&2
         exec "$venv/bin/python" -m bench "$@" ;;
  *) sed -n '2,5p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
