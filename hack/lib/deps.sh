# Sourced by hack/local-up.sh and hack/test.sh: install what each needs on a fresh Debian with
# Python 3.11 (${PYTHON:-python3}, e.g. a virtualenv's). apt-get runs only as root and only for
# tools that are missing.
#   install_demo_deps   the demo: flexlease and its `demo` extra (pyproject.toml) and nothing
#                       else; the demo's system tools (containerd, runc, CNI plugins,
#                       busybox-static, docker-registry, skopeo, iproute2) are installed by
#                       hack/containerd-testbed.sh when it starts
#   install_test_deps   the test suite: the `test` extra (which includes `demo` and `sim`) and
#                       the system tools the tests start

# apt_install_missing TOOL:PACKAGE...: apt-get install the packages whose tool is missing
# (TOOL: a command on PATH, or an absolute path to an executable).
apt_install_missing() {
  [ "$(id -u)" = 0 ] || return 0
  local need=() pair tool
  for pair in "$@"; do
    tool=${pair%%:*}
    if [ "${tool#/}" != "$tool" ]; then [ -x "$tool" ] && continue
    else command -v "$tool" >/dev/null 2>&1 && continue
    fi
    need+=("${pair#*:}")
  done
  if [ ${#need[@]} -gt 0 ]; then
    echo "== apt-get install ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  fi
}

# pip_install EXTRA: this checkout, editable, with one extra.
pip_install() {
  echo "== pip install -e .[$1]"
  "${PYTHON:-python3}" -m pip install -q --disable-pip-version-check -e ".[$1]"
}

install_demo_deps() {
  pip_install demo
}

install_test_deps() {
  # containerd and its helpers (hack/containerd-testbed.sh would install them too, once per
  # testbed), Prometheus (promtool for the alert rules, prometheus for the dashboard test),
  # openssl (hack/make-certs.sh), unshare, nats-server (streaming staging), Open MPI (real launchers)
  apt_install_missing containerd:containerd runc:runc busybox:busybox-static docker-registry:docker-registry \
    skopeo:skopeo promtool:prometheus prometheus:prometheus openssl:openssl ip:iproute2 unshare:util-linux \
    nats-server:nats-server mpirun:openmpi-bin /usr/lib/cni/bridge:containernetworking-plugins
  pip_install test
}
