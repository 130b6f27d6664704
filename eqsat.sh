#!/usr/bin/env bash
# The project's entry point: finds Python >= 3.12, builds .venv with what eqsat needs, then runs a command.
#   ./eqsat.sh demo        optimize the bundled example and print the plan and the measured speed-up
#   ./eqsat.sh test        run the test suite (what CI runs)
#   ./eqsat.sh test-all    also the slow tests and the real third-party models (installs the `models` extra)
#   ./eqsat.sh docs        build the documentation site into site/ (mkdocs, warnings as errors; the `docs` extra)
#   ./eqsat.sh jax-tests --tests DIR   JAX's own tests (DIR: a jax checkout's tests/) with jax.jit -> eqsat.optimize
#   ./eqsat.sh <args>      anything else goes to `python -m eqsat <args>`
set -euo pipefail
cd "$(dirname "$0")"

find_python() {
  local candidates=("${EQSAT_PYTHON:-}" python3.13 python3.12 python3 python)
  if command -v pyenv >/dev/null 2>&1; then
    local root; root=$(pyenv root)
    candidates+=("$root"/versions/3.1[2-9]*/bin/python3 "$root"/versions/3.[2-9][0-9]*/bin/python3)
  fi
  candidates+=(/usr/local/bin/python3.1[2-9] /usr/bin/python3.1[2-9])
  for c in "${candidates[@]}"; do
    [ -n "$c" ] || continue
    if "$c" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 12) else 1)' >/dev/null 2>&1; then
      command -v "$c" 2>/dev/null || echo "$c"; return 0
    fi
  done
  return 1
}

ensure_venv() {  # $1: pip extras, e.g. "test" or "test,models"
  local stamp=".venv/.eqsat-installed-$1"
  if [ -x .venv/bin/python ] && [ -f "$stamp" ] && [ "$stamp" -nt pyproject.toml ]; then return; fi
  if [ ! -x .venv/bin/python ]; then
    local py
    if ! py=$(find_python); then
      echo "eqsat needs Python 3.12 or newer and found none (tried python3.13, python3.12, python3, pyenv's versions)." >&2
      echo "Install one (e.g. 'pyenv install 3.12') or point EQSAT_PYTHON at it: EQSAT_PYTHON=/path/to/python3.12 $0 $*" >&2
      exit 2
    fi
    echo "eqsat: creating .venv with $py" >&2
    "$py" -m venv .venv
  fi
  .venv/bin/python -m pip install -q --upgrade pip >&2
  # setuptools notes on every editable install of this layout that a folder named like the package may shadow
  # it; here that folder is the package itself, so the note says nothing
  PYTHONWARNINGS="ignore:Editable installation" .venv/bin/python -m pip install -q -e ".[$1]" >&2
  touch "$stamp"
}

cmd="${1:-demo}"; [ $# -gt 0 ] && shift
case "$cmd" in
  test)     ensure_venv test; exec .venv/bin/python -m pytest -n 2 -q "$@" ;;
  test-all) ensure_venv test,models; exec .venv/bin/python -m pytest -n 2 -q -m "" "$@" ;;
  lint)     ensure_venv test; .venv/bin/ruff check . && exec .venv/bin/ruff format --check . ;;
  demo)     ensure_venv test; exec .venv/bin/python -m eqsat demo "$@" ;;
  docs)     ensure_venv test,docs; NO_MKDOCS_2_WARNING=1 exec .venv/bin/python -m mkdocs build --strict -d site/ "$@" ;;
  jax-tests) ensure_venv test,jax-tests; exec .venv/bin/python -m benches.jax_tests.run "$@" ;;
  *)        ensure_venv test; exec .venv/bin/python -m eqsat "$cmd" "$@" ;;
esac
