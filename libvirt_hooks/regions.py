"""What the qemu hook does to a domain's Orion regions: find them in the domain XML, prepare, release.

A domain's Orion regions are its `<shmem name='orionsock<N>'>` devices of model ivshmem-plain (QEMU opens
<shm dir>/orionsock<N>; the device's `<size>` is the size QEMU insists on). Persistence is not a device
property, so it lives in our `<orion:regions>` metadata (xml_templates/metadata.py reads it).

`prepare` makes every region exist, at least as large as its device, readable and writable by the QEMU user,
creating missing ones with `orion-shm`'s own code (host_agent/shm_admin.py: formatted, handed to the QEMU user);
if one region fails, the ones this call created are removed again. `release` removes every non-persistent
region, except after a start that failed in prepare (the domain never ran; see mark_failed_start). Both then
wake the host agent. Nothing here talks to libvirt: libvirt holds its locks while a hook runs, so a libvirt
call from here would deadlock.
"""
from __future__ import annotations

import contextlib
import grp
import logging
import os
import pwd
import re
import stat
from dataclasses import dataclass

from lxml import etree

from host_agent import pidfile, shm_admin
from host_agent.server_conf import ShmSettings
from ivshmem.errors import RegionNotFormatted, WireError
from ivshmem.layout import MIB
from ivshmem.region import Region, region_path
from xml_templates.errors import DomainXmlError
from xml_templates.metadata import read_regions

log = logging.getLogger(__name__)
_REGION_NAME = re.compile(r"orionsock(\d+)\Z")
# libvirt's scaled-integer units (virScaleInteger); a <size> without a unit is in bytes.
_UNITS = {"b": 1, "bytes": 1, "": 1}
for _power, _letter in enumerate("kmgtpe", start=1):
    _UNITS.update({_letter: 1024**_power, f"{_letter}ib": 1024**_power, f"{_letter}b": 1000**_power})


class HookError(Exception):
    """A failure, with the one line libvirt shows the user (it refuses to start the domain on prepare)."""


@dataclass(frozen=True)
class DomainRegion:
    """One Orion region a domain's devices use."""

    index: int
    size_mib: int
    persistent: bool


def domain_regions(xml: bytes) -> tuple[str, list[DomainRegion]]:
    """The domain's UUID and the Orion regions of the domain XML libvirt passed on stdin, by device order."""
    parser = etree.XMLParser(resolve_entities=False, no_network=True, remove_comments=True)
    try:
        root = etree.fromstring(xml, parser)
    except etree.XMLSyntaxError as exc:
        raise HookError(f"the domain XML on stdin cannot be parsed ({exc}); libvirt passes the domain XML to "
                        "the hook, so a caller other than libvirt must do the same") from None
    if root.tag != "domain":
        raise HookError(f"stdin holds a <{root.tag}> element, not the <domain> XML libvirt passes to the hook")
    try:
        persistent = {record.index for record in read_regions(root) if record.persistent}
    except DomainXmlError as exc:
        raise HookError(f"{exc}; fix the domain's <metadata> (virsh edit)") from None
    regions = []
    for shmem in root.iterfind("devices/shmem"):
        match = _REGION_NAME.match(shmem.get("name", ""))
        model = shmem.find("model")
        if match is None or (model is not None and model.get("type") != "ivshmem-plain"):
            continue  # not ours: another shmem, or a doorbell/legacy ivshmem the wire does not use
        index = int(match.group(1))
        regions.append(DomainRegion(index, _size_mib(shmem, index), index in persistent))
    return (root.findtext("uuid") or "").strip(), regions


def _size_mib(shmem: etree._Element, index: int) -> int:
    size = shmem.find("size")
    where = f"<shmem name='orionsock{index}'>"
    if size is None or not (size.text or "").strip():
        raise HookError(f"{where} has no <size>; give it one, e.g. <size unit='M'>128</size>")
    unit = size.get("unit", "").lower()
    text = size.text.strip() if size.text else ""
    if not text.isdigit() or unit not in _UNITS:
        raise HookError(f"{where} has an unreadable <size unit='{size.get('unit', '')}'>{text}</size>")
    nbytes = int(text) * _UNITS[unit]
    if nbytes % MIB:
        raise HookError(f"{where} size is {nbytes} bytes, not a whole number of MiB")
    return nbytes // MIB


# --- prepare ------------------------------------------------------------------------------------------------
def prepare(domain: str, regions: list[DomainRegion], settings: ShmSettings) -> list[str]:
    """Make every region ready for QEMU; returns notes for the log. All or nothing: see the module docstring."""
    directory = settings.path_base
    notes: list[str] = []
    with contextlib.ExitStack() as undo:
        for region in regions:
            created = _ensure(domain, region, directory, settings, notes)
            if created:
                undo.callback(_remove_quietly, region.index, directory)
        undo.pop_all()
    return notes


def _ensure(domain: str, region: DomainRegion, directory: str, settings: ShmSettings, notes: list[str]) -> bool:
    """Create the region if missing (True), or check the one there (False)."""
    path = region_path(region.index, directory)
    if not os.path.lexists(path):
        try:
            made = shm_admin.create(region.index, region.size_mib, directory=directory, settings=settings)
        except shm_admin.ShmError as exc:
            if not os.path.lexists(path):  # else: created meanwhile by someone else; check theirs below
                raise HookError(f"{exc} (region {region.index} of domain {domain})") from None
        else:
            notes.append(f"created {made.path}: {made.size // MIB} MiB, {made.owner}:{made.group} "
                         f"{made.mode:04o}" + (f"; {made.note}" if made.note else ""))
            return True
    _check_existing(domain, region, path, settings, notes)
    return False


