#!/usr/bin/env bash
# Build the two Kubernetes images with buildah, without a container registry:
#   sudo bash deploy/kubernetes/build-images.sh
#     localhost/orion-vgpu:<release>    deploy/kubernetes/Dockerfile: etcd, orion-controller, oriond, orion-k8s-plugin,
#                                       and oriond's compiled hot path and relay pump in /opt/orion/native
#     localhost/orion-client:<release>  deploy/kubernetes/client.Dockerfile: a program's image with orion-guest
# <release> is ivshmem/shared/version.py's. The images stay in buildah's local storage; to publish one:
#   buildah push orion-vgpu:<release> docker://REGISTRY/orion-vgpu:<release>
# The Dockerfiles start FROM debian:12-slim. Taken from local storage when there; else pulled, and where no registry
# answers, made: debootstrap --variant=minbase bookworm from this machine's apt mirror, trimmed as the official slim
# image is, and committed as docker.io/library/debian:12-slim with a stamp label (a hash of how it was made); a later
# run reuses it while the stamp matches. The builds fetch from the apt mirror and PyPI only (--pull=never).
# Isolation chroot (no daemon, no OCI runtime); storage driver overlay where it mounts here, else vfs. Logs and the
# debootstrap tree in ${ORION_IMAGES_WORK:-/var/tmp/orion-k8s-images}, never in the repo.
# Needs root, buildah and debootstrap (setup.sh installs both). Env: ORION_BASE_MIRROR (default: the URIs line of
# this machine's apt sources, as tests/guest/build-image.sh), ORION_BASE_PULL=0 (do not try a registry for the base),
# ORION_BUILDAH_DRIVER (overlay or vfs: skip the probe).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
WORK=${ORION_IMAGES_WORK:-/var/tmp/orion-k8s-images}
SUITE=bookworm
BASE=docker.io/library/debian:12-slim
STAMP_LABEL=org.orion-vgpu.base-stamp
PROGRESS_S=10

say() { echo "build-images: $*"; }
die() { echo "build-images: ERROR: $*" >&2; exit 1; }
now() { echo "$EPOCHREALTIME"; }
took() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

# A log's last line, printable ASCII only (no progress bars' carriage returns, no multibyte character cut in two).
last_line() { tail -n 1 "$1" | LC_ALL=C tr -cd '[:print:]' | cut -c1-100; }

# Run "$@" with its output in the log $2, saying every 10 s how far it got (the log's last line): never a silent wait.
watched() {
  local what=$1 log=$2 t pid next=$PROGRESS_S
  shift 2
  t=$(now)
  "$@" >"$log" 2>&1 &
  pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    sleep 1
    if kill -0 "$pid" 2>/dev/null && [ "$(took "$t" | cut -d. -f1)" -ge "$next" ]; then
      say "$what running for $next s: $(last_line "$log")"
      next=$((next + PROGRESS_S))
    fi
  done
  wait "$pid"
}

# --- preconditions ---------------------------------------------------------------------------------------------------
[ "$(id -u)" = 0 ] || die "run as root (sudo bash $0): buildah's chroot builds and debootstrap need it"
command -v buildah >/dev/null || die "buildah not found: apt-get install buildah (or run sudo ./setup.sh --no-demo)"
for t in python3 sha256sum flock tar; do command -v "$t" >/dev/null || die "'$t' not found"; done
VERSION=$(python3 -c 'import runpy, sys; print(runpy.run_path(sys.argv[1])["VERSION"])' \
          "$REPO/ivshmem/shared/version.py") || die "cannot read the release from ivshmem/shared/version.py"
mkdir -p "$WORK"
# One builder at a time (a person's run and the test's); a second waits for the first.
exec 9>"$WORK/.lock"
flock 9
export BUILDAH_ISOLATION=chroot
T0=$(now)

