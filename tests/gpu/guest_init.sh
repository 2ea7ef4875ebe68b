#!/bin/busybox sh
# PID 1 of the GPU machine's test guest (the initramfs's /init: tests/gpu/build-guest-bundle.sh packs it).
# Mounts the host's own root filesystem (9p, mount_tag "root", read-only) with the guest's own /dev, /proc, /sys and
# tmpfs /tmp, /run, /dev/shm over it, so the guest runs the host's Python and libraries but sees only its own
# devices: no /dev/nvidia*, only what QEMU gives it (the ivshmem BAR). Then it runs, chrooted there,
#   orion_run=<absolute path of a Python script in the host's filesystem>
#   orion_py=<absolute path of the interpreter>  orion_cwd=<directory>  orion_args=a,b,c (commas: separators)
# with the checkout (9p, mount_tag "repo", read-only) mounted again at orion_cwd, so that a checkout under /tmp,
# which the guest's own /tmp hides, is still there.
# and prints ORION-GUEST-BEGIN / ORION-GUEST-END rc=N on the console before it powers off. Every failure path ends
# in the power-off.
/bin/busybox --install -s /bin
export PATH=/bin

finish() {
    echo "ORION-GUEST-END rc=$1"
    sync
    echo o > /proc/sysrq-trigger
    sleep 30
    exit "$1"
}

mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
echo
echo "ORION-GUEST-BEGIN uptime=$(cut -d' ' -f1 /proc/uptime) kernel=$(uname -r)"

for m in $(cat /modules.order); do
    insmod "/lib/modules/$m" 2>/dev/null || echo "ORION-GUEST-WARN: insmod $m failed"
done
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000,ro,cache=loose root /newroot \
    || { echo "ORION-GUEST-ERROR: could not mount the 9p share 'root'"; finish 99; }
N=/newroot
mount -t devtmpfs dev $N/dev && mkdir -p $N/dev/shm $N/dev/pts && mount -t tmpfs tmpfs $N/dev/shm \
    && mount -t proc proc $N/proc && mount -t sysfs sys $N/sys \
    && mount -t tmpfs tmpfs $N/tmp && mount -t tmpfs tmpfs $N/run \
    || { echo "ORION-GUEST-ERROR: could not mount the guest's own /dev, /proc, /sys, /tmp and /run"; finish 98; }

set -f
run=; py=; cwd=; args=
for w in $(cat /proc/cmdline); do
    case "$w" in
        orion_run=*) run=${w#orion_run=} ;;
        orion_py=*) py=${w#orion_py=} ;;
        orion_cwd=*) cwd=${w#orion_cwd=} ;;
        orion_args=*) args=$(echo "${w#orion_args=}" | tr ',' ' ') ;;
    esac
done
[ -n "$cwd" ] && mkdir -p "$N$cwd" \
    && mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000,ro repo "$N$cwd" \
    || { echo "ORION-GUEST-ERROR: could not mount the 9p share 'repo' at $cwd"; finish 96; }
chroot $N /bin/sh -c "[ -f $run ] && [ -x $py ]" || { echo "ORION-GUEST-ERROR: orion_run=$run or orion_py=$py is missing"; finish 97; }

chroot $N /bin/sh -c "cd $cwd && exec env -i PATH=/usr/local/bin:/usr/bin:/bin HOME=/tmp LANG=C.UTF-8 \
    PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 $py $run $args" < /dev/null
finish $?
