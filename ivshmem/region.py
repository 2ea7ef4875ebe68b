"""Opening an Orion region, wherever it is: one `Region` API for the host, a container and a QEMU guest.

* host: `/dev/shm/orionsock<N>` (or a file in another directory, e.g. a hugetlbfs mount), opened without
  following links: /dev/shm is writable by every local user, who could plant a link there;
* container: the same /dev/shm file, seen through `--ipc host` or a bind mount;
* guest: BAR2 of the ivshmem-plain PCI device 1af4:1110, found in sysfs, enabled, and mmapped from
  `resource2` (no guest kernel driver needed).

What the bytes mean is layout.py's business; who uses which channel is channel.py's.
"""
from __future__ import annotations

import contextlib
import ctypes
import errno
import glob
import mmap
import os
import platform
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from . import layout
from .errors import RegionError, RegionFormatError
from .layout import Geometry

SHM_DIR = "/dev/shm"
SHM_PREFIX = "orionsock"
IVSHMEM_VENDOR, IVSHMEM_DEVICE = "0x1af4", "0x1110"
PCI_ROOT = "/sys/bus/pci/devices"
GUEST_LOCK_DIR = "/dev/shm"
MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)  # Linux 5.14; Python's mmap lacks the name


def region_path(index: int, directory: str = SHM_DIR) -> str:
    return os.path.join(directory, f"{SHM_PREFIX}{index}")


def _require_tso() -> None:
    machine = platform.machine().lower()
    if machine not in ("x86_64", "amd64"):
        raise RegionError(f"the Orion rings rely on x86-64 memory ordering; this machine is {machine}")


