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
# dependencies, as the image's own user; and print each image's user and OCI labels.
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
  buildah inspect --type image --format '{{.OCIv1.Config.User}} {{json .OCIv1.Config.Labels}}' "$image" \
    | sed "s/^/build-images: $name user and labels: /" >&2
done
log "both images import and run"
