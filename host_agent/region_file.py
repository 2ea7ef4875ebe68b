"""What oriond may do with a file named like a region: serve it, format it first, or leave it alone.

Everything here reads the file with pread and fstat, never through a mapping: a mapped file that someone
truncates raises SIGBUS in the process touching it, and oriond's main process must never be that process
(region_process.py runs each served region in a process of its own for that reason).

The rules (docs/security.md):
* only a regular file, opened without following links (/dev/shm is writable by every local user);
* a file that every local user may write is refused: whoever can write it can read and forge its sessions;
  one that every local user may read is served with a warning. Neither applies inside a sealed directory
  (one that only its owner may pass through, e.g. orion-k8s-plugin's 0700 directory of per-container
  regions): other users cannot reach a file there by any path, whatever its mode;
* a file of another user than root, oriond's own or QEMU's (server.conf [server-shm]) is served only when root
  made it for that user: `orion-shm create --owner` marks it with the extended attribute TENANT_MARK, in the
  `trusted.` namespace that only root can write. Otherwise any local user could plant an `orionsock<N>` of
  their own in /dev/shm and be given GPU sessions;
* a valid Orion header is served as it is; a file of zeros (what QEMU or `truncate` makes) is formatted, and
  so is one whose Orion header was damaged (our magic, bad fields); a file holding any other bytes is not
  ours and is never written to.
"""
from __future__ import annotations

import contextlib
import errno
import os
import pwd
import stat
from typing import NamedTuple

from ivshmem import layout
from ivshmem.errors import RegionFormatError, RegionNotFormatted, WireError
from ivshmem.region import open_region_file

from .server_conf import ShmSettings

SERVE, FORMAT, REFUSE = "serve", "format", "refuse"
TENANT_MARK = "trusted.orion.tenant"  # the uid root made a region for (orion-shm create --owner); only root sets it
_BLOCK = 1 << 20
_ZEROS = bytes(_BLOCK)


class Identity(NamedTuple):
    """What tells one file from another, and a changed file from the same one."""

    device: int
    inode: int
    size: int
    mode: int
    uid: int
    mtime_ns: int

    @classmethod
    def of(cls, st: os.stat_result) -> Identity:
        return cls(st.st_dev, st.st_ino, st.st_size, st.st_mode, st.st_uid, st.st_mtime_ns)

    def same_file(self, other: Identity) -> bool:
        return (self.device, self.inode) == (other.device, other.inode)


class Verdict(NamedTuple):
    action: str  # SERVE, FORMAT or REFUSE
    reason: str  # why (REFUSE: the one line to log, naming the file and what to do)
    warning: str = ""  # served, but something the operator should know
    identity: Identity | None = None
    channels: int = 0  # channels it has (SERVE) or will have once formatted (FORMAT)


def served_owners(settings: ShmSettings) -> frozenset[int]:
    """The uids whose region files oriond serves without a tenant mark: root, its own, and QEMU's user of
    server.conf when that user exists (QEMU and the libvirt hook make its regions)."""
    owners = {0, os.geteuid()}
    with contextlib.suppress(KeyError):
        owners.add(pwd.getpwnam(settings.user).pw_uid)
    return frozenset(owners)


def tenant_mark(fd: int) -> int | None:
    """The uid in the file's tenant mark, or None (no mark, a malformed one, or xattrs not readable here)."""
    try:
        text = os.getxattr(fd, TENANT_MARK).decode("ascii")
    except (OSError, UnicodeDecodeError):
        return None
    return int(text) if text.isdigit() and len(text) <= 10 else None


def examine(path: str, channels: int = layout.DEFAULT_CHANNELS, owners: frozenset[int] | None = None) -> Verdict:
    """The verdict on `path`; never raises (a file oriond cannot even look at is refused with the reason).
    `owners`: the uids served without a tenant mark (served_owners); None serves any owner (a region named on
    the command line)."""
    try:
        fd = open_region_file(path)
    except WireError as exc:
        return Verdict(REFUSE, str(exc))
    try:
        identity = Identity.of(os.fstat(fd))
        if owners is not None and identity.uid not in owners and tenant_mark(fd) != identity.uid:
            return Verdict(REFUSE, f"{path} belongs to uid {identity.uid}, and root did not make it for that user: "
                                   "oriond serves another user's region only when root created it with "
                                   "'orion-shm create -i N --owner USER' (so that no local user can plant a "
                                   "region and get GPU sessions; docs/security.md)", identity=identity)
        return _judge(path, fd, identity, channels)
    except OSError as exc:
        return Verdict(REFUSE, f"{path}: cannot read it: {exc.strerror or exc}")
    finally:
        os.close(fd)


