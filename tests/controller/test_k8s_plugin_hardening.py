"""orion-k8s-plugin's region directory against other local users, and Allocate under concurrency (issue 27, item 7).

docs/security.md, *The boundary* and *What each party can and cannot reach*: the plugin's sealed directory is
one no other local user can reach, and a region is only ever made under its own name in that directory. Two
ways that failed:

* the directory under a directory another user can change: that user renames it away and puts one of their
  own in its place, and the next container's region is made where they can read and write it. The plugin must
  refuse such a directory at its start, in one line, and must not follow a directory swapped in after its
  start (it makes regions through the descriptor of the directory it checked, and refuses Allocate once the
  path names another one);
* 200 Allocates at once gave INTERNAL errors: a region was made by unlinking the old file and creating the new
  one under the same name, so two calls for one device raced. Every call must succeed, each answer must name
  its device's region, a whole formatted region, and the directory must hold one region per device and
  nothing else.

The rig is test_k8s_plugin.py's (its kubelet stand-in over the real gRPC API, the plugin as its own process), with
a real controller on a real etcd. The node's vGPUs are registered by the test, signed with the cluster key as its
oriond signs them (the rig's member_client). No oriond runs (Allocate does not need one, and two hundred regions
would be two hundred supervisors): whether oriond would serve each region is asked of oriond's own judge,
host_agent/region_file.py; test_k8s_plugin.py has a real oriond serve one to a container.
"""
from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from host_agent import region_file
from host_agent.k8s.api import pb
from ivshmem.layout import MIB
from ivshmem.region import Region
from tests.conftest import open_directory
from tests.controller.kubelet import Kubelet, Plugin
from tests.controller.rig import REPO, ControllerProcess, free_port, member_client, wait_until
from tests.controller.test_k8s_plugin import GPUS, NODE, healthy, plugin_dir
from tests.processes import python_path

__all__ = ["plugin_dir"]  # test_k8s_plugin's fixture, used here by name

REGION_MIB = 16  # the smallest region orion-shm makes: two hundred of them stay small (sparse files)
VGPUS_PER_GPU = 100  # two GPUs of 100 vGPUs: 200 devices, so 200 containers can each have their own
CONCURRENT = 200
NOBODY_UID = 65534
AS_NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
needs_root = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                                reason="needs root (to give directories to nobody) and util-linux setpriv")


def register_node(ctl: ControllerProcess, vgpu_count: int) -> None:
    """Register NODE's two GPUs as its oriond does: a member-only request, signed with the cluster key."""
    with member_client(ctl.address, NODE) as client:
        client.register_host(NODE, GPUS, vgpu_count=vgpu_count, address=NODE, ttl_s=3600)


def write_conf(path: Path, regions: Path) -> Path:
    path.write_text(f'[server]\n    bind_addr = {NODE}\n[server-shm]\n    shm_path_base = "{regions}/"\n'
                    f"    shm_buffer_size = {REGION_MIB}\n")
    return path


@dataclass
class Node:
    ctl: ControllerProcess
    kubelet: Kubelet
    plugin: Plugin
    regions: Path  # the plugin's sealed directory
    devices: list[str]

    def umask(self) -> str:
        """The plugin's umask, as /proc shows it."""
        assert self.plugin.proc is not None
        status = Path(f"/proc/{self.plugin.proc.pid}/status").read_text()
        return next(line.split()[1] for line in status.splitlines() if line.startswith("Umask:"))

    def allocate(self, *containers: list[str]) -> Any:
        request = pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=ids)
                                                         for ids in containers])
        return self.kubelet.plugin().Allocate(request, timeout=60)


@pytest.fixture
def node(controllers: Callable[..., ControllerProcess], tmp_path: Path, plugin_dir: str) -> Iterator[Node]:
    ctl = controllers()
    register_node(ctl, VGPUS_PER_GPU)
    regions = tmp_path / "regions"  # made by the plugin, 0700
    conf = write_conf(tmp_path / "server.conf", regions)
    kubelet = Kubelet(plugin_dir).start()
    plugin = Plugin(tmp_path / "plugin.log", "-controller", ctl.address, "-config", str(conf), "-device-plugin-dir",
                    plugin_dir, "-pid-file", str(tmp_path / "no-oriond.pid"), "-poll", "0.2").start()
    made = Node(ctl, kubelet, plugin, regions, [])
    try:
        wait_until("the plugin did not register with kubelet", lambda: kubelet.registrations, log=plugin.log)
        listed = kubelet.next_list(lambda d: healthy(d) and len(d) == 2 * VGPUS_PER_GPU)
        made.devices = sorted(device for device, _ in listed)
        yield made
    finally:
        code = plugin.stop()
        kubelet.stop()
        assert code == 0, f"orion-k8s-plugin exited with {code}\n{plugin.log()[-3000:]}"
    assert "Traceback" not in plugin.log(), plugin.log()


def region_name(device: str) -> str:
    gpu, slot = (int(n) for n in device.split("-")[1:])
    return f"orionsock{gpu * 100 + slot}"


