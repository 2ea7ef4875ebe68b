#!/bin/bash
# Build the Debian bookworm guest used by the VM tests (tests/guest/vm.py).
#
# Output, in ${ORION_GUEST_DIR:-/var/tmp/orion-guest} (never inside the repo):
#   vmlinuz, initrd.img  kernel + initramfs taken from the guest's own linux-image-amd64
#   guest.img            raw ext4 root filesystem (sparse, 1.5 GiB), made with `mkfs.ext4 -d` (no loop mount)
#   stamp                hash of the package list + this script + init.sh; when it matches, nothing is rebuilt
# tests/guest/init.sh is installed as /orion-init (the guest's PID 1, see that file).
# Needs root, debootstrap and e2fsprogs. Env: ORION_GUEST_DIR, ORION_GUEST_MIRROR (default: the URIs line of
# this machine's apt sources), ORION_GUEST_KEEP_ROOTFS=1 keeps the debootstrap tree in $OUT/rootfs.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
OUT=${ORION_GUEST_DIR:-/var/tmp/orion-guest}
PKGS=python3,linux-image-amd64,initramfs-tools,kmod,iproute2,rdma-core,ibverbs-providers,ibverbs-utils,rdmacm-utils,python3-pyverbs,libibverbs1,librdmacm1
SUITE=bookworm
IMG_SIZE=1536M

die() { echo "build-image: ERROR: $*" >&2; exit 1; }
now() { echo "$EPOCHREALTIME"; }
took() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

case "$(realpath -m "$OUT")/" in "$(realpath -m "$HERE/../..")"/*) die "ORION_GUEST_DIR=$OUT is inside the repo";; esac
[ -f "$HERE/init.sh" ] || die "missing $HERE/init.sh"

want=$( { echo "$SUITE $PKGS $IMG_SIZE"; cat "${BASH_SOURCE[0]}" "$HERE/init.sh"; } | sha256sum | cut -d' ' -f1)
ready() { [ -s "$OUT/vmlinuz" ] && [ -s "$OUT/initrd.img" ] && [ -s "$OUT/guest.img" ] \
          && [ "$(cat "$OUT/stamp" 2>/dev/null)" = "$want" ]; }
if ready; then echo "build-image: guest image in $OUT is up to date (stamp ${want:0:12})"; exit 0; fi

[ "$(id -u)" = 0 ] || die "must run as root (debootstrap needs it)"
for t in debootstrap mkfs.ext4 sha256sum flock; do
  command -v "$t" >/dev/null || die "'$t' not found (apt-get install debootstrap e2fsprogs util-linux)"
done
mkdir -p "$OUT"

# One builder at a time; a second caller waits, then finds the stamp written by the first.
exec 9>"$OUT/.lock"
flock 9
if ready; then echo "build-image: guest image in $OUT was built meanwhile (stamp ${want:0:12})"; exit 0; fi

MIRROR=${ORION_GUEST_MIRROR:-$(awk '/^URIs:/ {print $2; exit} /^deb / {print $2; exit}' \
        /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null || true)}
[ -n "$MIRROR" ] || die "no Debian mirror found in /etc/apt/sources*; set ORION_GUEST_MIRROR"

R=$OUT/rootfs
LOG=$OUT/debootstrap.log
rm -f "$OUT/stamp"
rm -rf "$R"
T0=$(now)
echo "build-image: debootstrap $SUITE from $MIRROR into $R (log: $LOG)"
t=$(now)
# About 100 s: a line every 10 s says how far it got (its log's last line), so the wait is never silent.
debootstrap --variant=minbase --include="$PKGS" "$SUITE" "$R" "$MIRROR" >"$LOG" 2>&1 &
pid=$!
next=10
while kill -0 "$pid" 2>/dev/null; do
  sleep 1
  if kill -0 "$pid" 2>/dev/null && [ "$(took "$t" | cut -d. -f1)" -ge "$next" ]; then
    echo "build-image: debootstrap running for $next s: $(tail -n 1 "$LOG" | cut -c1-100)"
    next=$((next + 10))
  fi
done
wait "$pid" || die "debootstrap failed, see $LOG (last lines: $(tail -n 3 "$LOG" | tr '\n' ' '))"
echo "PHASE debootstrap: $(took "$t") s"

t=$(now)
install -m 0755 "$HERE/init.sh" "$R/orion-init"
mkdir -p "$R/mnt/orion"
echo orion-guest > "$R/etc/hostname"
kernel=$(ls "$R"/boot/vmlinuz-* 2>/dev/null | sort -V | tail -n 1)
initrd=$(ls "$R"/boot/initrd.img-* 2>/dev/null | sort -V | tail -n 1)
[ -n "$kernel" ] && [ -n "$initrd" ] || die "no kernel/initrd in $R/boot after debootstrap, see $LOG"
cp "$kernel" "$OUT/vmlinuz.tmp"; cp "$initrd" "$OUT/initrd.img.tmp"
rm -f "$OUT/guest.img.tmp"; truncate -s "$IMG_SIZE" "$OUT/guest.img.tmp"
mkfs.ext4 -q -F -L orion-root -d "$R" "$OUT/guest.img.tmp" >"$OUT/mkfs.log" 2>&1 \
  || die "mkfs.ext4 failed, see $OUT/mkfs.log"
for f in vmlinuz initrd.img guest.img; do mv -f "$OUT/$f.tmp" "$OUT/$f"; done
echo "PHASE mkfs: $(took "$t") s ($(du -h "$OUT/guest.img" | cut -f1) used of $IMG_SIZE, kernel $(basename "$kernel"))"

[ "${ORION_GUEST_KEEP_ROOTFS:-0}" = 1 ] || rm -rf "$R"
echo "$want" > "$OUT/stamp"
echo "build-image: done in $(took "$T0") s -> $OUT"
