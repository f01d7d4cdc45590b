#!/usr/bin/env bash
# Regenerate the Python modules for the hand-written proto subsets with grpcio-tools:
# flexlease/cri/api.proto (CRI runtime.v1; shared: the node agent and the orchestrator),
# nodeagent/deviceplugin/deviceplugin.proto (kubelet device plugin v1beta1) and
# nodeagent/deviceplugin/podresources.proto (kubelet PodResources v1).
# For each X.proto: X_pb2.py (messages) and X_pb2.pyi (message types for mypy); for the CRI
# proto also api_pb2_grpc.py (service stubs; the tests' CRI servicer uses them; the device
# plugin's calls go through nodeagent/deviceplugin/rpc.py instead). The output is checked in; run this after editing a .proto. Needs:
# pip install grpcio-tools ruff. The generated code needs a protobuf runtime at least as new as
# the protoc in grpcio-tools.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
for proto in flexlease/cri/api.proto nodeagent/deviceplugin/deviceplugin.proto \
    nodeagent/deviceplugin/podresources.proto; do
  base=${proto%.proto}
  outputs=("${base}_pb2.py" "${base}_pb2.pyi")
  grpc_out=()
  if [[ $proto == flexlease/cri/api.proto ]]; then
    grpc_out=(--grpc_python_out=.)
    outputs+=("${base}_pb2_grpc.py")
  fi
  "$PY" -m grpc_tools.protoc -I . \
    --python_out=. --pyi_out=. "${grpc_out[@]}" \
    "$proto"
  # Generated stubs keep protoc's long lines and bare Mapping: exempt them from lint and from
  # mypy's any-generics rule (inline config), keep them formatted.
  sed -i '1i # ruff: noqa\n# mypy: allow-any-generics' "${base}_pb2.pyi"
  "$PY" -m ruff format -q "${outputs[@]}"
  echo "generated: ${outputs[*]}"
done
