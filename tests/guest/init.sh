#!/bin/sh
# PID 1 of the test guest (installed as /orion-init by build-image.sh; kernel cmdline init=/orion-init).
# Mounts the host's repo checkout (9p, mount_tag "orion") at /mnt/orion, runs
#   orion_run=<path relative to the checkout>   (.py -> python3, anything else -> sh)
#   orion_args=a,b,c                            (optional; commas become argument separators)
# in /mnt/orion with PYTHONPATH=/mnt/orion, prints ORION-GUEST-BEGIN / ORION-GUEST-END rc=N on the console
# and powers the VM off. It never waits for input: every failure path ends in the power-off.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8

finish() {
    echo "ORION-GUEST-END rc=$1"
    sync
    echo o > /proc/sysrq-trigger
    sleep 30    # the power-off is asynchronous: give it time before falling back to
    exit "$1"   # PID 1 exiting = kernel panic; with panic=1 -no-reboot that also ends QEMU
}

# The initramfs usually hands over /proc, /sys, /dev and /run already mounted: mount only what is missing.
mnt() { mountpoint -q "$3" 2>/dev/null || mount -t "$1" "$2" "$3" || echo "ORION-GUEST-WARN: mount $3 failed"; }
mnt proc proc /proc
mnt sysfs sys /sys
mnt devtmpfs dev /dev
mkdir -p /dev/pts /dev/shm /run /tmp /mnt/orion
mnt devpts devpts /dev/pts
for d in /dev/shm /run /tmp; do mnt tmpfs tmpfs "$d"; done
exec </dev/null

set -f    # no globbing while splitting the command line
run=; args=
for w in $(cat /proc/cmdline); do
    case "$w" in
        orion_run=*)  run=${w#orion_run=} ;;
        orion_args=*) args=$(echo "${w#orion_args=}" | tr ',' ' ') ;;
    esac
done

echo    # the firmware leaves the console mid-line
echo "ORION-GUEST-BEGIN uptime=$(cut -d' ' -f1 /proc/uptime) kernel=$(uname -r) run=$run args=$args"

modprobe 9pnet_virtio && modprobe 9p \
  && mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 orion /mnt/orion \
  || { echo "ORION-GUEST-ERROR: could not mount the 9p share 'orion' at /mnt/orion"; finish 99; }
if [ -z "$run" ] || [ ! -f "/mnt/orion/$run" ]; then
    echo "ORION-GUEST-ERROR: orion_run='$run' is not a file in the checkout"; finish 98
fi

cd /mnt/orion
export PYTHONPATH=/mnt/orion PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
case "$run" in
    *.py) python3 "/mnt/orion/$run" $args ;;
    *)    sh "/mnt/orion/$run" $args ;;
esac
finish $?
