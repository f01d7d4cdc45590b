#!/usr/bin/env bash
# The test command (README, .ci/run): installs what it needs, then lint, types, layers, tests.
# Works on a fresh Debian with Python 3.11; apt-get runs when root and a tool is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
# shellcheck source=hack/lib/deps.sh
. hack/lib/deps.sh
install_deps

echo "== ruff"
"$PY" -m ruff check .
"$PY" -m ruff format --check .
echo "== mypy"
"$PY" -m mypy flexlease extender nodeagent standins hack
echo "== import-linter"
lint-imports
echo "== pytest"
"$PY" -m pytest -q -p no:cacheprovider "$@"
