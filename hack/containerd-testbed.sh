#!/usr/bin/env bash
# A private, real containerd for tests and benches (DESIGN §5): its own root/state/socket, a CNI
# bridge, small images built from busybox-static, and a local registry on 127.0.0.1.
#
#   hack/containerd-testbed.sh start   [DIR]   start everything; prints the environment (KEY=VALUE lines)
#   hack/containerd-testbed.sh stop    [DIR]   kill every container, stop the daemons, unmount, remove DIR
#   hack/containerd-testbed.sh env     [DIR]   print the environment of a running testbed
#   hack/containerd-testbed.sh restart-containerd [DIR]   SIGKILL containerd and start it again (state kept)
#   hack/containerd-testbed.sh stop-containerd|start-containerd [DIR]   the two halves of restart
#   hack/containerd-testbed.sh framework-image [DIR]   build and load the orchestrator's framework
#                                                      stand-in image (hack/table1.py); prints its name
#   hack/containerd-testbed.sh launcher-image [DIR]    build and load the real launchers' image
#                                                      (hack/real_launchers.py); prints its name
#
# DIR defaults to $FLEXLEASE_TESTBED_DIR or /tmp/flexlease-testbed. Runs as root; installs
# containerd runc containernetworking-plugins busybox-static docker-registry skopeo when missing
# (Debian). Environment printed by start/env:
#   FLEXLEASE_TESTBED_DIR, FLEXLEASE_CRI_ENDPOINT (unix://DIR/containerd.sock),
#   FLEXLEASE_TESTBED_REGISTRY (127.0.0.1:PORT), FLEXLEASE_TESTBED_PAUSE_IMAGE,
#   FLEXLEASE_TESTBED_TRAINER_V1, FLEXLEASE_TESTBED_TRAINER_V2 (loaded locally),
#   FLEXLEASE_TESTBED_TRAINER_BROKEN (loaded locally; its entrypoint does not exist, so every
#   start fails: CRI StartContainer errors and the container ends Exited, code 128,
#   reason StartError), FLEXLEASE_TESTBED_TRAINER_NOCMD (loaded locally; no entrypoint and no
#   command: CRI CreateContainer fails, "no command specified"),
#   FLEXLEASE_TESTBED_LARGE_IMAGE (only in the registry; its own random layer of
#   FLEXLEASE_TESTBED_LARGE_MIB MiB, default 64), FLEXLEASE_TESTBED_REGISTRY_TRAINER (trainer v1,
#   only in the registry: pulled, it has a repo digest), FLEXLEASE_TESTBED_CNI_SUBNET,
#   FLEXLEASE_TESTBED_CGROUP_PARENT.
# Images: each trainer image runs `sh -c 'trap "exit 0" TERM; ...; sleep & wait'`, writes
# /etc/trainer-version (v1, v2, large) and exits promptly on SIGTERM.
set -euo pipefail

cmd=${1:-}
DIR=${2:-${FLEXLEASE_TESTBED_DIR:-/tmp/flexlease-testbed}}
LARGE_MIB=${FLEXLEASE_TESTBED_LARGE_MIB:-64}
SOCK="$DIR/containerd.sock"
NS=k8s.io
PAUSE_IMAGE=localhost/flexlease/pause:1
TRAINER_V1=localhost/flexlease/trainer:v1
TRAINER_V2=localhost/flexlease/trainer:v2
TRAINER_BROKEN=localhost/flexlease/trainer:broken
TRAINER_NOCMD=localhost/flexlease/trainer:nocmd
FRAMEWORK_IMAGE=localhost/flexlease/framework:v1
LAUNCHER_IMAGE=localhost/flexlease/launcher:v1

die() { echo "containerd-testbed: $*" >&2; exit 1; }
log() { echo "containerd-testbed: $*" >&2; }

need_root() { [ "$(id -u)" = 0 ] || die "must run as root (containerd, CNI and mounts need it)"; }

