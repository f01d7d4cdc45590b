#!/usr/bin/env bash
# The test command (README, .ci/run): installs what it needs, then lint, types, layers, tests.
# Works on a fresh Debian with Python 3.11; apt-get runs when root and a tool is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
if [ "$(id -u)" = 0 ]; then
  need=()
  for pair in containerd:containerd runc:runc busybox:busybox-static docker-registry:docker-registry \
              skopeo:skopeo promtool:prometheus; do
    command -v "${pair%%:*}" >/dev/null 2>&1 || need+=("${pair#*:}")
  done
  [ -x /usr/lib/cni/bridge ] || need+=(containernetworking-plugins)
  if [ ${#need[@]} -gt 0 ]; then
    echo "== apt-get install ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  fi
fi

echo "== pip install"
"$PY" -m pip install -q --disable-pip-version-check -e '.[test,sim]'

echo "== ruff"
"$PY" -m ruff check .
"$PY" -m ruff format --check .
echo "== mypy"
"$PY" -m mypy flexlease extender nodeagent hack
echo "== import-linter"
lint-imports
echo "== pytest"
"$PY" -m pytest -q -p no:cacheprovider "$@"
