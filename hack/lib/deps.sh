# Sourced by hack/test.sh and hack/local-up.sh: install what flexlease needs on a fresh Debian
# with Python 3.11. apt-get runs only as root and only for tools that are missing.
install_deps() {
  local py=${PYTHON:-python3}
  if [ "$(id -u)" = 0 ]; then
    local need=() pair
    for pair in containerd:containerd runc:runc busybox:busybox-static docker-registry:docker-registry \
                skopeo:skopeo promtool:prometheus openssl:openssl ip:iproute2 unshare:util-linux \
                nats-server:nats-server mpirun:openmpi-bin; do
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
  "$py" -m pip install -q --disable-pip-version-check -e '.[test,sim]'
}
