"""A throw-away libvirt guest (TCG) that runs one script of this checkout, with Orion regions attached.

The end-to-end tests (tests/libvirt/test_guest_end_to_end.py), the KVM demo (tests/guest/kvm_demo.py) and the
KVM benchmark (bench/kvm_bench.py) boot their guests through this, so all three exercise the user's path:

1. the domain XML comes from `orion-domain render` (the real command: kernel + initrd of the test image, a
   copy-on-write overlay of its root disk, a read-only 9p share, the serial console logged to a file);
2. `virDomainDefineXML`, optionally `orion-shm attach` for more regions, then `virDomainCreate`: libvirt runs
   the installed qemu hook, which creates the regions and wakes the host agent;
3. the guest's PID 1 (tests/guest/init.sh) mounts the share and runs `orion_run=<script>`, then powers off.

The share is a staged copy, not the checkout: QEMU runs as the unprivileged QEMU user (libvirt-qemu), which
cannot read a checkout under /root. It holds ivshmem/, guest_runtime/, tests/guest/*.py and, under site/,
the host venv's cuda-python (cuda.bindings and cuda.pathfinder; the guest has Debian's python3.11, the same
interpreter the venv is built on), hard-linked where the file system allows. Every wait is bounded.
"""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .vm import REPO_ROOT, guest_dir, image_ready

SHARE_TAG = "orion"  # the 9p tag tests/guest/init.sh mounts
DOMAIN_PREFIX = "orion-test-"
STAGE_ROOT = Path("/var/tmp")
CUDA_PACKAGES = ("bindings", "pathfinder")
_END = re.compile(r"ORION-GUEST-END rc=(\d+)")
_ESC = re.compile(r"\x1b(\[[0-9;?]*[A-Za-z]|[A-Za-z])")
PROGRESS_S = 10.0  # how often run() reports a guest still running (its progress callback)


class LibvirtGuestError(RuntimeError):
    """The guest could not be prepared, defined or started; the message says why."""


@dataclass
class GuestRun:
    rc: int | None       # the script's exit code; None if the guest never reported one
    serial: str          # the serial console log, terminal control sequences removed
    wall_s: float        # from virDomainCreate to the domain's end
    timed_out: bool = False

    def lines(self, prefix: str) -> list[str]:
        return [line.rstrip("\r") for line in self.serial.splitlines() if line.startswith(prefix)]

    def line(self, prefix: str) -> str | None:
        found = self.lines(prefix)
        return found[-1] if found else None


def start_system_agent(log_path: Path, timeout: float = 30.0) -> subprocess.Popen[bytes]:
    """Start oriond as the installed hook knows it: the system server.conf and pid file (the hook wakes that
    pid). Returns once the pid file names it; LibvirtGuestError if it exits or does not get there in time."""
    from host_agent.daemon import pidfile

    with open(log_path, "ab") as log:
        agent = subprocess.Popen([sys.executable, "-m", "host_agent.daemon.oriond", "--pid-file",
                                  pidfile.DEFAULT_PID_FILE],
                                 cwd=REPO_ROOT, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                 start_new_session=True)
    deadline = time.monotonic() + timeout
    while pidfile.running_agent(pidfile.DEFAULT_PID_FILE) != agent.pid:
        if agent.poll() is not None or time.monotonic() > deadline:
            agent.kill()
            agent.wait()
            raise LibvirtGuestError(f"oriond did not start (exit {agent.returncode}); see {log_path}")
        time.sleep(0.05)
    return agent


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


NATIVE_HARNESS_DIR = Path("build") / "kvm-bench"


def build_native_harness() -> str:
    """Build bench/native_wire_bench.py's harness (the C wire client, timed in C) where stage_share copies it into
    the guest's share; returns its path relative to the share, for cuda_guest.py's third argument."""
    from bench.native_wire_bench import build_harness

    directory = REPO_ROOT / NATIVE_HARNESS_DIR
    directory.mkdir(parents=True, exist_ok=True)
    exe, _library = build_harness(directory)
    return str(exe.relative_to(REPO_ROOT))


