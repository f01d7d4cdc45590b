#!/usr/bin/env bash
# Run the trace-driven simulator (flexlease.sim) with the paper's setup: 64 nodes x 8 GPUs,
# 60 simulated days, both policies, traces from data/ (data/README.md).
#   hack/simulate.sh [OUT_DIR] [extra args for python -m flexlease.sim]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-out/sim}
shift || true
exec "${PYTHON:-python3}" -m flexlease.sim --nodes 64 --days 60 --out "$out" "$@"
