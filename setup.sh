#!/usr/bin/env bash
# Set up a fresh Debian 12 machine for Orion vGPU, then run the main job (the KVM demonstration: a libvirt
# guest whose CUDA program reaches the host agent through an ivshmem region).
#   sudo ./setup.sh            install everything, then run the demo
#   sudo ./setup.sh --no-demo  install only (what `make test` and .ci/run use)
# Installs: the apt packages (QEMU, libvirt, etcd, rdma-core/pyverbs, debootstrap, build tools), a virtualenv
# in .venv built on Debian's python3 with the project installed editable plus test tools (and, as
# `pip install ./guest_runtime` leaves a guest, the orion_guest.pth start-up hook), and Debian's pyverbs made
# visible inside it; the project's commands on PATH (links in /usr/local/bin to .venv/bin); /etc/orion/server.conf
# and controller.yaml (documented, every key at its default; never replaced once there) and the oriond and
# orion-controller systemd units (enabled where systemd runs, not started); the libvirt qemu
# hook (orion-hooks install) and the libvirt daemons, started after it; with the demo, the test guest image
# (tests/guest/build-image.sh). Safe to run again: every step checks first.
# Environment: ORION_VENV (default .venv) and ORION_BIN_DIR (default /usr/local/bin) move those two.
set -euo pipefail
cd "$(dirname "$0")"
REPO=$(pwd)
VENV=${ORION_VENV:-$REPO/.venv}
BIN_DIR=${ORION_BIN_DIR:-/usr/local/bin}
USAGE="usage: sudo ./setup.sh [--no-demo]"

step() { printf '\n== %s\n' "$*"; }
die() { echo "setup.sh: $*" >&2; exit 1; }

DEMO=1
case "$*" in
  "") ;;
  --no-demo) DEMO=0 ;;
  -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
  *) echo "setup.sh: unknown argument '$*'; $USAGE (--no-demo: install only)" >&2; exit 2 ;;
esac
timed() { local t0=$SECONDS; "$@"; echo "   ($(( SECONDS - t0 )) s)"; }

[ "$(id -u)" -eq 0 ] || die "run as root (sudo ./setup.sh): it installs apt packages and creates /dev/shm regions"
grep -q 'VERSION_ID="12"' /etc/os-release 2>/dev/null || echo "setup.sh: warning: tested on Debian 12 only" >&2

APT_PACKAGES=(
  make gcc pkg-config curl python3 python3-venv python3-dev
  qemu-system-x86 qemu-utils libvirt-daemon-system libvirt-clients libvirt-daemon-driver-qemu libvirt-dev
  etcd-server etcd-client
  rdma-core ibverbs-providers ibverbs-utils rdmacm-utils python3-pyverbs iproute2
  debootstrap buildah e2fsprogs psmisc procps libxml2-utils
  cpio kmod xz-utils
)