install_missing() {
  local need=()
  local pair
  for pair in containerd:containerd ctr:containerd runc:runc busybox:busybox-static \
              docker-registry:docker-registry skopeo:skopeo ip:iproute2 python3:python3; do
    command -v "${pair%%:*}" >/dev/null 2>&1 || need+=("${pair#*:}")
  done
  [ -x /usr/lib/cni/bridge ] && [ -x /usr/lib/cni/host-local ] && [ -x /usr/lib/cni/loopback ] \
    || need+=(containernetworking-plugins)
  # busybox (dynamic) may be on PATH while the static binary we copy into images is not.
  [ -n "$(static_busybox)" ] || need+=(busybox-static)
  if [ ${#need[@]} -gt 0 ]; then
    log "apt-get install ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2
    apt-get install -y -qq --no-install-recommends "${need[@]}" >&2
  fi
}

static_busybox() {
  local b
  for b in /bin/busybox /usr/bin/busybox; do
    if [ -x "$b" ] && ! (command -v ldd >/dev/null && ldd "$b" >/dev/null 2>&1); then
      echo "$b"; return
    fi
  done
}

# Deterministic per-DIR names so two testbeds (different DIRs) never share a bridge or subnet.
dir_hash() { printf '%s' "$DIR" | sha256sum | cut -c1-8; }

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

write_containerd_config() {
  local port=$1 subnet=$2 bridge=$3 net=$4
  mkdir -p "$DIR/root" "$DIR/state" "$DIR/cni" "$DIR/cni-ipam" "$DIR/opt" "$DIR/logs"
  cat >"$DIR/cni/10-flexlease.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "$net",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$bridge",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": false,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "$subnet"}]],
        "dataDir": "$DIR/cni-ipam"
      }
    }
  ]
}
EOF
  cat >"$DIR/config.toml" <<EOF
version = 2
root = "$DIR/root"
state = "$DIR/state"
oom_score = 0

[grpc]
  address = "$SOCK"

[ttrpc]
  address = "$SOCK.ttrpc"

[debug]
  address = "$DIR/debug.sock"
  level = "info"

[plugins]
  [plugins."io.containerd.internal.v1.opt"]
    path = "$DIR/opt"
  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = "$PAUSE_IMAGE"
    restrict_oom_score_adj = true
    disable_apparmor = true
    netns_mounts_under_state_dir = true
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"
    [plugins."io.containerd.grpc.v1.cri".containerd]
      snapshotter = "overlayfs"
      default_runtime_name = "runc"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
          SystemdCgroup = false
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "/usr/lib/cni"
      conf_dir = "$DIR/cni"
      max_conf_num = 1
    [plugins."io.containerd.grpc.v1.cri".registry.mirrors."127.0.0.1:$port"]
      endpoint = ["http://127.0.0.1:$port"]
EOF
}

start_containerd() {
  rm -f "$SOCK" "$SOCK.ttrpc" "$DIR/debug.sock"
  setsid containerd --config "$DIR/config.toml" >>"$DIR/logs/containerd.log" 2>&1 </dev/null &
  echo $! >"$DIR/containerd.pid"
  local i
  for i in $(seq 1 150); do
    if [ -S "$SOCK" ] && ctr --address "$SOCK" version >/dev/null 2>&1; then
      return 0
    fi
    kill -0 "$(cat "$DIR/containerd.pid")" 2>/dev/null || break
    sleep 0.2
  done
  tail -n 30 "$DIR/logs/containerd.log" >&2 || true
  die "containerd did not come up on $SOCK (log: $DIR/logs/containerd.log)"
}

# docker-archive tarball (the `docker save` layout): manifest.json + config + layer tars.
# Layers are uncompressed tars; names are content digests.
build_image() {
  local out=$1 tag=$2 cmd_json=$3
  shift 3
  local work
  work=$(mktemp -d "$DIR/build.XXXXXX")
  local diff_ids=() layer_paths=() layer
  for layer in "$@"; do
    local sum
    sum=$(sha256sum "$layer" | cut -d' ' -f1)
    mkdir -p "$work/$sum"
    cp "$layer" "$work/$sum/layer.tar"
    diff_ids+=("\"sha256:$sum\"")
    layer_paths+=("\"$sum/layer.tar\"")
  done
  local ids paths
  ids=$(IFS=,; echo "${diff_ids[*]}")
  paths=$(IFS=,; echo "${layer_paths[*]}")
  cat >"$work/config.json" <<EOF
{"architecture":"amd64","os":"linux","created":"1970-01-01T00:00:00Z","config":{"Env":["PATH=/bin"],"Cmd":$cmd_json,"WorkingDir":"/"},"rootfs":{"type":"layers","diff_ids":[$ids]},"history":[]}
EOF
  local csum
  csum=$(sha256sum "$work/config.json" | cut -d' ' -f1)
  mv "$work/config.json" "$work/$csum.json"
  printf '[{"Config":"%s.json","RepoTags":["%s"],"Layers":[%s]}]\n' "$csum" "$tag" "$paths" >"$work/manifest.json"
  tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -cf "$out" -C "$work" .
  rm -rf "$work"
}

layer_tar() {  # layer_tar OUT ROOTFS_DIR
  tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -cf "$1" -C "$2" .
}

