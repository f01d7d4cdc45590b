#!/usr/bin/env bash
# The main job (README): the local demo. Installs flexlease with its `demo` extra only
# (hack/lib/deps.sh: install_demo_deps; ${PYTHON:-python3}, e.g. a virtualenv's python), starts a
# private containerd + registry (hack/containerd-testbed.sh, which apt-get installs containerd,
# runc, the CNI plugins, busybox-static, docker-registry and skopeo when missing), then runs
# hack/demo.py: the real extender and one real node agent per simulated node replay one
# accelerated day of right-of-return leasing, and a report is printed. Root is needed for containerd. The extender
# serves plain HTTP on 127.0.0.1 here, explicitly (FLEXLEASE_EXTENDER__INSECURE_HTTP=true, set
# by flexlease/sim/extender_proc.py); a cluster uses mutual TLS (README, "Security").
# Usage: sudo bash hack/local-up.sh [--speedup 900] [--out out/demo]
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" != 0 ]; then
  echo "local-up: run as root (containerd, CNI and mounts need it): sudo bash hack/local-up.sh" >&2
  exit 1
fi
PY=${PYTHON:-python3}
# shellcheck source=hack/lib/deps.sh
. hack/lib/deps.sh
install_demo_deps

TESTBED=$(mktemp -d /tmp/flexlease-demo-testbed-XXXXXX)
cleanup() { bash hack/containerd-testbed.sh stop "$TESTBED" >/dev/null 2>&1 || true; rm -rf "$TESTBED"; }
trap cleanup EXIT
echo "== containerd testbed in $TESTBED"
env_lines=$(bash hack/containerd-testbed.sh start "$TESTBED")
while IFS='=' read -r key value; do
  case "$key" in FLEXLEASE_*) export "$key=$value" ;; esac
done <<<"$env_lines"
echo "== demo"
"$PY" hack/demo.py "$@"