install_apt() {
  local missing=()
  for p in "${APT_PACKAGES[@]}"; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing+=("$p"); done
  if [ ${#missing[@]} -eq 0 ]; then echo "   all ${#APT_PACKAGES[@]} packages present"; return; fi
  echo "   installing ${#missing[@]} packages: ${missing[*]}"
  apt-get update -qq || die "apt-get update failed: check the network and /etc/apt/sources.list*"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/tmp/orion-apt.log 2>&1 \
    || { tail -20 /tmp/orion-apt.log >&2; die "apt-get install failed (full log: /tmp/orion-apt.log)"; }
}

install_venv() {
  # Debian's python3 (3.11) so that Debian's pyverbs extension (built for it) imports inside the venv.
  [ -x "$VENV/bin/python" ] || /usr/bin/python3 -m venv "$VENV" || die "could not create $VENV (is python3-venv installed?)"
  "$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null
  "$VENV/bin/python" -m pip install -q -e "$REPO[test]" || die "pip install of the project failed (see above)"
  # The native guest driver for programs forwarded from this checkout (pip install ./guest_runtime builds its own).
  (cd "$REPO" && "$VENV/bin/python" -m guest_runtime.native.build --driver guest_runtime/native/lib/libcuda.so.1 \
    >/dev/null) && echo "   native guest driver built (guest_runtime/native/lib/libcuda.so.1)" \
    || echo "   warning: the native guest driver was not built; forwarded programs take the capsule path" >&2
  # The host's compiled modules, into the cache oriond loads them from: the session worker's hot path and the relay's
  # pump (host_agent/native_build.py).
  (cd "$REPO" && "$VENV/bin/python" -m host_agent.session.hot_path >/dev/null) \
    && echo "   compiled host hot path built (host_agent/session/hot_dispatch.c)" \
    || echo "   warning: the compiled host hot path was not built; session workers serve every call in Python" >&2
  (cd "$REPO" && "$VENV/bin/python" -m host_agent.relay.compiled_pump >/dev/null) \
    && echo "   compiled relay pump built (host_agent/relay/relay_pump.c)" \
    || echo "   warning: the compiled relay pump was not built; relayed sessions use two Python threads" >&2
  local site; site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  ln -sfn /usr/lib/python3/dist-packages/pyverbs "$site/pyverbs"
  "$VENV/bin/python" -c 'import pyverbs.device' 2>/dev/null && echo "   pyverbs visible in the venv" \
    || echo "   warning: pyverbs does not import in the venv; RDMA will be unavailable" >&2
}

link_commands() {
  # The README's commands on PATH, where an installer puts them: $BIN_DIR/<cmd> -> $VENV/bin/<cmd> for every
  # [project.scripts] entry. Only a link of ours is replaced (to another venv's copy of the same console script,
  # or dangling after that venv went away); any other file of the same name is left alone, with a warning.
  local cmd entry link target current made=0 kept=0
  mkdir -p "$BIN_DIR"
  while read -r cmd entry; do
    target="$VENV/bin/$cmd" link="$BIN_DIR/$cmd"
    [ -x "$target" ] || die "$target is missing after the pip install; run setup.sh again"
    if [ -L "$link" ]; then
      current=$(readlink "$link")
      if [ "$current" = "$target" ]; then kept=$((kept + 1)); continue; fi
      if [ "${current##*/}" != "$cmd" ] \
         || { [ -e "$current" ] && ! grep -qF "from ${entry%%:*} import ${entry##*:}" "$current"; }; then
        echo "   warning: $link -> $current is not an Orion command; left alone ($target is not on PATH)" >&2
        continue
      fi
    elif [ -e "$link" ]; then
      echo "   warning: $link exists and is not ours; left alone ($target is not on PATH)" >&2
      continue
    fi
    ln -sfn "$target" "$link" && made=$((made + 1))
  done < <("$VENV/bin/python" -c 'import sys, tomllib
for name, entry in tomllib.load(open(sys.argv[1], "rb"))["project"]["scripts"].items(): print(name, entry)' \
           "$REPO/pyproject.toml")
  echo "   commands in $BIN_DIR: $made linked, $kept already there (-> $VENV/bin)"
  case ":$PATH:" in *":$BIN_DIR:"*) ;; *) echo "   warning: $BIN_DIR is not on this shell's PATH" >&2 ;; esac
}

must_restart_libvirtd() {
  # libvirtd looks for hooks once, when it starts: `orion-hooks status` says when it started before ours.
  local out; out=$("$VENV/bin/orion-hooks" status 2>/dev/null || true)
  grep -q '^libvirtd: .*restart it' <<<"$out"
}

start_libvirt() {
  "$VENV/bin/orion-hooks" install | sed 's/^/   /'
  if [ -d /run/systemd/system ]; then
    must_restart_libvirtd && { echo "   restarting libvirtd so that it runs the hook"; systemctl restart libvirtd; }
    systemctl start virtlogd libvirtd || die "systemctl could not start virtlogd/libvirtd (journalctl -u libvirtd)"
  else  # no systemd (containers, CI): the daemons run as themselves (libvirtd/virtlogd started directly)
    pgrep -x virtlogd >/dev/null || virtlogd -d || die "virtlogd -d failed"
    local pid; pid=$(pgrep -xo libvirtd || true)
    if [ -n "$pid" ] && must_restart_libvirtd; then
      echo "   restarting libvirtd (pid $pid) so that it runs the hook"
      kill "$pid"
      for _ in $(seq 150); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
      kill -0 "$pid" 2>/dev/null && die "libvirtd (pid $pid) did not stop within 30 s"
    fi
    pgrep -x libvirtd >/dev/null || libvirtd -d || die "libvirtd -d failed"
  fi
  for _ in $(seq 300); do virsh -c qemu:///system version >/dev/null 2>&1 && break; sleep 0.2; done
  virsh -c qemu:///system version >/dev/null 2>&1 || die "libvirtd does not answer on qemu:///system after 60 s"
  local out; out=$("$VENV/bin/orion-hooks" status 2>&1) || die "the Orion qemu hook is not active: $out"
  sed 's/^/   /' <<<"$out"
}

install_services() {
  # Orion's two configuration files, documented and all-default, installed once (an edited one is never replaced).
  local name
  for name in server.conf controller.yaml; do
    if [ -e "/etc/orion/$name" ]; then echo "   /etc/orion/$name kept"
    else install -D -m 0644 "deploy/$name" "/etc/orion/$name" && echo "   /etc/orion/$name installed (every key at its default)"
    fi
  done
  # oriond's server.log and session logs (docs/configuration.md, [server-log]): rotated weekly, kept a month.
  if [ -d /etc/logrotate.d ]; then
    cp deploy/logrotate.conf /etc/logrotate.d/orion && echo "   /etc/logrotate.d/orion installed"
  fi
  # The units, always current: their ExecStart names the commands linked in $BIN_DIR.
  mkdir -p /etc/systemd/system
  for name in oriond orion-controller; do
    sed "s|@BIN@|$BIN_DIR|g" "deploy/systemd/$name.service" > "/etc/systemd/system/$name.service.new"
    mv "/etc/systemd/system/$name.service.new" "/etc/systemd/system/$name.service"
  done
  if [ -d /run/systemd/system ]; then
    systemctl daemon-reload && systemctl enable oriond orion-controller 2>&1 | sed 's/^/   /'
    echo "   units oriond and orion-controller enabled (they start at boot; now: systemctl start oriond orion-controller)"
  else
    echo "   units written to /etc/systemd/system, but this machine does not run systemd: start the services with"
    echo "   '$BIN_DIR/oriond --config /etc/orion/server.conf &' and"
    echo "   '$BIN_DIR/orion-controller start --config-file /etc/orion/controller.yaml &' (etcd first)"
  fi
}

step "apt packages"; timed install_apt
step "python environment ($VENV)"; timed install_venv
step "the project's commands on PATH"; link_commands
mkdir -p /var/log/orion /var/tmp/orion && chmod 777 /var/log/orion /var/tmp/orion
step "the cluster key (docs/security.md)"
if [ -e /etc/orion/cluster.key ]; then echo "   /etc/orion/cluster.key kept"
else
  "$VENV/bin/orion-controller" cluster-key /etc/orion/cluster.key >/dev/null \
    || die "could not write /etc/orion/cluster.key"
  echo "   /etc/orion/cluster.key made (0600): copy it to every host of this cluster"
fi
step "configuration and services: /etc/orion, the oriond and orion-controller units"; install_services
step "libvirt: the Orion qemu hook, then virtlogd and libvirtd"; timed start_libvirt

if [ "$DEMO" = 1 ]; then
  step "guest image (debootstrap once, about 90 s; then reused)"; timed bash tests/guest/build-image.sh
  step "demo: a libvirt guest reaching the host agent through an ivshmem region"
  "$VENV/bin/python" -m tests.guest.kvm_demo
fi