def assert_whole_region(path: Path) -> None:
    """A region oriond serves as it is: a regular file, 0666 in its sealed directory, the size of server.conf,
    a valid Orion header that names the file."""
    st = path.lstat()
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o666 and st.st_uid == os.geteuid(), path
    assert st.st_size == REGION_MIB * MIB, (path, st.st_size)
    verdict = region_file.examine(str(path), owners=frozenset({0, os.geteuid()}))
    assert verdict.action == region_file.SERVE, (path, verdict)
    with Region.open(path) as region:
        assert region.geometry.name == path.name


def allocate_at_once(node: Node, requests: list[list[str]]) -> list[Any]:
    """Every request's Allocate at the same moment, each on a thread of its own: answers or gRPC errors, in order."""
    start = threading.Barrier(len(requests))

    def one(ids: list[str]) -> Any:
        start.wait(30)
        try:
            return node.allocate(ids)
        except grpc.RpcError as exc:
            return exc

    with ThreadPoolExecutor(max_workers=len(requests)) as pool:
        return list(pool.map(one, requests))


def failures(outcomes: list[Any]) -> list[str]:
    return [f"{o.code().name}: {o.details()}" for o in outcomes if isinstance(o, grpc.RpcError)]


def host_path(answer: Any) -> Path:
    (container,) = answer.container_responses
    (mount,) = container.mounts
    return Path(mount.host_path)


def test_200_containers_allocated_at_once_each_get_their_own_whole_region(node: Node) -> None:
    """docs/security.md: a region belongs to exactly one tenant (a container) and is only ever made under its
    own name in the sealed directory: 200 Allocates at once, one device each, all succeed, and every container
    is given a region of its own, whole and formatted."""
    assert len(node.devices) == CONCURRENT
    umask = node.umask()
    outcomes = allocate_at_once(node, [[device] for device in node.devices])
    assert node.umask() == umask  # the process-wide umask is never changed under another thread's feet
    assert failures(outcomes) == [], failures(outcomes)[:10]
    paths = [host_path(answer) for answer in outcomes]
    assert paths == [node.regions / region_name(device) for device in node.devices]
    assert len(set(paths)) == CONCURRENT and len({p.stat().st_ino for p in paths}) == CONCURRENT
    for path in paths:
        assert_whole_region(path)
    assert sorted(os.listdir(node.regions)) == sorted(p.name for p in paths)  # nothing else made


def test_200_allocates_at_once_for_the_same_devices_never_fail_and_leave_one_region_per_device(node: Node) -> None:
    """docs/security.md: Allocate makes a region only under its own name in the sealed directory, and nothing
    kubelet sends breaks the plugin: 200 Allocates at once, 50 for each of four devices (as a kubelet re-admitting
    pods might), all succeed, each answer names its device's region, and afterwards the directory holds one whole
    region per device and nothing else (docs/kubernetes.md: at most one region per vGPU; no half-made or
    temporary file stays behind)."""
    before = {}  # regions that exist already, each held open (so its inode number stays its own): each call
    for device in node.devices[:4]:  # replaces one
        path = host_path(node.allocate([device]))
        before[path] = os.open(path, os.O_RDONLY)
    try:
        requests = [[node.devices[i % 4]] for i in range(CONCURRENT)]
        outcomes = allocate_at_once(node, requests)
        assert failures(outcomes) == [], failures(outcomes)[:10]
        for ids, answer in zip(requests, outcomes, strict=True):
            assert host_path(answer) == node.regions / region_name(ids[0])
        assert sorted(os.listdir(node.regions)) == sorted(region_name(d) for d in node.devices[:4])
        for path, old in before.items():
            assert_whole_region(path)
            assert path.stat().st_ino != os.fstat(old).st_ino  # made anew: nothing of the previous container's
    finally:
        for old in before.values():
            os.close(old)


@needs_root
def test_a_region_directory_swapped_after_the_start_is_never_written_to(node: Node, tmp_path: Path) -> None:
    """docs/security.md: a region is only ever made under its own name in the plugin's sealed directory. The
    directory the plugin checked at its start is swapped for another user's (a link, then a directory of
    theirs): Allocate is refused with a line that says so and nothing is made in the other user's directory;
    once the directory is back, Allocate works again."""
    device = node.devices[0]
    assert host_path(node.allocate([device])) == node.regions / region_name(device)
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, NOBODY_UID, NOBODY_UID)
    moved = tmp_path / "regions.moved"
    node.regions.rename(moved)
    try:
        for swap in ("link", "directory"):
            if swap == "link":
                node.regions.symlink_to(theirs)
            else:
                node.regions.mkdir()
                os.chown(node.regions, NOBODY_UID, NOBODY_UID)
            with pytest.raises(grpc.RpcError) as refused:
                node.allocate([device])
            assert refused.value.code() == grpc.StatusCode.INTERNAL, swap
            assert "no longer names the directory" in refused.value.details(), refused.value.details()
            assert os.listdir(theirs) == [] and os.listdir(node.regions) == [], swap
            _take_away(node.regions)
    finally:
        _take_away(node.regions)
        moved.rename(node.regions)
    assert host_path(node.allocate([device])) == node.regions / region_name(device)
    assert_whole_region(node.regions / region_name(device))
    assert node.plugin.alive()