build_images() {
  local b img="$DIR/images"
  b=$(static_busybox)
  [ -n "$b" ] || die "no static busybox found (apt-get install busybox-static)"
  mkdir -p "$img/base/bin" "$img/base/etc" "$img/base/tmp" "$img/base/proc" "$img/base/sys" "$img/base/dev"
  cp "$b" "$img/base/bin/busybox"
  local applet
  for applet in sh sleep cat echo ls true wait kill ps mkdir rm test; do
    ln -sf busybox "$img/base/bin/$applet"
  done
  echo "root:x:0:0:root:/:/bin/sh" >"$img/base/etc/passwd"
  echo "root:x:0:" >"$img/base/etc/group"
  layer_tar "$img/base.tar" "$img/base"
  local v
  for v in v1 v2 large; do
    mkdir -p "$img/$v/etc"
    echo "$v" >"$img/$v/etc/trainer-version"
  done
  # The large image carries its own random (incompressible) layer, so a pull moves real bytes.
  mkdir -p "$img/large/data"
  head -c $((LARGE_MIB * 1024 * 1024)) /dev/urandom >"$img/large/data/blob"
  for v in v1 v2 large; do
    layer_tar "$img/$v.tar" "$img/$v"
  done
  local trainer='["sh","-c","trap \"exit 0\" TERM; echo trainer $(cat /etc/trainer-version) started; sleep 100000 & wait"]'
  build_image "$img/pause.tar" "$PAUSE_IMAGE" '["sleep","2147483647"]' "$img/base.tar"
  build_image "$img/trainer-v1.tar" "$TRAINER_V1" "$trainer" "$img/base.tar" "$img/v1.tar"
  build_image "$img/trainer-v2.tar" "$TRAINER_V2" "$trainer" "$img/base.tar" "$img/v2.tar"
  build_image "$img/trainer-broken.tar" "$TRAINER_BROKEN" '["/bin/no-such-entrypoint"]' "$img/base.tar" "$img/v2.tar"
  build_image "$img/trainer-nocmd.tar" "$TRAINER_NOCMD" 'null' "$img/base.tar" "$img/v2.tar"
  build_image "$img/trainer-large.tar" "flexlease/trainer-large:v1" "$trainer" "$img/base.tar" "$img/large.tar"
  rm -rf "$img/base" "$img/v1" "$img/v2" "$img/large" "$img/base.tar" "$img/v1.tar" "$img/v2.tar" "$img/large.tar"
}

load_images() {
  local t
  for t in pause trainer-v1 trainer-v2 trainer-broken trainer-nocmd; do
    ctr --address "$SOCK" -n "$NS" image import "$DIR/images/$t.tar" >/dev/null \
      || die "ctr image import $t.tar failed"
  done
}

start_registry() {
  local port=$1
  mkdir -p "$DIR/registry"
  cat >"$DIR/registry.yml" <<EOF
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: $DIR/registry
  delete:
    enabled: true
http:
  addr: 127.0.0.1:$port
EOF
  setsid docker-registry serve "$DIR/registry.yml" >>"$DIR/logs/registry.log" 2>&1 </dev/null &
  echo $! >"$DIR/registry.pid"
  local i
  for i in $(seq 1 100); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      return 0
    fi
    kill -0 "$(cat "$DIR/registry.pid")" 2>/dev/null || break
    sleep 0.1
  done
  tail -n 20 "$DIR/logs/registry.log" >&2 || true
  die "docker-registry did not listen on 127.0.0.1:$port"
}

push_large() {
  local port=$1
  skopeo copy --quiet --insecure-policy --dest-tls-verify=false \
    "docker-archive:$DIR/images/trainer-large.tar" \
    "docker://127.0.0.1:$port/flexlease/trainer-large:v1" >&2 \
    || die "skopeo copy to the local registry failed"
  skopeo copy --quiet --insecure-policy --dest-tls-verify=false \
    "docker-archive:$DIR/images/trainer-v1.tar" \
    "docker://127.0.0.1:$port/flexlease/trainer:v1" >&2 \
    || die "skopeo copy of trainer v1 to the local registry failed"
}

print_env() {
  [ -f "$DIR/env" ] || die "no testbed in $DIR (run: $0 start $DIR)"
  cat "$DIR/env"
}

kill_pidfile() {  # kill_pidfile FILE SIGNAL
  local f=$1 pid
  [ -f "$f" ] || return 0
  pid=$(cat "$f")
  if kill -0 "$pid" 2>/dev/null; then
    kill "-$2" "$pid" 2>/dev/null || true
    local i
    for i in $(seq 1 50); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$f"
}

