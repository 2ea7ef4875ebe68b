"""What `orion-shm attach/detach` must change in a domain, decided from its XML alone (no libvirt calls).

This is the policy half of the in-place editor (Nova's designer beside its host): libvirt_gateway.py reads a
domain's live and persistent XML, this module reads them and answers "which definition needs our device,
which needs a new metadata record, and is anything in the way", and the workflows of region_attach.py carry
that out through the gateway, with libvirt's own calls (attachDeviceFlags, detachDeviceAlias, setMetadata).
libvirt, not us, rewrites the domain, so nothing we do not model is ever re-serialised by us: everything that
is not ours survives as it was.

Ours is recognised only by marks we set: the `ua-orion-orionsock<N>` alias of the `<shmem>` device
(xml_templates/devices.py builds it) and the `<orion:regions>` metadata record (xml_templates/metadata.py).
A `<shmem name='orionsock<N>'>` without our alias belongs to someone else; we neither reuse nor remove it.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from lxml import etree

from xml_templates.devices import region_name, shmem_alias, shmem_size_mib
from xml_templates.errors import DomainXmlError
from xml_templates.metadata import REGIONS_TAG, RegionRecord, read_regions

from ..errors import ServiceError

LIVE, CONFIG = "live", "config"  # the two definitions of a domain, as virsh names its flags


def scope_text(scope: str) -> str:
    """A definition as messages name it: the running domain (LIVE) or the persistent definition (CONFIG)."""
    return "running domain" if scope == LIVE else "persistent definition"


class EditConflict(ServiceError):
    """The domain holds something in the way of the change asked for; the message says what to do."""


@dataclass(frozen=True)
class RegionState:
    """What one definition (live or persistent) of a domain holds of region N."""

    index: int
    device_size_mib: int | None  # our <shmem>'s size; None when our device is absent
    foreign: bool  # a <shmem name='orionsock<N>'> that we did not attach
    records: tuple[RegionRecord, ...] = ()  # our whole metadata record, every region

    @property
    def record(self) -> RegionRecord | None:
        return next((r for r in self.records if r.index == self.index), None)


def read_state(domain_xml: str, index: int) -> RegionState:
    """Region `index` as the domain XML (virDomain.XMLDesc) shows it."""
    domain = etree.fromstring(domain_xml.encode())
    ours = our_shmem(domain, index)
    foreign = [s for s in domain.iterfind("devices/shmem") if s.get("name") == region_name(index) and s is not ours]
    return RegionState(index=index, device_size_mib=None if ours is None else _device_size_mib(ours),
                       foreign=bool(foreign), records=tuple(read_regions(domain)))


def our_shmem(domain: etree._Element, index: int) -> etree._Element | None:
    """Our `<shmem>` for region `index` (found by its alias), or None."""
    alias = shmem_alias(index)
    return next((s for s in domain.iterfind("devices/shmem") if s.find(f"alias[@name='{alias}']") is not None),
                None)


def _device_size_mib(shmem: etree._Element) -> int | None:
    """Our device's size in MiB; None, as if absent, when libvirt's XML holds a size we cannot read (libvirt
    writes whole MiB, unit='M', so that is a domain edited by hand)."""
    try:
        return shmem_size_mib(shmem)
    except DomainXmlError:
        return None


def without_our_metadata(domain_xml: str) -> str | None:
    """The domain XML without its `<metadata>`, if our record is all that element holds; else None.

    libvirt 9.0's setMetadata removes our element but leaves an empty `<metadata/>` behind, so a domain that
    had none would not come back byte for byte after attach + detach. For the persistent definition the
    gateway redefines the domain from this instead. The edit is in place: only `<metadata>` (and its tail
    whitespace) goes; every other node stays as parsed."""
    domain = etree.fromstring(domain_xml.encode())
    metadata = domain.find("metadata")
    if metadata is None:
        return None
    children = [c for c in metadata if isinstance(c.tag, str) or c.tag is etree.Comment]
    if any(c.tag != REGIONS_TAG for c in children) or (metadata.text or "").strip():
        return None
    previous = metadata.getprevious()
    if previous is not None:  # keep the layout: the next element starts where <metadata> did
        previous.tail = metadata.tail
    else:
        domain.text = metadata.tail
    domain.remove(metadata)
    return etree.tostring(domain, encoding="unicode")


# --- attach ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Step:
    """The change one definition needs: add/remove our device, and the new metadata record (None: unchanged;
    an empty tuple: remove our record)."""

    scope: str
    device: bool = False
    records: tuple[RegionRecord, ...] | None = None


@dataclass(frozen=True)
class Plan:
    index: int
    size_mib: int
    steps: tuple[Step, ...] = field(default=())

    @property
    def changes(self) -> bool:
        return any(s.device or s.records is not None for s in self.steps)


def plan_attach(states: Mapping[str, RegionState], index: int, size_mib: int | None, persistent: bool | None,
                default_size_mib: int) -> Plan:
    """What attaching region `index` to the definitions in `states` (scope → state) changes.

    The size is the one asked for, else that of our device already attached, else `default_size_mib`;
    `persistent` None keeps what the record says (attaching twice changes nothing)."""
    for scope, state in states.items():
        if state.foreign:
            raise EditConflict(f"the {scope_text(scope)} already has a <shmem name='{region_name(index)}'> that "
                               f"orion-shm did not attach (no alias {shmem_alias(index)}); remove it with "
                               "'virsh detach-device', or use another index (-i)")
    attached = {s.device_size_mib for s in states.values() if s.device_size_mib is not None}
    recorded = {s.record.size_mib for s in states.values() if s.record is not None}
    size = size_mib if size_mib is not None else min(attached | recorded, default=default_size_mib)
    for scope, state in states.items():
        if state.device_size_mib not in (None, size):
            raise EditConflict(f"{region_name(index)} is already attached to the {scope_text(scope)} with "
                               f"{state.device_size_mib} MiB, not {size} MiB; detach it first to change its size")
    steps = []
    for scope, state in states.items():
        keep = state.record.persistent if state.record is not None else False
        wanted = RegionRecord(index, size, keep if persistent is None else persistent)
        records = _with(state.records, wanted)
        steps.append(Step(scope, device=state.device_size_mib is None,
                          records=None if records == state.records else records))
    return Plan(index, size, tuple(steps))


def plan_detach(states: Mapping[str, RegionState], index: int) -> Plan:
    """What detaching region `index` from the definitions in `states` changes; only our device and record."""
    steps = []
    for scope, state in states.items():
        records = tuple(r for r in state.records if r.index != index)
        steps.append(Step(scope, device=state.device_size_mib is not None,
                          records=None if records == state.records else records))
    plan = Plan(index, 0, tuple(steps))
    foreign = [scope for scope, state in states.items() if state.foreign]
    if foreign and not plan.changes:
        raise EditConflict(f"the <shmem name='{region_name(index)}'> in the {scope_text(foreign[0])} was not "
                           f"attached by orion-shm (no alias {shmem_alias(index)}), so it is left alone; "
                           "remove it with 'virsh detach-device' if it must go")
    return plan


def _with(records: Iterable[RegionRecord], wanted: RegionRecord) -> tuple[RegionRecord, ...]:
    """`records` with `wanted` in place of any record of the same index (appended if new)."""
    out, placed = [], False
    for r in records:
        if r.index == wanted.index:
            out.append(wanted)
            placed = True
        else:
            out.append(r)
    if not placed:
        out.append(wanted)
    return tuple(out)