@dataclass
class Region:
    """A mapped region. `where` names it in every message; `kind` is 'file' (host/container) or 'pci' (guest)."""

    where: str
    kind: str
    fd: int
    size: int
    mm: mmap.mmap
    lock_path: str
    lock_fd: int
    buf: memoryview = field(init=False)
    u32: memoryview = field(init=False)
    u64: memoryview = field(init=False)
    _geometry: Geometry | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.buf = memoryview(self.mm)
        usable = self.size & ~7
        self.u32 = self.buf[:usable].cast("I")
        self.u64 = self.buf[:usable].cast("Q")

    # --- opening -----------------------------------------------------------------------------------------
    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> Region:
        """Open an existing region file (host or container): a regular file, never through a symbolic link."""
        _require_tso()
        path = os.fspath(path)
        fd = open_region_file(path)
        try:
            size = os.fstat(fd).st_size
            if size < layout.HEADER_SIZE:
                raise RegionFormatError(f"{path}: {size} bytes is too small to be an Orion region; recreate it "
                                        "with 'orion-shm create'")
            mm = _map(fd, size, path)
        except BaseException:
            os.close(fd)
            raise
        return cls(where=path, kind="file", fd=fd, size=size, mm=mm, lock_path=path, lock_fd=fd)

    @classmethod
    def open_pci(cls, device: str | None = None) -> Region:
        """Open the ivshmem BAR of `device` (a PCI address such as 0000:00:04.0), or of the first one found."""
        _require_tso()
        devices = find_ivshmem_devices()
        if device is not None:
            devices = [d for d in devices if os.path.basename(d) == device]
        if not devices:
            raise RegionError("no ivshmem PCI device (1af4:1110) in this machine" +
                              (f" at {device}" if device else "") +
                              "; attach a region to this guest on the host (docs/kvm.md)")
        dev = devices[0]
        bdf = os.path.basename(dev)
        where = f"ivshmem {bdf}"
        try:
            with open(os.path.join(dev, "enable"), "w") as f:
                f.write("1")
        except OSError:
            pass  # already enabled, or a kernel that does not need it; mapping tells us for sure
        resource = os.path.join(dev, "resource2")
        try:
            fd = os.open(resource, os.O_RDWR | os.O_SYNC)
        except OSError as exc:
            raise RegionError(f"{where}: cannot open {resource}: {exc.strerror}; run as root or give the "
                              "user read/write access to it") from None
        try:
            size = os.path.getsize(resource)
            mm = _map(fd, size, where)
            lock_path = os.path.join(GUEST_LOCK_DIR, f"orion-lock-{bdf}")
            old = os.umask(0)
            try:
                lock_fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
            finally:
                os.umask(old)
        except BaseException:
            os.close(fd)
            raise
        return cls(where=where, kind="pci", fd=fd, size=size, mm=mm, lock_path=lock_path, lock_fd=lock_fd)

    @classmethod
    def discover(cls) -> Region:
        """Find this process's region: $ORION_SHM (a path or a PCI address), else an ivshmem device, else
        the lowest-numbered formatted /dev/shm/orionsock<N>."""
        wanted = os.environ.get("ORION_SHM")
        if wanted:
            return cls.open(wanted) if wanted.startswith("/") else cls.open_pci(wanted)
        if find_ivshmem_devices():
            return cls.open_pci()
        passed: list[str] = []  # why each file named like a region was not taken
        for path in list_region_files():
            try:  # any local user can put a file of a region's name in /dev/shm: one that is not, is passed over
                region = cls.open(path)
            except RegionError as exc:
                passed.append(str(exc))
                continue
            try:
                _ = region.geometry  # validates the header
                return region
            except RegionFormatError as exc:
                passed.append(str(exc))
                region.close()
        why = f" (passed over: {'; '.join(passed[:3])}{' …' if len(passed) > 3 else ''})" if passed else ""
        raise RegionError("no Orion region found: no ivshmem device and no formatted /dev/shm/orionsock<N>; "
                          f"set ORION_SHM, or create one with 'orion-shm create' and start oriond{why}")

    # --- header ------------------------------------------------------------------------------------------
    @property
    def geometry(self) -> Geometry:
        """The validated header; raises RegionFormatError (or RegionNotFormatted) with the reason."""
        if self._geometry is None:
            self._geometry = layout.unpack_header(bytes(self.buf[:layout.CRC_SPAN]), self.where, self.size)
        return self._geometry

    def format(self, geometry: Geometry) -> None:
        """Write a fresh header and zero every channel's control words (host side only)."""
        geometry.check(self.where, self.size)
        self.buf[:layout.HEADER_SIZE] = bytes(layout.HEADER_SIZE)
        for i in range(geometry.channel_count):
            base = geometry.channel_base(i)
            self.buf[base:base + layout.PAGE] = bytes(layout.PAGE)
        self.buf[:layout.CRC_SPAN] = layout.pack_header(geometry)
        self._geometry = geometry

    def prefault(self, offset: int, length: int) -> None:
        """Map the pages of [offset, offset+length) into this process now, writable.

        A /dev/shm mapping is filled lazily, one fault per 4 KiB page on first touch; staging chunks are used
        in turn, so without this every chunk's first pass runs at a fraction of memcpy speed. PCI BARs are
        mapped whole at mmap time and need nothing. Kernels before 5.14 lack MADV_POPULATE_WRITE: then the
        first pass simply stays slower.
        """
        if self.kind != "file":
            return
        with contextlib.suppress(OSError, ValueError):
            self.mm.madvise(MADV_POPULATE_WRITE, offset, length)

    def agent_words(self) -> tuple[int, int, int]:
        """(heartbeat, pid, state) of the host agent serving this region."""
        return (self.u64[layout.AGENT_HEARTBEAT >> 3], self.u32[layout.AGENT_PID >> 2],
                self.u32[layout.AGENT_STATE >> 2])

    def set_agent(self, pid: int | None = None, state: int | None = None, beat: bool = False) -> None:
        if pid is not None:
            self.u32[layout.AGENT_PID >> 2] = pid
        if state is not None:
            self.u32[layout.AGENT_STATE >> 2] = state
        if beat:
            i = layout.AGENT_HEARTBEAT >> 3
            self.u64[i] = (self.u64[i] + 1) & 0xFFFFFFFFFFFFFFFF

    def address(self, offset: int = 0) -> int:
        """The virtual address of byte `offset` of the mapping in this process."""
        if not 0 <= offset < self.size:
            raise IndexError(f"{self.where}: offset {offset} outside the {self.size}-byte region")
        return ctypes.addressof(ctypes.c_char.from_buffer(self.mm)) + offset

    def close(self) -> None:
        for view in (self.u32, self.u64, self.buf):
            view.release()
        with contextlib.suppress(BufferError):  # a caller still holds a view; the mapping goes with it
            self.mm.close()
        if self.lock_fd != self.fd:
            os.close(self.lock_fd)
        os.close(self.fd)

    def __enter__(self) -> Region:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_region_file(path: str) -> int:
    """An O_RDWR descriptor of the regular file at `path`; RegionError with what to do otherwise.

    O_NOFOLLOW: a link planted in a world-writable directory such as /dev/shm must never make the host agent
    open (and format) the file it points to. O_NONBLOCK: opening a FIFO or device planted under a region's name
    must not block; it is refused by the S_ISREG check right after.
    """
    flags = os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise RegionError(f"{path} does not exist; create it with 'orion-shm create -i N'") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise RegionError(f"{path} is a symbolic link; a region must be a regular file (remove the link and "
                              "create the region with 'orion-shm create')") from None
        raise RegionError(f"cannot open {path}: {exc.strerror}; run as root or as the region's owner "
                          "(see 'orion-shm inspect')") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise RegionError(f"{path} is not a regular file; remove it and create the region with 'orion-shm create'")
    return fd