def _take_away(path: Path) -> None:
    """Remove what was swapped in at `path` (a link, or a directory with whatever was made in it)."""
    if path.is_symlink():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)


def run_plugin(conf: Path, plugin_dir: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "host_agent.k8s.cli", "-config", str(conf), "-device-plugin-dir",
                           plugin_dir, "-controller", f"127.0.0.1:{free_port()}"], cwd=REPO,
                          env={**os.environ, "PYTHONPATH": python_path()}, capture_output=True, text=True, timeout=30)


def _tree(base: Path, *steps: tuple[str, int, int]) -> Path:
    """Directories base/a/b/..., each (name, mode, owner uid); the last is the region directory."""
    path = base
    for name, mode, uid in steps:
        path = path / name
        path.mkdir()
        os.chmod(path, mode)
        os.chown(path, uid, uid)
    return path


@pytest.fixture
def reachable() -> Iterator[Path]:
    """A directory of root's that every user may pass through (pytest's tmp_path is closed to them), in /tmp."""
    with open_directory("/tmp", "orion-regions-") as base:
        yield base


REFUSED = {
    # an ancestor another user owns: they can rename the region directory away and put theirs in its place
    "owned by nobody": ([("home", 0o755, NOBODY_UID), ("regions", 0o700, 0)], "home belongs to uid 65534"),
    # an ancestor anyone can write, without the sticky bit: anyone can rename what is in it
    "writable by all": ([("open", 0o777, 0), ("regions", 0o700, 0)], "open has mode 0777"),
    "writable by its group": ([("team", 0o775, 0), ("regions", 0o700, 0)], "team has mode 0775"),
    # sticky and writable by all (as /dev/shm): fine only if the next directory is root's or ours
    "sticky, next is nobody's": ([("shm", 0o1777, 0), ("mine", 0o755, NOBODY_UID), ("regions", 0o700, 0)],
                                 "mine belongs to uid 65534"),
}


@needs_root
@pytest.mark.parametrize("case", sorted(REFUSED))
def test_the_plugin_refuses_a_region_directory_another_user_could_swap(case: str, tmp_path: Path, plugin_dir: str,
                                                                        reachable: Path) -> None:
    """docs/security.md: the plugin refuses a directory others could enter or that another user owns, and
    (item 7) one that another user could replace: a parent directory (up to /) of another uid than root's or
    the plugin's, or one that others may write without the sticky bit, or a sticky one whose next directory is
    another user's. Refused at the start in one line naming the directory and what to do; nothing is made."""
    steps, words = REFUSED[case]
    regions = _tree(reachable, *steps)
    done = run_plugin(write_conf(tmp_path / "server.conf", regions), plugin_dir)
    assert done.returncode == 1, done.stderr
    (line,) = done.stderr.strip().splitlines()  # one line, no traceback
    assert words in line and "could replace" in line and str(regions) in line, line
    assert os.listdir(regions) == [] and os.listdir(plugin_dir) == []
    if case == "owned by nobody":  # what the refusal prevents: nobody swaps the directory for one of its own
        swap = subprocess.run([*AS_NOBODY, "sh", "-c", f'mv "{regions}" "{regions}.old" && mkdir "{regions}"'],
                              capture_output=True, text=True, timeout=30)
        assert swap.returncode == 0, swap.stderr
        assert regions.stat().st_uid == NOBODY_UID


@needs_root
def test_a_region_directory_reached_through_a_link_or_a_sticky_directory(tmp_path: Path, plugin_dir: str) -> None:
    """docs/security.md (the sealed directory): a link on the way is refused (whoever may change the link's
    directory could point it elsewhere), and a sticky directory that anyone may write (/dev/shm) is a fine parent
    of a directory that is root's: nobody else can rename it there. The plugin makes the region directory
    itself, 0700."""
    real = _tree(tmp_path, ("real", 0o755, 0))
    (tmp_path / "link").symlink_to(real)
    done = run_plugin(write_conf(tmp_path / "link.conf", tmp_path / "link" / "regions"), plugin_dir)
    assert done.returncode == 1 and "symbolic link" in done.stderr, done.stderr
    assert not (real / "regions").exists()

    shm = _tree(tmp_path, ("shm", 0o1777, 0))
    plugin = Plugin(tmp_path / "plugin.log", "-config", str(write_conf(tmp_path / "shm.conf", shm / "orion-k8s")),
                    "-device-plugin-dir", plugin_dir, "-controller", f"127.0.0.1:{free_port()}").start()
    try:
        wait_until("the plugin did not start", lambda: "regions in" in plugin.log() or not plugin.alive(),
                   log=plugin.log)
        assert plugin.alive(), plugin.log()
        st = (shm / "orion-k8s").lstat()
        assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.geteuid()
    finally:
        assert plugin.stop() == 0, plugin.log()
