"""A region file made ready for QEMU's `<shmem>` device: the one readiness policy of the qemu hook and attach.

Two places hand a region to QEMU: the qemu hook's prepare (libvirt_hooks/regions.py; root, just before QEMU
opens the file) and `orion-shm attach` (host_agent/kvm/region_attach.py; an admin command, which may run while the
domain is down, and whose live attach has QEMU open the file at once, with no hook run). Both call
`make_ready`, so a region is judged the same way whichever comes first:

- missing: created as `orion-shm create` does (formatted, given to QEMU's user, 0660); one that another
  process creates meanwhile is checked like any existing one;
- refused, in one line that says what to do, is what cannot be put right without losing the region: not a
  regular file, smaller than the device (QEMU refuses it), or laid out for more than the device maps (the
  guest refuses the header);
- one QEMU's user cannot open is handed to it (chown QEMU's user:group, mode 0660), as `orion-shm create`
  hands over a new one, rather than refused: the hook exists to prepare regions, and refusing at attach what
  the hook would fix at the domain's next start helps no one. Only a hand-over this process may not make
  (attach run by a user other than root) is refused, with the chown to run.

Nothing here talks to libvirt (the hook must never load it) or parses XML; the caller knows the device size.
"""
from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass

from ivshmem.errors import RegionNotFormatted, WireError
from ivshmem.layout import MIB
from ivshmem.region import Region, region_path

from .. import shm_admin
from ..errors import ServiceError
from ..server_conf import ShmSettings


class RegionNotReady(ServiceError):
    """An existing region QEMU cannot be given; the message is one line that says what to do."""


@dataclass(frozen=True)
class ReadyRegion:
    """What `make_ready` found or did: the file, whether it created it (an undo removes only those), a note."""

    path: str
    created: bool
    note: str


def make_ready(index: int, size_mib: int, directory: str, settings: ShmSettings, domain: str) -> ReadyRegion:
    """Make `directory`/orionsock<index> ready for `domain`'s device of `size_mib` MiB (see the module docstring).

    Raises RegionNotReady for an existing region that cannot be used, shm_admin.ShmError when creating fails."""
    path = region_path(index, directory)
    if not os.path.lexists(path):
        try:
            made = shm_admin.create(index, size_mib, directory=directory, settings=settings)
        except shm_admin.ShmError:
            if not os.path.lexists(path):  # else: created meanwhile by someone else; check theirs below
                raise
        else:
            note = (f"created {made.path}: {made.size // MIB} MiB, {made.owner}:{made.group} {made.mode:04o}"
                    + (f"; {made.note}" if made.note else ""))
            return ReadyRegion(path, True, note)
    return ReadyRegion(path, False, _check_existing(index, size_mib, path, settings, domain))


def _check_existing(index: int, size_mib: int, path: str, settings: ShmSettings, domain: str) -> str:
    st = os.lstat(path)
    remove = shm_admin.remove_command(index, path)  # the directory too, when it is not /dev/shm
    if not stat.S_ISREG(st.st_mode):
        kind = "directory" if stat.S_ISDIR(st.st_mode) else "symbolic link" if stat.S_ISLNK(st.st_mode) else \
            "special file"
        raise RegionNotReady(f"{path} is a {kind}, not a region file; remove it ({remove}) so "
                             "that it is made again")
    if st.st_size < size_mib * MIB:
        fits = 1 << max(st.st_size // MIB, 1).bit_length() - 1  # device sizes are powers of two
        raise RegionNotReady(f"{path} is {st.st_size / MIB:g} MiB but domain {domain} wants {size_mib} MiB (its "
                             "<shmem> <size>) and QEMU refuses a smaller file; remove the region "
                             f"({remove}) so that it is made again, or give the device a size of at most {fits} MiB "
                             "(orion-shm attach -s)")
    usable = _usable_size(path, st.st_size)
    if usable > size_mib * MIB:
        raise RegionNotReady(f"{path} is laid out for {usable / MIB:g} MiB but domain {domain}'s device maps only "
                             f"{size_mib} MiB (its <shmem> <size>), so the guest could not use it; remove the "
                             f"region ({remove}) so that it is made again, or give the device a "
                             f"size of {usable // MIB} MiB (orion-shm attach -s)")
    qemu = _qemu_ids(settings)
    if qemu is None:
        return (f"{path} exists ({st.st_size // MIB} MiB); left as it is (QEMU's user {settings.user}:"
                f"{settings.group} of server.conf does not exist here, so who may open it is not checked)")
    if _can_read_write(st, *qemu):
        return f"{path} exists ({st.st_size // MIB} MiB); left as it is"
    _hand_over(path, st, qemu[0], qemu[1], settings)
    return (f"{path} was {st.st_uid}:{st.st_gid} {stat.S_IMODE(st.st_mode):04o}, which QEMU "
            f"({settings.user}:{settings.group}) cannot open; gave it to them with mode 0660")


def _usable_size(path: str, file_size: int) -> int:
    """The size the region's header describes; for a blank file, the file's size (the agent formats it so).

    QEMU accepts a file larger than the device, but the guest sees only the device's BAR and refuses a header
    describing more than it can map."""
    try:
        with Region.open(path) as opened:
            return opened.geometry.region_size
    except RegionNotFormatted:
        return file_size
    except WireError as exc:
        raise RegionNotReady(f"{exc}; see 'orion-shm inspect', or remove the region so that it is made "
                             "again") from None


def _qemu_ids(settings: ShmSettings) -> tuple[int, int, list[int]] | None:
    """(uid, gid, all its groups) of the user QEMU runs as, or None when that user or group is unknown here."""
    ids = shm_admin.qemu_owner_ids(settings)
    if ids is None:
        return None
    try:
        return ids[0], ids[1], os.getgrouplist(settings.user, ids[1])
    except OSError:
        return None


def _can_read_write(st: os.stat_result, uid: int, gid: int, groups: list[int]) -> bool:
    """The kernel's rule: the owner's bits for the owner, else the group's for a member, else the others'."""
    mode = st.st_mode
    if st.st_uid == uid:
        return mode & 0o600 == 0o600
    if st.st_gid == gid or st.st_gid in groups:
        return mode & 0o060 == 0o060
    return mode & 0o006 == 0o006


def _hand_over(path: str, st: os.stat_result, uid: int, gid: int, settings: ShmSettings) -> None:
    """chown + chmod 0660 through a descriptor of the very file judged: /dev/shm is writable by everyone, so
    a name that a link replaced meanwhile must not make root give away the link's target."""
    chown = f"chown {settings.user}:{settings.group} {path} && chmod 0660 {path}"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOENT):
            raise RegionNotReady(f"{path} was replaced or removed while it was checked; try again") from None
        raise RegionNotReady(f"{path} cannot be opened by QEMU's user {settings.user}:{settings.group}, and this "
                             f"user cannot open it either ({exc.strerror}): run as root, or '{chown}'") from None
    try:
        now = os.fstat(fd)
        if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
            raise RegionNotReady(f"{path} was replaced while it was checked; try again")
        os.fchown(fd, uid, gid)
        os.fchmod(fd, 0o660)
    except PermissionError:
        owner = shm_admin.user_name(st.st_uid)
        raise RegionNotReady(f"{path} (owner {owner}, mode {stat.S_IMODE(st.st_mode):04o}) cannot be "
                             f"opened by QEMU's user {settings.user}:{settings.group}, and only root may give it "
                             f"to them: run as root, or '{chown}'") from None
    finally:
        os.close(fd)

