#!/usr/bin/env bash
# The test command (README, .ci/run): installs what it needs, then lint, types, layers, tests
# under coverage.py (subprocesses included), and the coverage table with its floor at the end.
# Works on a fresh Debian with Python 3.11; apt-get runs when root and a tool is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
# shellcheck source=hack/lib/deps.sh
. hack/lib/deps.sh
install_test_deps

echo "== ruff"
"$PY" -m ruff check .
"$PY" -m ruff format --check .
echo "== mypy"
"$PY" -m mypy flexlease extender nodeagent standins hack
echo "== import-linter"
lint-imports
echo "== pytest (under coverage.py; [tool.coverage] in pyproject.toml)"
# patch = subprocess makes every Python process the tests start (extender, agents, simulator,
# demo) record its coverage too; each writes its own data file next to this one.
export COVERAGE_FILE="$PWD/.coverage"
rm -f .coverage .coverage.*
status=0
"$PY" -m coverage run -m pytest -q -p no:cacheprovider "$@" || status=$?
"$PY" -m coverage combine -q
echo "== coverage (floor: fail_under in pyproject.toml)"
cov=0
"$PY" -m coverage report || cov=$?
[ "$status" -ne 0 ] || status=$cov
exit "$status"