# The storage driver: the store's own once it holds images; on a fresh one overlay if a scratch container mounts
# with it (tried in a throw-away store, so that a failure leaves the real one untouched), else vfs.
overlay_mounts() {
  local probe ctr ok=1
  probe=$(mktemp -d "$WORK/overlay-probe.XXXXXX")
  in_probe() { buildah --root "$probe/root" --runroot "$probe/run" --storage-driver overlay "$@" 2>/dev/null; }
  if ctr=$(in_probe from scratch); then
    in_probe mount "$ctr" >/dev/null && ok=0
    in_probe rm "$ctr" >/dev/null || true
  fi
  umount -R "$probe/root" 2>/dev/null || true
  rm -rf "$probe"
  return "$ok"
}
if [ -n "${ORION_BUILDAH_DRIVER:-}" ]; then
  STORAGE_DRIVER=$ORION_BUILDAH_DRIVER
else
  STORAGE_DRIVER=$(buildah info --format '{{.store.GraphDriverName}}') || die "buildah info failed: is /var/lib/containers usable?"
  images=$(buildah info --format '{{.store.ImageStore.number}}')
  if [ "$STORAGE_DRIVER" = overlay ] && [ "$images" = 0 ] && ! overlay_mounts; then STORAGE_DRIVER=vfs; fi
fi
export STORAGE_DRIVER  # buildah's own variable: every buildah below, and the test's, use this driver
say "release $VERSION, storage driver: $STORAGE_DRIVER, isolation chroot, work dir $WORK"

# --- the base image --------------------------------------------------------------------------------------------------
MIRROR=${ORION_BASE_MIRROR:-$(awk '/^URIs:/ {print $2; exit} /^deb / {print $2; exit}' \
        /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null || true)}
SECURITY=$(awk '/^URIs:/ && /debian-security/ {print $2; exit} /^deb / && /debian-security/ {print $2; exit}' \
           /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null || true)

