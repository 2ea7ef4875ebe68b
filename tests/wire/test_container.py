"""The container scenario for real, with docs/containers.md's recipe: each container gets its own region,
created with `orion-shm create --owner UID` for the container's uid (mode 0600), and only that file is
bind-mounted into the container's private /dev/shm (never `--ipc host`); the client finds it through
ORION_SHM. A container is a client in its own mount, IPC and PID namespaces (what a container runtime gives
it), running as its own uid. Podman and Docker cannot run on our machines, so the namespaces are made with
util-linux's unshare and the uid is dropped with setpriv, as a runtime would do.

No chroot: the host's file system stays visible in these containers, which is the harsh case for the second
line of defence: a container that can see another tenant's region file (as with `--ipc host`) still cannot
open it, because the file is that tenant's alone.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ivshmem.channel import Ctrl, HostChannel, HostReason, HostStatus
from ivshmem.region import Region
from tests.conftest import ServerProcess

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("setpriv") is None,
    reason="needs root, util-linux unshare and setpriv to make the namespaces and drop to the tenant's uid")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TENANTS = (4242, 4343)  # the containers' uids: they need not exist on the host
# Inside the namespaces: keep the host file reachable, optionally show the host's region directory (what
# `--ipc host` would show), cover /dev/shm with the container's own tmpfs, bind the one region file into it,
# then run the client as the tenant's uid.
CONTAINER = r"""
set -e
mount --bind "$REGION" "$STASH"
if [ -n "$HOST_VIEW" ]; then mount --bind "$REGION_DIR" "$HOST_VIEW"; fi
mount -t tmpfs -o size=4m tmpfs /dev/shm
touch /dev/shm/orionsock0
mount --bind "$STASH" /dev/shm/orionsock0
echo "CONTAINER pid=$$ shm=$(ls /dev/shm)"
exec setpriv --reuid "$TENANT" --regid "$TENANT" --clear-groups --pdeathsig keep "$PYTHON" -c "$CLIENT"
"""


@pytest.fixture
def region_dir(open_shm_dir: Path) -> Path:
    """The tenants' regions' directory: others may enter it, so that only the files' own modes keep tenants
    apart."""
    return open_shm_dir


@pytest.fixture
def tenant_regions(region_dir: Path, server_factory: Callable[..., ServerProcess]) -> list[str]:
    """One served region per tenant, made as docs/containers.md says: `orion-shm create -i N --owner UID`."""
    paths = []
    for index, uid in enumerate(TENANTS):
        made = subprocess.run([sys.executable, "-m", "host_agent.admin.shm_cli", "create", "-i", str(index), "-s", "32",
                               "-d", str(region_dir), "--owner", str(uid)], cwd=REPO, capture_output=True,
                              text=True, timeout=60)
        assert made.returncode == 0 and made.stderr == "", made.stderr
        path = region_dir / f"orionsock{index}"
        st = path.stat()
        assert (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (uid, uid, 0o600)
        server_factory(str(path))
        paths.append(str(path))
    return paths


def container(region: str, tenant: int, client: str, host_view: str = "") -> subprocess.Popen[str]:
    fd, stash = tempfile.mkstemp(prefix="orion-container-")
    os.close(fd)
    env = dict(os.environ, REGION=region, REGION_DIR=os.path.dirname(region), STASH=stash, HOST_VIEW=host_view,
               TENANT=str(tenant), PYTHON=sys.executable, CLIENT=client, PYTHONPATH=REPO,
               PYTHONDONTWRITEBYTECODE="1", ORION_SHM="/dev/shm/orionsock0")
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


PROBE = ("from guest_runtime.cli import main; raise SystemExit(main(['probe', '--round-trips', '500', "
         "'--bulk-mib', '2']))")  # no --region: the runtime finds its region through ORION_SHM


def test_each_container_reaches_the_host_through_its_own_region(tenant_regions: list[str]) -> None:
    procs = [container(path, uid, PROBE) for path, uid in zip(tenant_regions, TENANTS, strict=True)]
    outs = [finish(proc) for proc in procs]
    for proc, out in zip(procs, outs, strict=True):
        assert proc.returncode == 0, out
        assert "CONTAINER pid=1 shm=orionsock0" in out  # its own PID namespace and a /dev/shm with its file only
        assert "ORION-PROBE region=/dev/shm/orionsock0 kind=file" in out and "ORION-PROBE ok" in out, out


@pytest.fixture
def host_view() -> Iterator[str]:
    """An empty directory any uid can reach (/tmp/...: pytest's tmp_path is root's alone), for a mount point."""
    view = tempfile.mkdtemp(prefix="orion-host-view-", dir="/tmp")
    os.chmod(view, 0o755)
    try:
        yield view
    finally:
        os.rmdir(view)


def test_a_container_cannot_open_another_tenants_region(tenant_regions: list[str], host_view: str) -> None:
    own, other = tenant_regions
    view = host_view  # where the container also sees the host's region directory, as with --ipc host
    client = f"""
from ivshmem.errors import WireError
from ivshmem.region import Region

def attempt(label, path):
    try:
        Region.open(path).close()
        print(label, "OPENED", flush=True)
    except WireError as exc:
        print(label, "REFUSED", exc, flush=True)

attempt("OWN", "/dev/shm/orionsock0")
attempt("OTHER-IN-SHM", "/dev/shm/{os.path.basename(other)}")
attempt("OTHER-IN-HOST-VIEW", "{view}/{os.path.basename(other)}")
attempt("OWN-IN-HOST-VIEW", "{view}/{os.path.basename(own)}")
"""
    proc = container(own, TENANTS[0], client, host_view=str(view))
    out = finish(proc)
    assert proc.returncode == 0, out
    lines = {line.split()[0]: line for line in out.splitlines() if line.startswith(("OWN", "OTHER"))}
    assert lines["OWN"] == "OWN OPENED", out
    # the bind mount: nothing but its own file is in the container's /dev/shm
    assert "REFUSED" in lines["OTHER-IN-SHM"] and "does not exist" in lines["OTHER-IN-SHM"], out
    # the owner and mode: even where the other region's file is visible, its tenant alone can open it
    assert "REFUSED" in lines["OTHER-IN-HOST-VIEW"] and "Permission denied" in lines["OTHER-IN-HOST-VIEW"], out
    assert lines["OWN-IN-HOST-VIEW"] == "OWN-IN-HOST-VIEW OPENED", out


def test_killed_container_client_is_reclaimed_through_its_lock(tenant_regions: list[str]) -> None:
    region_path = tenant_regions[0]
    client = ("import time; from ivshmem import ClientChannel, Region; "
              "ch = ClientChannel.claim(Region.discover()); "
              "print('CLAIMED', ch.index, flush=True); time.sleep(300)")
    proc = container(region_path, TENANTS[0], client)
    try:
        assert proc.stdout is not None
        line = ""
        deadline = time.monotonic() + 30
        while "CLAIMED" not in line and time.monotonic() < deadline:
            line = proc.stdout.readline()
        assert "CLAIMED" in line, line
        index = int(line.split()[1])
        with Region.open(region_path) as region:
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
