"""The container scenario for real: a client in its own mount, IPC and PID namespaces (what a container
runtime gives it) with a private /dev/shm into which only the region file is bind-mounted (Orion's
per-file container scheme, `-v /dev/shm/orionsockN:/dev/shm/orionsockN`). Podman and Docker cannot run on
our machines, so the namespaces are made with util-linux's unshare, as a runtime would make them.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from ivshmem.channel import Ctrl, HostChannel, HostReason, HostStatus
from ivshmem.region import Region

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                                reason="needs root and util-linux unshare to make the namespaces")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Inside the namespaces: keep the host file reachable, cover /dev/shm with the container's own tmpfs,
# bind the one region file into it, then run the client with the region at its container path.
CONTAINER = r"""
set -e
mount --bind "$REGION" "$STASH"
mount -t tmpfs -o size=4m tmpfs /dev/shm
touch /dev/shm/orionsock0
mount --bind "$STASH" /dev/shm/orionsock0
echo "CONTAINER pid=$$ shm=$(ls /dev/shm)"
exec "$PYTHON" -c "$CLIENT"
"""


def container(region: str, client: str) -> subprocess.Popen[str]:
    fd, stash = tempfile.mkstemp(prefix="orion-container-")
    os.close(fd)
    env = dict(os.environ, REGION=region, STASH=stash, PYTHON=sys.executable, CLIENT=client,
               PYTHONPATH=REPO)
    proc = subprocess.Popen(["unshare", "--mount", "--ipc", "--pid", "--uts", "--fork", "--mount-proc",
                             "--kill-child", "sh", "-c", CONTAINER], env=env, cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    proc.stash = stash  # type: ignore[attr-defined]
    return proc


def finish(proc: subprocess.Popen[str], timeout: float = 60) -> str:
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        os.unlink(proc.stash)  # type: ignore[attr-defined]
    return out


def test_container_client_reaches_the_host_through_a_bind_mounted_region(served_region: str) -> None:
    proc = container(served_region, "from guest_runtime.cli import main; raise SystemExit("
                                    "main(['probe', '--region', '/dev/shm/orionsock0', '--round-trips', '500',"
                                    " '--bulk-mib', '2']))")
    out = finish(proc)
    assert proc.returncode == 0, out
    assert "CONTAINER pid=1 shm=orionsock0" in out  # its own PID namespace and a /dev/shm with our file only
    assert "ORION-PROBE region=/dev/shm/orionsock0 kind=file" in out and "ORION-PROBE ok" in out, out


def test_killed_container_client_is_reclaimed_through_its_lock(served_region: str) -> None:
    client = ("import time; from ivshmem import ClientChannel, Region; "
              "ch = ClientChannel.claim(Region.open('/dev/shm/orionsock0')); "
              "print('CLAIMED', ch.index, flush=True); time.sleep(300)")
    proc = container(served_region, client)
    try:
        assert proc.stdout is not None
        line = ""
        deadline = time.monotonic() + 30
        while "CLAIMED" not in line and time.monotonic() < deadline:
            line = proc.stdout.readline()
        assert "CLAIMED" in line, line
        index = int(line.split()[1])
        with Region.open(served_region) as region:
            channel = HostChannel(region, index)
            assert channel.ctrl[Ctrl.HOST_STATUS] == HostStatus.SERVING
            proc.send_signal(signal.SIGKILL)  # --kill-child takes the whole container down with it
            deadline = time.monotonic() + 10
            while channel.ctrl[Ctrl.HOST_STATUS] == HostStatus.SERVING and time.monotonic() < deadline:
                time.sleep(0.05)
            # the host saw the lock vanish across the PID namespace: immediate, no heartbeat needed
            assert channel.ctrl[Ctrl.HOST_STATUS] == HostStatus.RECLAIMED
            assert channel.ctrl[Ctrl.HOST_REASON] == HostReason.CLIENT_DIED
    finally:
        finish(proc)