cleanup_containers() {
  # Containers left by a test: kill their tasks, free their network namespaces, delete them.
  [ -S "$SOCK" ] || return 0
  ctr --address "$SOCK" version >/dev/null 2>&1 || return 0
  local ids id netns
  ids=$(ctr --address "$SOCK" -n "$NS" containers ls -q 2>/dev/null || true)
  for id in $ids; do
    ctr --address "$SOCK" -n "$NS" tasks kill -a -s SIGKILL "$id" >/dev/null 2>&1 || true
  done
  for id in $ids; do
    netns=$(ctr --address "$SOCK" -n "$NS" containers info "$id" 2>/dev/null \
      | python3 -c 'import json,sys
try:
    spec = json.load(sys.stdin).get("Spec") or {}
except ValueError:
    sys.exit(0)
for ns in (spec.get("linux") or {}).get("namespaces") or []:
    if ns.get("type") == "network" and ns.get("path", "").startswith(("/var/run/netns/", "/run/netns/")):
        print(ns["path"])' || true)
    ctr --address "$SOCK" -n "$NS" tasks delete -f "$id" >/dev/null 2>&1 || true
    ctr --address "$SOCK" -n "$NS" containers delete "$id" >/dev/null 2>&1 || true
    if [ -n "$netns" ]; then
      umount "$netns" 2>/dev/null || true
      rm -f "$netns"
    fi
  done
}

kill_shims() {
  # Shims whose state lives under DIR (containerd exits without killing them).
  local p
  for p in $(pgrep -f "containerd-shim-runc-v2 .*-address $SOCK" || true); do
    kill -KILL "$p" 2>/dev/null || true
  done
}

unmount_under_dir() {
  local m
  # Deepest first.
  for m in $(awk -v d="$DIR/" 'index($2, d) == 1 {print $2}' /proc/mounts | sort -r); do
    umount -l "$m" 2>/dev/null || true
  done
}

do_stop() {
  need_root
  [ -d "$DIR" ] || return 0
  cleanup_containers
  kill_pidfile "$DIR/containerd.pid" TERM
  kill_shims
  kill_pidfile "$DIR/registry.pid" TERM
  local h cg
  h=$(dir_hash)
  ip link del "flb-$h" 2>/dev/null || true
  unmount_under_dir
  for cg in /sys/fs/cgroup/*/flexlease-testbed-"$h" /sys/fs/cgroup/flexlease-testbed-"$h"; do
    [ -d "$cg" ] && find "$cg" -depth -type d -exec rmdir {} \; 2>/dev/null || true
  done
  rm -rf "$DIR"
}

do_start() {
  need_root
  install_missing
  if [ -f "$DIR/env" ]; then
    log "stopping a previous testbed in $DIR"
    do_stop
  fi
  rm -rf "$DIR"
  mkdir -p "$DIR/logs"
  local h port subnet bridge net
  h=$(dir_hash)
  port=$(free_port)
  subnet="10.$((200 + 0x${h:0:2} % 50)).$((0x${h:2:2})).0/24"
  bridge="flb-$h"
  net="flexlease-$h"
  write_containerd_config "$port" "$subnet" "$bridge" "$net"
  build_images
  start_containerd
  load_images
  start_registry "$port"
  push_large "$port"
  local large_bytes
  large_bytes=$(stat -c %s "$DIR/images/trainer-large.tar")
  cat >"$DIR/env" <<EOF
FLEXLEASE_TESTBED_DIR=$DIR
FLEXLEASE_CRI_ENDPOINT=unix://$SOCK
FLEXLEASE_TESTBED_REGISTRY=127.0.0.1:$port
FLEXLEASE_TESTBED_PAUSE_IMAGE=$PAUSE_IMAGE
FLEXLEASE_TESTBED_TRAINER_V1=$TRAINER_V1
FLEXLEASE_TESTBED_TRAINER_V2=$TRAINER_V2
FLEXLEASE_TESTBED_TRAINER_BROKEN=$TRAINER_BROKEN
FLEXLEASE_TESTBED_TRAINER_NOCMD=$TRAINER_NOCMD
FLEXLEASE_TESTBED_LARGE_IMAGE=127.0.0.1:$port/flexlease/trainer-large:v1
FLEXLEASE_TESTBED_REGISTRY_TRAINER=127.0.0.1:$port/flexlease/trainer:v1
FLEXLEASE_TESTBED_LARGE_MIB=$LARGE_MIB
FLEXLEASE_TESTBED_LARGE_ARCHIVE_BYTES=$large_bytes
FLEXLEASE_TESTBED_CNI_SUBNET=$subnet
FLEXLEASE_TESTBED_CGROUP_PARENT=/flexlease-testbed-$h
EOF
  rm -f "$DIR/images/trainer-large.tar"
  print_env
}

do_restart_containerd() {
  need_root
  [ -f "$DIR/env" ] || die "no testbed in $DIR"
  kill_pidfile "$DIR/containerd.pid" KILL
  start_containerd
}

do_stop_containerd() {
  need_root
  [ -f "$DIR/env" ] || die "no testbed in $DIR"
  kill_pidfile "$DIR/containerd.pid" KILL
}

do_start_containerd() {
  need_root
  [ -f "$DIR/env" ] || die "no testbed in $DIR"
  start_containerd
}

# The orchestrator's framework stand-ins (WeFlex Table 1; hack/table1.py): every busybox applet,
# the stand-in launchers (hack/orchestrator/standins) in /bin and a TF start script in /app.
# Entrypoint: framework-boot (the pod's agent comes up after $BOOT_DELAY on 127.0.0.1:$PORT).
do_framework_image() {
  need_root
  [ -f "$DIR/env" ] || die "no testbed in $DIR"
  local b src img="$DIR/images/framework" applet
  src="$(cd "$(dirname "$0")" && pwd)/orchestrator"
  b=$(static_busybox)
  [ -n "$b" ] || die "no static busybox found (apt-get install busybox-static)"
  rm -rf "$img"
  mkdir -p "$img/root/bin" "$img/root/app" "$img/root/etc" "$img/root/tmp" "$img/root/www"
  cp "$b" "$img/root/bin/busybox"
  for applet in $("$b" --list); do
    [ "$applet" = busybox ] || ln -sf busybox "$img/root/bin/$applet"
  done
  install -m 0755 "$src"/standins/* "$img/root/bin/"
  install -m 0755 "$src/app/start.sh" "$img/root/app/start.sh"
  echo "root:x:0:0:root:/:/bin/sh" >"$img/root/etc/passwd"
  echo "root:x:0:" >"$img/root/etc/group"
  layer_tar "$img/layer.tar" "$img/root"
  build_image "$img/framework.tar" "$FRAMEWORK_IMAGE" '["framework-boot"]' "$img/layer.tar"
  ctr --address "$SOCK" -n "$NS" image import "$img/framework.tar" >/dev/null \
    || die "ctr image import framework.tar failed"
  rm -rf "$img"
  echo "FLEXLEASE_TESTBED_FRAMEWORK_IMAGE=$FRAMEWORK_IMAGE"
}

# The real launchers' image (hack/real_launchers.py): an empty merged-/usr root (bin, sbin, lib,
# lib64 point into /usr) whose /usr, /etc and Python come from the host as read-only CRI mounts,
# so Open MPI, mpi4py and Ray run in the pod exactly as installed on the host. Entrypoint: the
# host's sh, idle until SIGTERM.
do_launcher_image() {
  need_root
  [ -f "$DIR/env" ] || die "no testbed in $DIR"
  local img="$DIR/images/launcher" d
  rm -rf "$img"
  mkdir -p "$img/root"
  for d in usr etc tmp root run proc sys dev app opt var/tmp; do mkdir -p "$img/root/$d"; done
  chmod 1777 "$img/root/tmp" "$img/root/var/tmp"
  for d in bin sbin lib lib64; do ln -s "usr/$d" "$img/root/$d"; done
  layer_tar "$img/layer.tar" "$img/root"
  build_image "$img/launcher.tar" "$LAUNCHER_IMAGE" \
    '["/bin/sh","-c","trap \"exit 0\" TERM; sleep infinity & wait"]' "$img/layer.tar"
  ctr --address "$SOCK" -n "$NS" image import "$img/launcher.tar" >/dev/null \
    || die "ctr image import launcher.tar failed"
  rm -rf "$img"
  echo "FLEXLEASE_TESTBED_LAUNCHER_IMAGE=$LAUNCHER_IMAGE"
}

case "$cmd" in
  start) do_start ;;
  stop) do_stop ;;
  env) print_env ;;
  restart-containerd) do_restart_containerd ;;
  stop-containerd) do_stop_containerd ;;
  start-containerd) do_start_containerd ;;
  framework-image) do_framework_image ;;
  launcher-image) do_launcher_image ;;
  *) die "usage: $0 start|stop|env|restart-containerd|stop-containerd|start-containerd|framework-image|launcher-image [DIR]" ;;
esac
