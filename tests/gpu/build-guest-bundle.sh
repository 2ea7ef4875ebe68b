#!/bin/bash
# Build what a QEMU guest on the GPU machine needs (tests/gpu/gpu_guest.py boots it; TESTBED.md, "A guest on the
# GPU machine"). That machine has no QEMU, no package registry and no network, so everything travels with the
# working tree (`run`'s carry) from here, built from Debian packages only:
#
#   qemu.tar.xz  qemu/bin/qemu-system-x86_64 of this machine's qemu-system-x86, the libraries `ldd` lists with the
#                loader that runs them (qemu/lib), its firmware (qemu/share) and TCG accelerator module
#                (qemu/modules: Debian's QEMU loads TCG as a module)
#   vmlinuz      Debian's kernel (the package linux-image-amd64 depends on, fetched with apt-get download)
#   initrd.gz    busybox (busybox-static), that kernel's virtio-pci and 9p modules in load order, and
#                tests/gpu/guest_init.sh as /init: it mounts the GPU machine's own root over 9p, read-only
#   stamp        hash of this script, guest_init.sh and the package versions; when it matches nothing is rebuilt
#
# Output: ${ORION_GPU_GUEST_DIR:-<repo>/.gpu-guest} (git-ignored). Needs root, apt-get with package lists,
# qemu-system-x86, cpio and kmod (depmod, modprobe).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
OUT=${ORION_GPU_GUEST_DIR:-$REPO/.gpu-guest}
MODULES="virtio_pci 9pnet_virtio 9p"

die() { echo "build-guest-bundle: ERROR: $*" >&2; exit 1; }
for t in qemu-system-x86_64 apt-get apt-cache dpkg-deb cpio depmod modprobe xz gzip ldd; do
  command -v "$t" >/dev/null || die "'$t' not found (apt-get install qemu-system-x86 cpio kmod xz-utils)"
done
QEMU=$(command -v qemu-system-x86_64)
KPKG=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
[ -n "$KPKG" ] || die "apt-cache knows no linux-image-amd64: run apt-get update"
KVER=${KPKG#linux-image-}
versions="$KPKG=$(apt-cache policy "$KPKG" | awk '/Candidate:/ {print $2}') \
busybox-static=$(apt-cache policy busybox-static | awk '/Candidate:/ {print $2}') \
qemu=$(dpkg-query -W -f '${Version}' qemu-system-x86)"
want=$( { echo "$versions $MODULES"; cat "${BASH_SOURCE[0]}" "$HERE/guest_init.sh"; } | sha256sum | cut -d' ' -f1)
if [ -s "$OUT/qemu.tar.xz" ] && [ -s "$OUT/vmlinuz" ] && [ -s "$OUT/initrd.gz" ] \
   && [ "$(cat "$OUT/stamp" 2>/dev/null)" = "$want" ]; then
  echo "build-guest-bundle: $OUT is up to date (stamp ${want:0:12})"; exit 0
fi

W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
mkdir -p "$OUT"
rm -f "$OUT/stamp"

# --- the kernel and busybox, from the package registry ------------------------------------------------------------
(cd "$W" && apt-get download -q "$KPKG" busybox-static >/dev/null) || die "apt-get download $KPKG busybox-static failed"
dpkg-deb -x "$W/${KPKG}"_*.deb "$W/kernel"
dpkg-deb -x "$W"/busybox-static_*.deb "$W/busybox"
cp "$W/kernel/boot/vmlinuz-$KVER" "$OUT/vmlinuz"

# --- the initramfs: busybox, the modules in the order modprobe would load them, /init -----------------------------
I=$W/initrd
mkdir -p "$I/bin" "$I/lib/modules" "$I/proc" "$I/sys" "$I/dev" "$I/newroot"
cp "$W/busybox/bin/busybox" "$I/bin/busybox"
depmod -b "$W/kernel" "$KVER"
: > "$I/modules.order"
for line in $(modprobe -d "$W/kernel" -S "$KVER" --show-depends -a $MODULES | awk '$1 == "insmod" {print $2}'); do
  name=$(basename "$line")
  grep -qx "$name" "$I/modules.order" && continue
  case "$name" in
    *.ko.xz) xz -dc "$line" > "$I/lib/modules/${name%.xz}"; name=${name%.xz} ;;
    *) cp "$line" "$I/lib/modules/$name" ;;
  esac
  echo "$name" >> "$I/modules.order"
done
install -m 0755 "$HERE/guest_init.sh" "$I/init"
(cd "$I" && find . | cpio -o -H newc --quiet | gzip -9) > "$OUT/initrd.gz"

# --- QEMU with everything it loads, started through its own loader there --------------------------------------------
Q=$W/qemu
mkdir -p "$Q/bin" "$Q/lib" "$Q/share" "$Q/modules"
cp "$QEMU" "$Q/bin/qemu-system-x86_64"
TCG=/usr/lib/x86_64-linux-gnu/qemu/accel-tcg-x86_64.so
[ -f "$TCG" ] || die "$TCG not found (Debian's qemu-system-x86 ships TCG as a module)"
cp "$TCG" "$Q/modules/"
for lib in $(ldd "$QEMU" "$TCG" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\/lib/ {print $1}' | sort -u); do
  cp -L "$lib" "$Q/lib/"
done
for fw in bios-256k.bin kvmvapic.bin linuxboot_dma.bin; do
  src=
  for dir in /usr/share/qemu /usr/share/seabios; do [ -f "$dir/$fw" ] && { src=$dir/$fw; break; }; done
  [ -n "$src" ] || die "firmware $fw not found under /usr/share/qemu or /usr/share/seabios"
  cp -L "$src" "$Q/share/"
done
tar -C "$W" -cJf "$OUT/qemu.tar.xz" qemu

echo "$want" > "$OUT/stamp"
echo "build-guest-bundle: $OUT: kernel $KVER, modules $(tr '\n' ' ' < "$I/modules.order")"
du -sh "$OUT"/qemu.tar.xz "$OUT"/vmlinuz "$OUT"/initrd.gz
