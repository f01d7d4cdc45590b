#!/usr/bin/env bash
# Regenerate the Python modules for the CRI subset (flexlease/cri/api.proto, shared: the node agent and the orchestrator) with grpcio-tools:
# api_pb2.py (messages), api_pb2.pyi (message types for mypy), api_pb2_grpc.py (service stubs).
# The output is checked in; run this after editing api.proto. Needs: pip install grpcio-tools ruff.
# The generated code needs a protobuf runtime at least as new as the protoc in grpcio-tools.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
out=flexlease/cri
"$PY" -m grpc_tools.protoc -I . \
  --python_out=. --pyi_out=. --grpc_python_out=. \
  "$out/api.proto"
# Generated stubs keep protoc's long lines and bare Mapping: exempt them from lint and from
# mypy's any-generics rule (inline config), keep them formatted.
sed -i '1i # ruff: noqa\n# mypy: allow-any-generics' "$out/api_pb2.pyi"
"$PY" -m ruff format -q "$out/api_pb2.py" "$out/api_pb2.pyi" "$out/api_pb2_grpc.py"
echo "generated: $out/api_pb2.py $out/api_pb2.pyi $out/api_pb2_grpc.py"