make_base() {
  local root=$WORK/rootfs log=$WORK/debootstrap.log ctr t
  command -v debootstrap >/dev/null || die "debootstrap not found: apt-get install debootstrap"
  [ -n "$MIRROR" ] || die "no Debian mirror found in /etc/apt/sources*; set ORION_BASE_MIRROR"
  rm -rf "$root" "$WORK/rootfs.tar"
  say "making $BASE: debootstrap --variant=minbase $SUITE from $MIRROR (log: $log)"
  t=$(now)
  watched debootstrap "$log" debootstrap --variant=minbase "$SUITE" "$root" "$MIRROR" \
    || die "debootstrap failed, see $log (last lines: $(tail -n 3 "$log" | tr '\n' ' '))"
  echo "PHASE debootstrap: $(took "$t") s"
  t=$(now)
  # As the official slim image: the release, its updates and security as apt sources; no documentation, manual pages
  # or translations (now or from later installs); no apt caches or lists.
  rm -f "$root/etc/apt/sources.list"
  printf 'Types: deb\nURIs: %s\nSuites: %s %s-updates\nComponents: main\nSigned-By: %s\n' \
    "$MIRROR" "$SUITE" "$SUITE" /usr/share/keyrings/debian-archive-keyring.gpg > "$root/etc/apt/sources.list.d/debian.sources"
  if [ -n "$SECURITY" ]; then
    printf '\nTypes: deb\nURIs: %s\nSuites: %s-security\nComponents: main\nSigned-By: %s\n' \
      "$SECURITY" "$SUITE" /usr/share/keyrings/debian-archive-keyring.gpg >> "$root/etc/apt/sources.list.d/debian.sources"
  fi
  printf '%s\n' 'path-exclude /usr/share/doc/*' 'path-include /usr/share/doc/*/copyright' \
    'path-exclude /usr/share/man/*' 'path-exclude /usr/share/info/*' 'path-exclude /usr/share/locale/*' \
    'path-include /usr/share/locale/locale.alias' > "$root/etc/dpkg/dpkg.cfg.d/slim"
  echo 'Acquire::Languages "none";' > "$root/etc/apt/apt.conf.d/slim-no-languages"
  find "$root/usr/share/doc" -mindepth 1 ! -type d ! -name copyright -delete
  rm -rf "$root"/usr/share/{man,info}/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb \
         "$root"/var/lib/apt/lists/* "$root"/var/log/*.log
  find "$root/usr/share/locale" -mindepth 1 -maxdepth 1 ! -name locale.alias -exec rm -rf {} +
  tar --numeric-owner --xattrs -C "$root" --exclude='./dev/*' --exclude='./proc/*' --exclude='./sys/*' \
      --exclude='./run/*' --exclude='./tmp/*' -cf "$WORK/rootfs.tar" .
  ctr=$(buildah from scratch)
  buildah add --quiet "$ctr" "$WORK/rootfs.tar" / >/dev/null
  buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --cmd bash \
    --label "$STAMP_LABEL=$1" "$ctr"
  buildah commit --quiet --rm "$ctr" "$BASE" >/dev/null
  rm -rf "$root" "$WORK/rootfs.tar"
  echo "PHASE commit base: $(took "$t") s ($(buildah images --format '{{.Size}}' "$BASE"))"
}

# The stamp: what makes the base (this function, the suite, the mirrors), never the rest of this script.
want=$( { echo "$SUITE $MIRROR $SECURITY"; declare -f make_base; } | sha256sum | cut -c1-16)
have=$(buildah inspect --type image --format "{{index .OCIv1.Config.Labels \"$STAMP_LABEL\"}}" "$BASE" 2>/dev/null) \
  || have=absent
case "$have" in
  "$want") say "base $BASE made here is up to date (stamp $want)" ;;
  ""|"<no value>") say "base $BASE is in local storage (not made here): using it" ;;
  absent)
    if [ "${ORION_BASE_PULL:-1}" != 0 ] && timeout 120 buildah pull --quiet "$BASE" >"$WORK/pull.log" 2>&1; then
      say "base $BASE pulled from its registry"
    else
      [ "${ORION_BASE_PULL:-1}" = 0 ] || say "base $BASE cannot be pulled ($(last_line "$WORK/pull.log"))"
      make_base "$want"
    fi ;;
  *) say "base $BASE was made by another recipe (stamp $have, now $want): making it again"; make_base "$want" ;;
esac

# --- the two images --------------------------------------------------------------------------------------------------
# pip in the builds trusts what this host trusts (a host behind a TLS-inspecting proxy has its own CA): this host's CA
# bundle, mounted read-only on the base's empty /mnt for the RUN steps only, named by the Dockerfiles' ARG PIP_CERT.
# Nothing of it is committed (no mount point is made: /mnt is there).
TRUST=()
HOST_CA=/etc/ssl/certs/ca-certificates.crt
if [ -s "$HOST_CA" ]; then
  mkdir -p "$WORK/build-ca"
  cp "$HOST_CA" "$WORK/build-ca/host-ca.crt"
  TRUST=(--volume "$WORK/build-ca:/mnt:ro" --build-arg PIP_CERT=/mnt/host-ca.crt)
fi

build_image() {
  local name=$1 file=$2 tag=localhost/$1:$VERSION log=$WORK/$1.log t old new
  old=$(buildah images --noheading --no-trunc --format '{{.ID}}' "$tag" 2>/dev/null || true)
  say "building $tag from deploy/kubernetes/$file (log: $log)"
  t=$(now)
  watched "build of $name" "$log" buildah bud --pull=never --layers=false --force-rm "${TRUST[@]}" -f "$HERE/$file" \
    --ignorefile "$HERE/$file.dockerignore" -t "$tag" "$REPO" \
    || die "building $tag failed at $(grep -E '^STEP|^\[' "$log" | tail -n 1 | cut -c1-100); see $log"
  new=$(buildah images --noheading --no-trunc --format '{{.ID}}' "$tag")
  # The image this tag named before, now unnamed: removed, with the build stages only it used.
  if [ -n "$old" ] && [ "$old" != "$new" ]; then buildah rmi "$old" >/dev/null 2>&1 || true; fi
  echo "PHASE $name: $(took "$t") s ($tag, $(buildah images --format '{{.Size}}' "$tag"))"
}
build_image orion-vgpu Dockerfile
build_image orion-client client.Dockerfile
say "done in $(took "$T0") s: localhost/orion-vgpu:$VERSION, localhost/orion-client:$VERSION"
