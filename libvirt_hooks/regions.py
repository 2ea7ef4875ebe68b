"""What the qemu hook does to a domain's Orion regions: find them in the domain XML, prepare, release.

A domain's Orion regions are its `<shmem name='orionsock<N>'>` devices of model ivshmem-plain (QEMU opens
<shm dir>/orionsock<N>; the device's `<size>` is the size QEMU insists on). Persistence is not a device
property, so it lives in our `<orion:regions>` metadata (xml_templates/metadata.py reads it).

`prepare` makes every region ready for QEMU with the policy `orion-shm attach` uses too
(host_agent/kvm/qemu_region.py: a missing one created as `orion-shm create` does; an existing one checked against
its device and, if QEMU's user cannot open it, handed to that user); if one region fails, the ones this call
created are removed again. `release` removes every non-persistent region, except after a start that failed in
prepare (the domain never ran; see mark_failed_start). Both then wake the host agent. Nothing here talks to
libvirt: libvirt holds its locks while a hook runs, so a libvirt call from here would deadlock.
"""
from __future__ import annotations

import contextlib
import logging
import os
import re
from dataclasses import dataclass

from lxml import etree

from host_agent import shm_admin
from host_agent.daemon import pidfile
from host_agent.kvm.qemu_region import RegionNotReady, make_ready
from host_agent.server_conf import ShmSettings
from ivshmem.region import region_path
from xml_templates.devices import shmem_size_mib
from xml_templates.errors import DomainXmlError
from xml_templates.metadata import read_regions

log = logging.getLogger(__name__)
_REGION_NAME = re.compile(r"orionsock(\d+)\Z")


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
        try:
            size_mib = shmem_size_mib(shmem)
        except DomainXmlError as exc:
            raise HookError(str(exc)) from None
        regions.append(DomainRegion(index, size_mib, index in persistent))
    return (root.findtext("uuid") or "").strip(), regions


# --- prepare ------------------------------------------------------------------------------------------------
def prepare(domain: str, regions: list[DomainRegion], settings: ShmSettings) -> list[str]:
    """Make every region ready for QEMU (host_agent/kvm/qemu_region.py: the policy attach uses too); returns notes
    for the log. All or nothing: see the module docstring."""
    notes: list[str] = []
    with contextlib.ExitStack() as undo:
        for region in regions:
            try:
                ready = make_ready(region.index, region.size_mib, settings.path_base, settings, domain)
            except RegionNotReady as exc:
                raise HookError(str(exc)) from None
            except shm_admin.ShmError as exc:
                raise HookError(f"{exc} (region {region.index} of domain {domain})") from None
            if ready.created:
                undo.callback(_remove_quietly, region.index, settings.path_base)
            notes.append(ready.note)
        undo.pop_all()
    return notes


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