def _map(fd: int, size: int, where: str) -> mmap.mmap:
    try:
        return mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    except (OSError, ValueError) as exc:
        raise RegionError(f"{where}: cannot map {size} bytes: {exc}") from None


def find_ivshmem_devices(root: str = PCI_ROOT) -> list[str]:
    """sysfs paths of ivshmem-plain devices, sorted by PCI address."""
    found = []
    for dev in sorted(glob.glob(os.path.join(root, "*"))):
        try:
            vendor = Path(dev, "vendor").read_text().strip()
            device = Path(dev, "device").read_text().strip()
        except OSError:
            continue
        if (vendor, device) == (IVSHMEM_VENDOR, IVSHMEM_DEVICE):
            found.append(dev)
    return found


_INDEX = re.compile(r"0|[1-9][0-9]*", re.ASCII)
_INDEX_DIGITS = len(str(layout.REGION_INDEX_RANGE[1]))


def region_index(name: str) -> int | None:
    """N for a file named orionsock<N>, or None: the name of no region.

    N is ASCII decimal, without sign, blank or leading zero (orionsock007 is not region 7's file), and within
    layout.REGION_INDEX_RANGE (0..9999, Orion's range): the indices `orion-shm create`, `inspect` and `remove`
    and the libvirt templates take, and the k8s plugin's gpu*100+slot stays within it, so no tool of ours
    makes another name, and none could inspect or remove one. Anyone may name a file in /dev/shm, so nothing
    else is trusted: `str.isdigit` is true for '²' or '①', which `int` refuses, and `int` reads Arabic-Indic
    or fullwidth digits as another number; a name of 250 digits would only be a number nobody made.
    """
    if not name.startswith(SHM_PREFIX):
        return None
    suffix = name[len(SHM_PREFIX):]
    if len(suffix) > _INDEX_DIGITS or _INDEX.fullmatch(suffix) is None:
        return None
    index = int(suffix)
    return index if layout.REGION_INDEX_RANGE[0] <= index <= layout.REGION_INDEX_RANGE[1] else None


class RegionFiles(NamedTuple):
    paths: list[str]  # the orionsock<N> files, by index
    ignored: list[str]  # the other names that start with orionsock (for a log line; not served, never opened)


def scan_region_files(directory: str) -> RegionFiles:
    """Every name of `directory` that starts with orionsock, as region files or names of no region (see
    region_index). OSError when the directory cannot be read: unlike an empty one, that says nothing about
    which regions are gone."""
    found, ignored = [], []
    for name in os.listdir(directory):
        index = region_index(name)
        if index is not None:
            found.append((index, os.path.join(directory, name)))
        elif name.startswith(SHM_PREFIX):
            ignored.append(name)
    return RegionFiles([path for _, path in sorted(found)], sorted(ignored))


def list_region_files(directory: str = SHM_DIR) -> list[str]:
    """orionsock<N> files in `directory`, by index; any other name is passed over, and a directory that cannot
    be read has none."""
    try:
        return scan_region_files(directory).paths
    except OSError:
        return []
