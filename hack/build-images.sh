#!/usr/bin/env bash
# Build the flexlease images (Dockerfile.extender, Dockerfile.agent) offline, with Debian's
# buildah, from Debian's packages and PyPI's wheels fetched on the build host only:
#   1. wheels:  pip wheel . setuptools -> dist/wheels (every dependency of flexlease, and the
#               setuptools that builds its wheel; the Dockerfiles build flexlease from the source)
#   2. bases:   mmdebstrap bookworm root filesystems -> localhost/flexlease/python:3.11-bookworm
#               (python3 only) and localhost/flexlease/python-build:3.11-bookworm (+ pip, venv)
#   3. images:  buildah build --network none with those bases and wheels as build arguments
#               (PYTHON, PYTHON_BUILD, PIP_NO_INDEX, PIP_FIND_LINKS; VERSION and REVISION for the
#               OCI labels) -> localhost/flexlease/{extender,agent}:TAG, saved as
#               dist/images/{extender,agent}.tar (OCI archives for `ctr image import`, skopeo, podman)
# Without those arguments the Dockerfiles use the public python:3.11-slim-bookworm and PyPI
# (`docker build -f Dockerfile.extender .`); docs/getting-started/images.md.
#
#   hack/build-images.sh [--check] [TAG]    TAG defaults to the project's version (pyproject.toml)
#
# --check: then import both archives into a private containerd (hack/containerd-testbed.sh) and
# run each image's entrypoint with --help, and an import of every flexlease module's
# dependencies, as the image's own user; print each image's user and OCI labels; and run the
# agent for real (simulated GPUs) with a read-only root filesystem until it serves its metrics.
#
# Runs as root (buildah with the vfs storage driver and chroot isolation, so it works inside
# VMs and containers without overlay or user namespaces); installs buildah and mmdebstrap
# when missing. Bases are reused while they exist in buildah's storage.
set -euo pipefail
cd "$(dirname "$0")/.."
CHECK=0
if [ "${1:-}" = --check ]; then CHECK=1; shift; fi
PY=${PYTHON:-python3}
VERSION=$("$PY" -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')
TAG=${1:-$VERSION}
REVISION=$(git rev-parse HEAD 2>/dev/null || echo unknown)
SUITE=bookworm
BASE=localhost/flexlease/python:3.11-$SUITE
BUILD_BASE=localhost/flexlease/python-build:3.11-$SUITE
export STORAGE_DRIVER=vfs BUILDAH_ISOLATION=chroot

log() { echo "build-images: $*" >&2; }
[ "$(id -u)" = 0 ] || { log "must run as root"; exit 1; }
need=()
command -v buildah >/dev/null || need+=(buildah)
command -v mmdebstrap >/dev/null || need+=(mmdebstrap)
if [ ${#need[@]} -gt 0 ]; then
  log "apt-get install ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

log "wheels -> dist/wheels"
rm -rf dist/wheels && mkdir -p dist/wheels dist/images
# setuptools: the build stage builds flexlease's wheel (pyproject's build-system) offline too.
"$PY" -m pip wheel -q --disable-pip-version-check --wheel-dir dist/wheels . 'setuptools>=68'
rm -f dist/wheels/flexlease-*.whl  # the images build flexlease from the source, not this one

# base IMAGE PACKAGES: a Debian root filesystem (minbase + PACKAGES) as a one-layer image.
base() {
  local image=$1 packages=$2 tar ctr
  if buildah inspect --type image "$image" >/dev/null 2>&1; then
    log "$image exists"
    return
  fi
  log "mmdebstrap $SUITE +$packages -> $image"
  tar=$(mktemp --suffix=.tar)
  mmdebstrap --quiet --variant=minbase --include="$packages" \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    "$SUITE" "$tar"
  ctr=$(buildah from scratch)
  buildah add --quiet "$ctr" "$tar" / >/dev/null
  buildah config --env PATH=/usr/sbin:/usr/bin:/sbin:/bin --env LANG=C.UTF-8 --cmd /bin/sh "$ctr"
  buildah commit --quiet --rm "$ctr" "$image" >/dev/null
  rm -f "$tar"
}
base "$BASE" python3
base "$BUILD_BASE" python3,python3-pip,python3-venv

for name in extender agent; do
  log "buildah build Dockerfile.$name -> localhost/flexlease/$name:$TAG"
  buildah build --quiet --network none --layers=false -f "Dockerfile.$name" \
    --build-arg PYTHON="$BASE" --build-arg PYTHON_BUILD="$BUILD_BASE" \
    --build-arg PIP_NO_INDEX=1 --build-arg PIP_FIND_LINKS=/src/dist/wheels \
    --build-arg VERSION="$TAG" --build-arg REVISION="$REVISION" \
    -t "localhost/flexlease/$name:$TAG" . >/dev/null
  rm -f "dist/images/$name.tar"
  buildah push --quiet "localhost/flexlease/$name:$TAG" "oci-archive:dist/images/$name.tar:localhost/flexlease/$name:$TAG"
  log "dist/images/$name.tar ($(du -h "dist/images/$name.tar" | cut -f1))"
done
buildah rmi --prune >/dev/null 2>&1 || true  # earlier builds' images (vfs keeps full copies)

[ "$CHECK" = 1 ] || exit 0
tb=$(mktemp -d /tmp/flexlease-images.XXXXXX)
trap 'bash hack/containerd-testbed.sh stop "$tb" >/dev/null 2>&1 || true' EXIT
bash hack/containerd-testbed.sh start "$tb" >/dev/null
run() { ctr --address "$tb/containerd.sock" -n k8s.io run --rm "$@"; }
for name in extender agent; do
  ctr --address "$tb/containerd.sock" -n k8s.io image import "dist/images/$name.tar" >/dev/null
  image=localhost/flexlease/$name:$TAG
  log "ctr run $image flexlease-$name --help"
  run "$image" "check-$name-help" "flexlease-$name" --help | head -1
  run "$image" "check-$name-user" id -u | sed "s/^/build-images: $name runs as uid /" >&2
  run "$image" "check-$name-imports" python -c \
    'import extender.main, nodeagent.main, flexlease.cri.api_pb2_grpc, pynvml, kubernetes_asyncio, numpy, uvloop'
  buildah inspect --type image "$image" | "$PY" -c 'import json, sys
c = json.load(sys.stdin)["OCIv1"]["config"]
print(c.get("User"), json.dumps(c.get("Labels"), sort_keys=True))' | sed "s/^/build-images: $name user and labels: /" >&2
done

# The agent for real, as its DaemonSet runs it: a read-only root filesystem, the state directory
# (/var/lib/flexlease-agent, a hostPath there) the only writable mount; simulated GPUs and the
# in-memory store, so it needs no cluster. It must serve its metrics with NVML up.
run_dir=$tb/agent-run && mkdir -p "$run_dir/state" "$run_dir/cfg" && chmod 777 "$run_dir/state"
printf 'name: n1\ngpus: {count: 2, model: NVIDIA H20, memoryMiB: 97871}\nevents: []\n' >"$run_dir/cfg/node.yaml"
port=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
log "ctr run --read-only localhost/flexlease/agent:$TAG flexlease-agent (simulated GPUs) on 127.0.0.1:$port"
ctr --address "$tb/containerd.sock" -n k8s.io run --rm --net-host --read-only \
  --mount "type=bind,src=$run_dir/cfg,dst=/cfg,options=rbind:ro" \
  --mount "type=bind,src=$run_dir/state,dst=/var/lib/flexlease-agent,options=rbind:rw" \
  "localhost/flexlease/agent:$TAG" check-agent-run flexlease-agent --nvml=simulated --node-config=/cfg/node.yaml \
  --node-name=n1 --store=memory --metrics-host=127.0.0.1 --metrics-port="$port" >"$run_dir/log" 2>&1 &
agent_pid=$!
up=0
for _ in $(seq 60); do
  if "$PY" -c 'import sys, urllib.request
body = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=1).read().decode()
sys.exit(0 if "flexlease_nvml_up{node=\"n1\"} 1.0" in body else 1)' "$port" 2>/dev/null; then up=1; break; fi
  sleep 0.5
done
ctr --address "$tb/containerd.sock" -n k8s.io task kill check-agent-run >/dev/null 2>&1 || true
wait "$agent_pid" || true
[ "$up" = 1 ] || { tail -20 "$run_dir/log" >&2; log "the agent did not serve its metrics"; exit 1; }
log "the agent ran with a read-only root; it wrote only $(cd "$run_dir/state" && echo *)"
log "both images import and run"
