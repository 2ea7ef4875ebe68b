"""A real libvirt guest reaching the real host agent through a region libvirt attached (issue 4, end to end).

Everything is the user's path (tests/guest/libvirt_guest.py boots the guests): the installed qemu hook
(`orion-hooks install`, done by setup.sh; libvirtd must have started after it, which `orion-hooks status`
checks), `oriond` with the system pid file the hook wakes, `orion-domain render` for the XML, `orion-shm
attach/detach` on the defined domain, `virDomainCreate`. Inside the TCG guest this checkout's runtime is
installed as a .pth hook and an unmodified cuda-python program runs with ORION_VGPU=1: on this GPU-less host
its cuInit must come back CUDA_ERROR_NO_DEVICE from oriond, through the ivshmem BAR. Regions are
/dev/shm/orionsock<N> (the hook's server.conf is the system's) with unused indices, removed at the end.

Bad cases end in a clear message, never a hang: a guest without a region, a region of the wrong size (the
hook refuses the start, so libvirt's error carries its line), and no agent running.
"""
from __future__ import annotations

import contextlib
import os
import pwd
import random
import re
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from host_agent.daemon import pidfile
from host_agent.server_conf import ShmSettings
from tests.guest.libvirt_guest import PROGRESS_S, GuestRun, LibvirtGuest, build_native_harness, start_system_agent
from tests.guest.vm import image_ready
from tests.processes import stop_process

from .conftest import _unavailable

pytestmark = [
    pytest.mark.guest, pytest.mark.functional,
    pytest.mark.skipif(not image_ready() and not os.environ.get("CI"),
                       reason="guest image not built: run `bash tests/guest/build-image.sh` (make test does)"),
]
REPO = Path(__file__).resolve().parents[2]
SETTINGS = ShmSettings.load()  # what the installed hook reads: /etc/orion/server.conf, or Orion's defaults
SHM_DIR = Path(SETTINGS.path_base)
RELEASE_TIMEOUT_S = 20.0
GUEST_TIMEOUT_S = 300.0
CUDA_NO_DEVICE = "CUDA-PROGRAM init=CUDA_ERROR_NO_DEVICE(100)"


def region(index: int) -> Path:
    return SHM_DIR / f"orionsock{index}"


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, cwd=REPO, timeout=120)


@pytest.fixture(scope="module")
def hook_active(libvirt_conn: Any) -> None:
    """The installed hook, run by the running libvirtd (setup.sh installs it before starting libvirtd)."""
    status = cli("libvirt_hooks.cli", "status")
    if status.returncode:
        _unavailable(f"the Orion qemu hook is not active (run ./setup.sh, which installs it and restarts "
                     f"libvirtd):\n{status.stdout}{status.stderr}")


@pytest.fixture
def free_indices() -> Iterator[Callable[[], int]]:
    """`take()` gives a region index whose file does not exist; every file taken is removed at the end."""
    taken: list[int] = []
    rng = random.Random()

    def take() -> int:
        for _ in range(200):
            index = rng.randrange(2000, 9999)
            if index not in taken and not region(index).exists():
                taken.append(index)
                return index
        pytest.skip("no free region index in 2000..9999")

    yield take
    for index in taken:
        with contextlib.suppress(FileNotFoundError):
            region(index).unlink()


class SystemAgent:
    """oriond as the hook knows it (system server.conf, system pid file), started for the test."""

    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path
        self.proc = start_system_agent(log_path)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def no_agent_of_others() -> None:
    pid = pidfile.running_agent(pidfile.DEFAULT_PID_FILE)
    if pid is not None:
        pytest.skip(f"an oriond the tests did not start runs (pid {pid}, {pidfile.DEFAULT_PID_FILE}); "
                    "these tests need that pid file for their own agent")


@pytest.fixture
def system_agent(tmp_path: Path) -> Iterator[SystemAgent]:
    no_agent_of_others()
    agent = SystemAgent(tmp_path / "oriond.log")
    try:
        yield agent
    finally:
        code = stop_process(agent.proc)
        assert code == 0, f"oriond exited with {code}:\n{agent.log()}"


@pytest.fixture
def guest(libvirt_conn: Any, hook_active: None) -> Iterator[Callable[..., LibvirtGuest]]:
    made: list[LibvirtGuest] = []

    def make(*args: str) -> LibvirtGuest:
        made.append(LibvirtGuest(libvirt_conn, "tests/guest/cuda_guest.py", args))
        return made[-1]

    yield make
    for each in made:
        each.close()


def watch_regions(paths: list[Path]) -> tuple[Callable[[Any], None], dict[Path, os.stat_result | None]]:
    """An on-start callback recording each region file's stat as soon as the domain runs."""
    seen: dict[Path, os.stat_result | None] = {}

    def record(_dom: Any) -> None:
        for path in paths:
            try:
                seen[path] = os.stat(path)
            except FileNotFoundError:
                seen[path] = None

    return record, seen


def wait_removed(*paths: Path) -> None:
    """libvirt runs the release hook as it tears the domain down, just after it reports the domain shut off."""
    deadline = time.monotonic() + RELEASE_TIMEOUT_S
    while any(path.exists() for path in paths):
        assert time.monotonic() < deadline, f"the release hook left {[str(p) for p in paths if p.exists()]}"
        time.sleep(0.1)


def diagnose(run: GuestRun) -> str:
    return f"guest rc={run.rc} timed_out={run.timed_out}; serial tail:\n{run.serial[-4000:]}"