def _check_existing(domain: str, region: DomainRegion, path: str, settings: ShmSettings, notes: list[str]) -> None:
    st = os.lstat(path)
    if not stat.S_ISREG(st.st_mode):
        kind = "directory" if stat.S_ISDIR(st.st_mode) else "symbolic link" if stat.S_ISLNK(st.st_mode) else \
            "special file"
        raise HookError(f"{path} is a {kind}, not a region file; remove it (orion-shm remove {region.index}) and "
                        f"start domain {domain} again")
    if st.st_size < region.size_mib * MIB:
        raise HookError(f"{path} is {st.st_size / MIB:g} MiB but domain {domain} wants {region.size_mib} MiB "
                        "(its <shmem> <size>) and QEMU refuses a smaller file; remove the region (orion-shm remove "
                        f"{region.index}) so that it is made again, or give the device a size of at most "
                        f"{st.st_size // MIB} MiB")
    usable = _usable_size(path, st.st_size)
    if usable > region.size_mib * MIB:
        raise HookError(f"{path} is laid out for {usable / MIB:g} MiB but domain {domain}'s device maps only "
                        f"{region.size_mib} MiB (its <shmem> <size>), so the guest could not use it; remove the "
                        f"region (orion-shm remove {region.index}) so that it is made again, or give the device a "
                        f"size of {usable // MIB} MiB")
    owner = _qemu_ids(settings)
    if owner is not None and not _can_read_write(st, *owner):
        os.chown(path, owner[0], owner[1])
        os.chmod(path, 0o660)
        notes.append(f"{path} was {st.st_uid}:{st.st_gid} {stat.S_IMODE(st.st_mode):04o}, which QEMU "
                     f"({settings.user}:{settings.group}) cannot open; gave it to them with mode 0660")
    else:
        notes.append(f"{path} exists ({st.st_size // MIB} MiB); left as it is")


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
        raise HookError(f"{exc}; see 'orion-shm inspect', or remove the region so that it is made again") from None


def _qemu_ids(settings: ShmSettings) -> tuple[int, int, list[int]] | None:
    """(uid, gid, all its groups) of the user QEMU runs as, or None when that user or group is unknown here."""
    try:
        uid = pwd.getpwnam(settings.user).pw_uid
        gid = grp.getgrnam(settings.group).gr_gid
        return uid, gid, os.getgrouplist(settings.user, gid)
    except (KeyError, OSError):
        return None


def _can_read_write(st: os.stat_result, uid: int, gid: int, groups: list[int]) -> bool:
    mode = st.st_mode
    if st.st_uid == uid:
        return mode & 0o600 == 0o600
    if st.st_gid == gid or st.st_gid in groups:
        return mode & 0o060 == 0o060
    return mode & 0o006 == 0o006


def _remove_quietly(index: int, directory: str) -> None:
    with contextlib.suppress(shm_admin.ShmError):
        shm_admin.remove(index, directory, force=True)


# --- release ------------------------------------------------------------------------------------------------
def release(regions: list[DomainRegion], settings: ShmSettings) -> list[str]:
    """Remove every non-persistent region nobody but the agent still uses (this domain's QEMU has exited; the
    agent lets go once woken). A region another process maps, say a second domain given the same region, is
    kept: removing it would make the agent drop a guest that is still running."""
    notes = []
    for region in regions:
        path = region_path(region.index, settings.path_base)
        if region.persistent:
            notes.append(f"kept {path} (persistent)")
            continue
        if not os.path.lexists(path):
            continue
        others = [f"pid {pid} ({cmd[:60]})" for pid, cmd in shm_admin.users_of(path)
                  if pidfile.AGENT_NAME not in cmd]  # the agent and its session workers let go when woken
        if others:
            notes.append(f"kept {path}: still in use by {', '.join(others)}")
            continue
        try:
            shm_admin.remove(region.index, settings.path_base, force=True)
        except shm_admin.ShmError as exc:
            raise HookError(str(exc)) from None
        notes.append(f"removed {path}")
    return notes


# --- a start that failed in prepare ------------------------------------------------------------------------
# When prepare fails, libvirt still runs release for that start. The domain never ran, and prepare already
# undid what it made, so release must leave the regions as they are: the one that failed is the user's (too
# small, say), and removing it would lose it. Prepare leaves a mark for release to find.
def _failed_start_mark(state_dir: str, uuid: str) -> str:
    return os.path.join(state_dir, f"hook-prepare-failed-{uuid or 'no-uuid'}")


def mark_failed_start(state_dir: str, uuid: str) -> None:
    """Tell the coming release that this start failed in prepare (best effort: the failure is what matters)."""
    with contextlib.suppress(OSError):
        os.makedirs(state_dir, mode=0o755, exist_ok=True)
        with open(_failed_start_mark(state_dir, uuid), "w") as mark:
            mark.write("orion-hooks: prepare failed; the release of this start keeps every region\n")


def take_failed_start(state_dir: str, uuid: str) -> bool:
    """Whether the last prepare of this domain failed; the mark is removed (it covers one start only)."""
    try:
        os.unlink(_failed_start_mark(state_dir, uuid))
    except OSError:
        return False
    return True


# --- the host agent -----------------------------------------------------------------------------------------
def wake_agent(pid_path: str) -> str:
    """SIGHUP the running oriond (it rescans its regions at once); a note either way, never an error."""
    pid = pidfile.notify(pid_path)
    if pid is None:
        return (f"the host agent is not running (no live oriond in {pid_path}); the guest will find no agent "
                "until oriond is started")
    return f"told oriond (pid {pid}) to rescan its regions"
