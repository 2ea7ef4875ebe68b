"""Boot the test guest under QEMU (TCG) and run one script of the repo checkout inside it.

The guest image comes from tests/guest/build-image.sh. The checkout is shared read-only over 9p and the guest's
PID 1 (tests/guest/init.sh) runs ``orion_run=<script>`` from it, so code changes need no image rebuild.
Each (path, size_mib) in ``shm`` becomes an ivshmem-plain PCI device backed by that host file.

    from tests.guest import vm          # or: sys.path.insert(0, "tests/guest"); import vm
    if vm.image_ready():
        r = vm.run_guest("tests/guest/smoke_guest.py", shm=[("/dev/shm/x", 16)])
        assert r.rc == 0, r.serial

Manual use: python3 tests/guest/vm.py tests/guest/smoke_guest.py [args...] [--shm /dev/shm/x:16]
Stdlib only.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
IMAGE_FILES = ("vmlinuz", "initrd.img", "guest.img")
QEMU = "qemu-system-x86_64"
_END = re.compile(r"ORION-GUEST-END rc=(\d+)")
_ESC = re.compile(r"\x1b(\[[0-9;?]*[A-Za-z]|[A-Za-z])")   # firmware's terminal control sequences


class GuestError(RuntimeError):
    """QEMU or the guest image is missing, or the arguments cannot be passed to the guest."""


def guest_dir() -> Path:
    return Path(os.environ.get("ORION_GUEST_DIR", "/var/tmp/orion-guest"))


def image_ready() -> bool:
    return all((guest_dir() / f).is_file() for f in IMAGE_FILES)


@dataclass
class GuestResult:
    rc: int | None          # exit code of the guest script; None if the guest never reported one (timeout, crash)
    serial: str             # the whole serial console log (terminal control sequences removed)
    wall_s: float           # host wall time from QEMU start to exit
    qemu_log: str = ""      # QEMU's own stdout/stderr (errors about options, backing files, ...)
    timed_out: bool = False

    def lines(self, prefix: str = "") -> list[str]:
        """Serial console lines (CR stripped) that start with prefix."""
        return [ln.rstrip("\r") for ln in self.serial.splitlines() if ln.startswith(prefix)]

    def line(self, prefix: str) -> str | None:
        """The last serial line starting with prefix, or None."""
        found = self.lines(prefix)
        return found[-1] if found else None


def _q(value: object) -> str:
    """Escape a value for a QEMU option list (a comma is written as two)."""
    return str(value).replace(",", ",,")


def _guest_path(script: str | os.PathLike, repo: Path) -> str:
    p = Path(script)
    try:
        rel = p.resolve().relative_to(repo) if p.is_absolute() else p
    except ValueError:
        raise GuestError(f"{script}: not inside the shared checkout {repo}") from None
    if not (repo / rel).is_file():
        raise GuestError(f"{script}: not a file in {repo}")
    return rel.as_posix()


def run_guest(script: str, args: list[str] = (), shm: list[tuple[str, int]] = (), timeout: float = 240,
              memory_mb: int = 512, repo: Path = REPO_ROOT, cpus: int = 1) -> GuestResult:
    """Boot the guest, run `script` (relative to `repo`) with `args`, wait for power-off, return the result."""
    qemu = shutil.which(QEMU)
    if qemu is None:
        raise GuestError(f"{QEMU} not found (apt-get install qemu-system-x86)")
    gd = guest_dir()
    if not image_ready():
        raise GuestError(f"guest image not built in {gd}: run tests/guest/build-image.sh")
    repo = Path(repo).resolve()
    rel = _guest_path(script, repo)
    for a in args:
        if not a or re.search(r"[\s,\"]", a):
            raise GuestError(f"guest argument {a!r} is empty or has a space, comma or quote (kernel cmdline)")
    append = f"console=ttyS0 root=/dev/vda rw quiet panic=1 init=/orion-init orion_run={rel}"
    if args:
        append += " orion_args=" + ",".join(args)

    cmd = [qemu, "-accel", "tcg", "-cpu", "max", "-smp", str(cpus), "-m", str(memory_mb),
           "-nodefaults", "-nographic", "-no-reboot",
           "-kernel", str(gd / "vmlinuz"), "-initrd", str(gd / "initrd.img"), "-append", append,
           "-drive", f"file={_q(gd / 'guest.img')},format=raw,if=virtio,snapshot=on",
           "-virtfs", f"local,path={_q(repo)},mount_tag=orion,security_model=none,readonly=on",
           "-monitor", "none"]
    for i, (path, size_mib) in enumerate(shm):
        cmd += ["-object", f"memory-backend-file,id=shm{i},size={int(size_mib)}M,mem-path={_q(path)},share=on",
                "-device", f"ivshmem-plain,memdev=shm{i}"]
    return boot(cmd, timeout)


def boot(cmd: list[str], timeout: float, env: dict[str, str] | None = None) -> GuestResult:
    """Run a QEMU command line (its serial console added here) until the guest powers off or `timeout` passes."""
    with tempfile.TemporaryDirectory(prefix="orion-vm-") as tmp:
        serial_path, qemu_path = Path(tmp, "serial.log"), Path(tmp, "qemu.log")
        cmd += ["-serial", f"file:{_q(serial_path)}"]
        t0 = time.monotonic()
        with open(qemu_path, "wb") as qlog:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=qlog, stderr=subprocess.STDOUT, env=env)
            timed_out = False
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
                proc.kill()
                proc.wait()
        wall = time.monotonic() - t0
        serial = _ESC.sub("", serial_path.read_text(errors="replace")) if serial_path.exists() else ""
        qemu_log = qemu_path.read_text(errors="replace")
    m = _END.findall(serial)
    rc = int(m[-1]) if m and not timed_out else None
    return GuestResult(rc=rc, serial=serial, wall_s=wall, qemu_log=qemu_log, timed_out=timed_out)


def main(argv: list[str] | None = None) -> int:
    import argparse
    ap = argparse.ArgumentParser(description="Run a repo script inside the test guest (see module docstring).")
    ap.add_argument("script", help="path relative to the repo root, e.g. tests/guest/smoke_guest.py")
    ap.add_argument("args", nargs="*", help="arguments for the script (no spaces or commas)")
    ap.add_argument("--shm", action="append", default=[], metavar="PATH:MIB",
                    help="add an ivshmem-plain device backed by PATH of MIB MiB (repeatable)")
    ap.add_argument("--timeout", type=float, default=240)
    ap.add_argument("--memory", type=int, default=512, help="guest memory in MiB")
    ap.add_argument("--cpus", type=int, default=1, help="guest vCPUs")
    ns = ap.parse_args(argv)
    shm = [(p, int(s)) for p, s in (x.rsplit(":", 1) for x in ns.shm)]
    try:
        r = run_guest(ns.script, ns.args, shm=shm, timeout=ns.timeout, memory_mb=ns.memory, cpus=ns.cpus)
    except GuestError as e:
        print(f"vm.py: {e}", file=sys.stderr)
        return 2
    sys.stdout.write(r.serial)
    if r.qemu_log.strip():
        print("--- qemu output ---\n" + r.qemu_log.rstrip())
    print(f"--- guest rc={r.rc} wall={r.wall_s:.1f}s{' (timed out)' if r.timed_out else ''}")
    return 124 if r.timed_out else (r.rc if r.rc is not None else 1)


if __name__ == "__main__":
    sys.exit(main())
