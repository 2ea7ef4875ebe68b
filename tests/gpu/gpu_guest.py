"""Boot a QEMU guest on the GPU machine from the bundle tests/gpu/build-guest-bundle.sh makes (TESTBED.md, "A guest
on the GPU machine"), with Orion regions as ivshmem-plain devices, and run one Python script inside it.

That machine has no QEMU of its own: the bundle's qemu-system-x86_64 runs through the bundle's own loader and
libraries, under TCG (its /dev/kvm does not boot a stock kernel). The guest's root is the host's own filesystem
over 9p, read-only, so it runs the same Python and the same packages as the host; its /dev, /proc, /sys, /tmp and
/run are its own (tests/gpu/guest_init.sh), so the GPU is not visible in it: only the regions are. The checkout is
shared once more and mounted at its own path, which a checkout under /tmp needs.

    result = boot_script(REPO / "tests/gpu/in_guest.py", ["arg"], regions=[("/dev/shm/x/orionsock0", 256)])
    assert result.rc == 0, result.serial
"""
from __future__ import annotations

import atexit
import os
import re
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path

from tests.guest.vm import GuestError, GuestResult, _q, boot

REPO = Path(__file__).resolve().parents[2]
BUNDLE_FILES = ("qemu.tar.xz", "vmlinuz", "initrd.gz")
_unpacked: dict[Path, Path] = {}


def bundle_dir() -> Path:
    return Path(os.environ.get("ORION_GPU_GUEST_DIR", REPO / ".gpu-guest"))


def bundle_ready() -> bool:
    return all((bundle_dir() / name).is_file() for name in BUNDLE_FILES)


def _qemu(bundle: Path) -> Path:
    """The bundle's QEMU tree, unpacked once per process into a temporary directory."""
    if bundle not in _unpacked:
        where = Path(tempfile.mkdtemp(prefix="orion-qemu-"))
        atexit.register(shutil.rmtree, where, True)
        with tarfile.open(bundle / "qemu.tar.xz") as tar:
            tar.extractall(where, **({"filter": "tar"} if hasattr(tarfile, "tar_filter") else {}))  # 3.12: checked
        _unpacked[bundle] = where / "qemu"
    return _unpacked[bundle]


def boot_script(script: Path, args: list[str] = (), regions: list[tuple[str, int]] = (), timeout: float = 600,
                memory_mb: int = 2048, cpus: int = 2, python: str = sys.executable) -> GuestResult:
    """Boot the guest, run `script` with `python` (both paths of this machine's filesystem) in the repository, one
    ivshmem-plain device per (path, size in MiB) of `regions`; the result once the guest powers off."""
    bundle = bundle_dir()
    if not bundle_ready():
        raise GuestError(f"no guest bundle in {bundle}: run bash tests/gpu/build-guest-bundle.sh on a Debian machine "
                         "and carry .gpu-guest")
    for value in (str(script), python, str(REPO), *args):
        if not value or re.search(r"[\s,\"]", value):
            raise GuestError(f"{value!r} is empty or has a space, comma or quote (it goes on the kernel cmdline)")
    append = (f"console=ttyS0 panic=-1 quiet orion_run={script} orion_py={python} orion_cwd={REPO}"
              + (f" orion_args={','.join(args)}" if args else ""))
    qemu = _qemu(bundle)
    cmd = [str(qemu / "lib" / "ld-linux-x86-64.so.2"), "--inhibit-cache", "--library-path", str(qemu / "lib"),
           str(qemu / "bin" / "qemu-system-x86_64"), "-accel", "tcg", "-cpu", "max", "-smp", str(cpus),
           "-m", str(memory_mb), "-nodefaults", "-nographic", "-no-reboot", "-monitor", "none",
           "-L", str(qemu / "share"), "-kernel", str(bundle / "vmlinuz"), "-initrd", str(bundle / "initrd.gz"),
           "-append", append, "-virtfs", "local,path=/,mount_tag=root,security_model=none,readonly=on,multidevs=remap",
           "-virtfs", f"local,path={_q(REPO)},mount_tag=repo,security_model=none,readonly=on,multidevs=remap"]
    for i, (path, size_mib) in enumerate(regions):
        cmd += ["-object", f"memory-backend-file,id=region{i},size={int(size_mib)}M,mem-path={_q(path)},share=on",
                "-device", f"ivshmem-plain,memdev=region{i}"]
    return boot(cmd, timeout, env={**os.environ, "QEMU_MODULE_DIR": str(qemu / "modules")})