def stage_share(target: Path, repo: Path = REPO_ROOT) -> Path:
    """Copy what the guest runs into `target` (created, mode 0755 all the way): the QEMU user reads it."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for package in ("ivshmem", "guest_runtime"):
        shutil.copytree(repo / package, target / package, ignore=ignore)
    scripts = target / "tests" / "guest"
    scripts.mkdir(parents=True)
    for script in (repo / "tests" / "guest").glob("*.py"):
        shutil.copy2(script, scripts / script.name)
    harness = repo / NATIVE_HARNESS_DIR  # the C client harness (build_native_harness), when one was built
    if harness.is_dir():
        shutil.copytree(harness, target / NATIVE_HARNESS_DIR)
    import cuda.bindings  # the host venv's: the guest runs the same cuda-python

    cuda_dir = Path(cuda.bindings.__file__).resolve().parents[1]
    for package in CUDA_PACKAGES:
        shutil.copytree(cuda_dir / package, target / "site" / "cuda" / package, ignore=ignore,
                        copy_function=_link_or_copy)
    for directory, _subdirs, _files in os.walk(target):
        os.chmod(directory, 0o755)
    return target


class LibvirtGuest:
    """One guest: staged share, overlay disk, serial log, domain. Use as a context manager; `close` removes
    the domain (destroyed, undefined) and the staging directory, whatever happened."""

    def __init__(self, conn: Any, script: str, args: tuple[str, ...] = (), memory_mib: int = 512,
                 prefix: str = DOMAIN_PREFIX) -> None:
        if not image_ready():
            raise LibvirtGuestError(f"guest image not built in {guest_dir()}: run tests/guest/build-image.sh")
        for arg in args:
            if not arg or re.search(r"[\s,\"]", arg):
                raise LibvirtGuestError(f"guest argument {arg!r} is empty or has a space, comma or quote")
        self.conn = conn
        self.name = prefix + uuid.uuid4().hex[:12]
        self.workdir = Path(tempfile.mkdtemp(prefix="orion-kvm-", dir=STAGE_ROOT))
        os.chmod(self.workdir, 0o755)
        self.serial_log = self.workdir / "serial.log"
        self.script, self.args, self.memory_mib = script, args, memory_mib
        self.dom: Any = None
        try:
            self.share = stage_share(self.workdir / "share")
            self.disk = self._overlay()
        except BaseException:
            self.close()
            raise

    def _overlay(self) -> Path:
        overlay = self.workdir / "root.qcow2"
        result = subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw", "-b",
                                 str(guest_dir() / "guest.img"), str(overlay)],
                                capture_output=True, text=True, timeout=60)
        if result.returncode:
            raise LibvirtGuestError(f"qemu-img could not make the overlay disk: {result.stderr.strip()}")
        return overlay

    def render(self, regions: list[tuple[int, int]]) -> str:
        """The domain XML from `orion-domain render` (the real command), regions as (index, size MiB)."""
        cmdline = (f"console=ttyS0 root=/dev/vda rw quiet panic=1 init=/orion-init orion_run={self.script}"
                   + (f" orion_args={','.join(self.args)}" if self.args else ""))
        gd = guest_dir()
        argv = [sys.executable, "-m", "xml_templates.cli", "render", "--name", self.name, "--type", "qemu",
                "--memory", str(self.memory_mib), "--kernel", str(gd / "vmlinuz"), "--initrd", str(gd / "initrd.img"),
                "--cmdline", cmdline, "--disk", str(self.disk), "--disk-format", "qcow2",
                "--share", f"{self.share}:{SHARE_TAG}", "--serial-log", str(self.serial_log)]
        for index, size_mib in regions:
            argv += ["--region", f"{index}:{size_mib}"]
        result = subprocess.run(argv, capture_output=True, text=True, cwd=REPO_ROOT, timeout=60)
        if result.returncode:
            raise LibvirtGuestError(f"orion-domain render failed: {result.stderr.strip()}")
        return result.stdout

    def define(self, regions: list[tuple[int, int]]) -> Any:
        self.dom = self.conn.defineXML(self.render(regions))
        return self.dom

    def run(self, timeout: float = 300, on_start: Callable[[Any], None] | None = None,
            progress: Callable[[str], None] | None = None) -> GuestRun:
        """Start the defined domain, wait until it has powered itself off, return what the guest printed.

        `on_start(dom)` runs as soon as libvirt says the domain runs (the prepare hook is done by then).
        `progress(line)` is told every PROGRESS_S how long the guest has run and its console's last line (a TCG
        boot takes a minute: a user should see it move). Raises libvirt.libvirtError if libvirt refuses to start
        it (the hook's refusal arrives this way)."""
        t0 = time.monotonic()
        self.dom.create()
        if on_start is not None:
            on_start(self.dom)
        timed_out = False
        next_progress = t0 + PROGRESS_S
        while self.dom.isActive():
            now = time.monotonic()
            if now - t0 > timeout:
                timed_out = True
                with contextlib.suppress(Exception):
                    self.dom.destroy()
                break
            if progress is not None and now >= next_progress:
                next_progress = now + PROGRESS_S
                progress(f"guest {self.name} running for {now - t0:.0f} s (TCG); console: {self.last_console_line()}")
            time.sleep(0.25)
        wall = time.monotonic() - t0
        serial = _ESC.sub("", self.serial_log.read_text(errors="replace")) if self.serial_log.exists() else ""
        ends = _END.findall(serial)
        rc = int(ends[-1]) if ends and not timed_out else None
        return GuestRun(rc=rc, serial=serial, wall_s=wall, timed_out=timed_out)

    def last_console_line(self) -> str:
        """The guest console's last non-empty line so far, shortened (what a progress line shows)."""
        text = _ESC.sub("", self.serial_log.read_text(errors="replace")) if self.serial_log.exists() else ""
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        return (lines[-1][:100] if lines else "(nothing yet)").encode("ascii", "replace").decode()

    def close(self) -> None:
        if self.dom is not None:
            with contextlib.suppress(Exception):
                if self.dom.isActive():
                    self.dom.destroy()
            with contextlib.suppress(Exception):
                self.dom.undefine()
            self.dom = None
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> LibvirtGuest:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