def sealed_directory(path: str) -> str | None:
    """The nearest directory on the way to `path` that gives neither its group nor others search permission
    (so only its owner and root pass through it), or None. A file under one is out of reach of other local
    users by any path: they cannot open it, nor link it elsewhere, whatever the file's own mode."""
    directory = os.path.dirname(os.path.realpath(path))
    while True:
        try:
            mode = os.stat(directory).st_mode
        except OSError:
            return None
        if not mode & (stat.S_IXGRP | stat.S_IXOTH):
            return directory
        parent = os.path.dirname(directory)
        if parent == directory:
            return None
        directory = parent


def _judge(path: str, fd: int, identity: Identity, channels: int) -> Verdict:
    mode = stat.S_IMODE(identity.mode)
    if mode & (stat.S_IROTH | stat.S_IWOTH) and sealed_directory(path) is not None:
        mode &= ~(stat.S_IROTH | stat.S_IWOTH)  # nobody but the directory's owner reaches the file
    if mode & stat.S_IWOTH:
        return Verdict(REFUSE, f"{path} is writable by every local user (mode {mode:04o}), who could then read and "
                               "forge its sessions' data; oriond does not serve it. Give it to its one tenant: "
                               "'chmod o-rw' it, or recreate it with 'orion-shm create --owner USER' "
                               "(docs/security.md)", identity=identity)
    warning = ""
    if mode & stat.S_IROTH:
        warning = (f"{path} is readable by every local user (mode {mode:04o}): any of them can read its sessions' "
                   "data; 'chmod o-r' it (docs/security.md)")
    raw = os.pread(fd, layout.CRC_SPAN, 0)
    try:
        geometry = layout.unpack_header(raw, path, identity.size)
        return Verdict(SERVE, "", warning, identity, geometry.channel_count)
    except RegionNotFormatted:
        offset = first_nonzero_byte(fd, identity.size)
        if offset is not None:
            return Verdict(REFUSE, f"{path} holds data that is not an Orion region (a non-zero byte at offset "
                                   f"{offset}, no Orion header); oriond leaves it alone. Remove it, or create the "
                                   "region with 'orion-shm create'", identity=identity)
        why = "it holds only zeros"
    except RegionFormatError as exc:
        if raw[:len(layout.MAGIC)] != layout.MAGIC:
            return Verdict(REFUSE, f"{exc}; oriond leaves a file that is not an Orion region alone. Remove it, or "
                                   "create the region with 'orion-shm create'", identity=identity)
        why = f"its Orion header is damaged ({exc})"
    try:
        planned = layout.Geometry.build(identity.size, channels)
    except (ValueError, RegionFormatError) as exc:
        return Verdict(REFUSE, f"{path} cannot be formatted: {exc}; recreate it with 'orion-shm create' "
                               "(at least 16 MiB)", identity=identity)
    return Verdict(FORMAT, why, warning, identity, planned.channel_count)


def first_nonzero_byte(fd: int, size: int) -> int | None:
    """Offset of the first non-zero byte of the file, or None. Holes (SEEK_DATA/SEEK_HOLE) are skipped, so a
    fresh sparse file costs no reads; data is compared a MiB at a time."""
    offset = 0
    while offset < size:
        try:
            start = os.lseek(fd, offset, os.SEEK_DATA)
            end = min(os.lseek(fd, start, os.SEEK_HOLE), size)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # no data after offset
                return None
            if exc.errno != errno.EINVAL:  # EINVAL: the file system cannot tell; read everything
                raise
            start, end = offset, size
        position = start
        while position < end:
            block = os.pread(fd, min(_BLOCK, end - position), position)
            if not block:  # truncated while we read: what is left is no data
                return None
            if block != _ZEROS[:len(block)]:
                return position + len(block) - len(block.lstrip(b"\0"))
            position += len(block)
        offset = end
    return None