def test_guest_reaches_the_agent_through_a_libvirt_region(guest: Callable[..., LibvirtGuest],
                                                           system_agent: SystemAgent,
                                                           free_indices: Callable[[], int]) -> None:
    generated, attached = free_indices(), free_indices()
    vm = guest("300", "2", build_native_harness())  # the C wire client too, as the native guest driver opens it
    vm.define([(generated, 32)])  # from orion-domain render
    attach = cli("host_agent.admin.shm_cli", "attach", vm.name, "-i", str(attached), "-s", "16")
    assert attach.returncode == 0, attach.stderr
    assert region(attached).exists() and not region(generated).exists()  # the hook makes the other at start

    record, seen = watch_regions([region(generated), region(attached)])
    said: list[str] = []
    run = vm.run(GUEST_TIMEOUT_S, on_start=record, progress=said.append)
    assert run.rc == 0, diagnose(run)
    # a TCG boot of tens of seconds is never silent (issue 31): a line every PROGRESS_S, naming the guest
    assert len(said) >= int(run.wall_s // PROGRESS_S) - 1 and all(f"guest {vm.name} running for" in s for s in said)
    assert run.wall_s < 2 * PROGRESS_S or said, said

    made = seen[region(generated)]
    assert made is not None, "the prepare hook did not create the region before QEMU started"
    assert made.st_size == 32 << 20 and stat.S_IMODE(made.st_mode) & 0o660 == 0o660
    assert pwd.getpwuid(made.st_uid).pw_name == SETTINGS.user
    devices = run.line("KVM-DEVICES")
    assert devices is not None and devices.split()[1] == "2", diagnose(run)
    probes = run.lines("KVM-PROBE")
    assert len(probes) == 2 and all(" rc=0 " in probe for probe in probes), diagnose(run)
    assert len(run.lines("ORION-PROBE ok")) == 2, diagnose(run)
    natives = run.lines("KVM-NATIVE")  # its BAR2 mapped from sysfs, kept alive by its heartbeat, timed in C
    assert len(natives) == 2 and all(re.search(r" rc=0 echo \d+ \d+ \| nop \d+ \d+", n) for n in natives), \
        diagnose(run)
    assert run.line(CUDA_NO_DEVICE), diagnose(run)
    assert run.line("KVM-CUDA rc=0"), diagnose(run)
    assert "Traceback" not in run.serial, diagnose(run)
    log = system_agent.log()
    assert f"Using SHM orionsock{generated} for acceleration." in log
    assert f"Using SHM orionsock{attached} for acceleration." in log
    wait_removed(region(generated), region(attached))


def test_guest_without_a_region_says_so(guest: Callable[..., LibvirtGuest], system_agent: SystemAgent,
                                        free_indices: Callable[[], int]) -> None:
    index = free_indices()
    vm = guest()
    vm.define([(index, 32)])
    detach = cli("host_agent.admin.shm_cli", "detach", vm.name, "-i", str(index))
    assert detach.returncode == 0, detach.stderr
    assert "orionsock" not in vm.dom.XMLDesc(0)

    run = vm.run(GUEST_TIMEOUT_S)
    assert run.rc == 0, diagnose(run)
    assert run.line("KVM-DEVICES 0"), diagnose(run)
    assert run.line(CUDA_NO_DEVICE), diagnose(run)
    said = run.line("KVM-CUDA rc=0")
    assert said and "no Orion region found" in said, diagnose(run)
    assert "Traceback" not in run.serial


@pytest.mark.parametrize("file_mib, formatted, expected", [
    (16, False, "is 16 MiB but domain"),
    (64, True, "is laid out for 64 MiB"),
], ids=["smaller-file", "larger-layout"])
def test_region_of_the_wrong_size_is_refused_at_start(guest: Callable[..., LibvirtGuest],
                                                      free_indices: Callable[[], int], file_mib: int,
                                                      formatted: bool, expected: str) -> None:
    import libvirt

    index = free_indices()
    if formatted:
        created = cli("host_agent.admin.shm_cli", "create", "-i", str(index), "-s", str(file_mib))
        assert created.returncode == 0, created.stderr
    else:
        with open(region(index), "wb") as f:
            f.truncate(file_mib << 20)
    vm = guest()
    vm.define([(index, 32)])
    before = region(index).stat()
    with pytest.raises(libvirt.libvirtError) as refused:
        vm.run(GUEST_TIMEOUT_S)
    message = str(refused.value)
    assert "Orion vGPU hook: prepare of domain" in message and expected in message, message
    assert "orion-shm remove" in message  # says what to do
    assert not vm.dom.isActive()
    after = region(index).stat()
    assert (after.st_size, after.st_ino) == (before.st_size, before.st_ino)  # the user's file is not touched


def test_guest_with_no_agent_running_is_told_so(guest: Callable[..., LibvirtGuest],
                                                free_indices: Callable[[], int]) -> None:
    no_agent_of_others()
    index = free_indices()
    vm = guest("10", "1")
    vm.define([(index, 32)])
    run = vm.run(GUEST_TIMEOUT_S)
    assert run.rc == 0, diagnose(run)
    probe = run.line("KVM-PROBE")
    assert probe and " rc=1 " in probe and "no host agent is serving this region" in probe, diagnose(run)
    assert run.line(CUDA_NO_DEVICE), diagnose(run)
    said = run.line("KVM-CUDA rc=0")
    assert said and "oriond" in said, diagnose(run)
    assert "Traceback" not in run.serial
    wait_removed(region(index))

