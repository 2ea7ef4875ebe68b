"""Our record in a domain's `<metadata>`: which Orion regions the domain uses, their sizes, whether they persist.

    <metadata>
      <orion:regions xmlns:orion="http://orion-vgpu.org/xmlns/libvirt/1">
        <orion:region index="0" size-mib="128" persistent="no"/>
      </orion:regions>
    </metadata>

The generator (domain.py) writes it, the in-place editor (host_agent/kvm/libvirt_gateway.py) rewrites it on attach
and detach, and the qemu hook reads it on prepare/release (persistent="no" regions are removed on release).
Only building and reading the element belongs here, no libvirt calls. libvirt's metadata API speaks the element
*without* its namespace (checked on libvirt 9.0): `virDomain.metadata(VIR_DOMAIN_METADATA_ELEMENT, ORION_NS)`
returns `<regions><region …/></regions>`, and `setMetadata(…, xml, ORION_PREFIX, ORION_NS)` wants that bare form
(a namespaced one fails with "failed to create a new XML namespace") and stores it as `<orion:regions>`. So
`regions_xml` gives the bare form, `regions_element` the namespaced one for a domain tree, and `read_regions`
reads a domain tree or either form of the element.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from lxml import etree

from .devices import ORION_NS, ORION_PREFIX, check_region_index, check_region_size
from .errors import DomainXmlError

REGIONS_TAG = f"{{{ORION_NS}}}regions"
REGION_TAG = f"{{{ORION_NS}}}region"
_NSMAP = {ORION_PREFIX: ORION_NS}


@dataclass(frozen=True, order=True)
class RegionRecord:
    """One Orion region a domain uses: /dev/shm/orionsock<index>, size_mib MiB; kept after release if persistent."""

    index: int
    size_mib: int
    persistent: bool = False


def _build(regions: Iterable[RegionRecord], regions_tag: str, region_tag: str) -> etree._Element:
    root = etree.Element(regions_tag, nsmap=_NSMAP if regions_tag == REGIONS_TAG else None)
    seen: set[int] = set()
    for region in regions:
        check_region_index(region.index)
        check_region_size(region.size_mib)
        if region.index in seen:
            raise DomainXmlError(f"region {region.index} is listed twice")
        seen.add(region.index)
        etree.SubElement(root, region_tag, {"index": str(region.index), "size-mib": str(region.size_mib),
                                            "persistent": "yes" if region.persistent else "no"})
    return root


def regions_element(regions: Iterable[RegionRecord]) -> etree._Element:
    """`<orion:regions>` with one `<orion:region>` per record, in the order given; checks every record."""
    return _build(regions, REGIONS_TAG, REGION_TAG)


def regions_xml(regions: Iterable[RegionRecord]) -> str:
    """The bare `<regions><region …/></regions>` string that virDomain.setMetadata takes (see the docstring)."""
    return etree.tostring(_build(regions, "regions", "region"), encoding="unicode")


def find_regions_element(tree: etree._Element) -> etree._Element | None:
    """Our record in a domain tree, or `tree` itself if it is the record (either form); None if absent."""
    if tree.tag in (REGIONS_TAG, "regions"):
        return tree
    return tree.find(f"metadata/{REGIONS_TAG}")


def read_regions(tree: etree._Element) -> list[RegionRecord]:
    """The regions recorded in a domain tree (or in the record itself, either form); [] when there is none.

    A record we cannot read raises DomainXmlError rather than being skipped: a hook that silently forgot a
    region would leave it behind, or remove one still in use."""
    element = find_regions_element(tree)
    if element is None:
        return []
    records = []
    for region in element.iter(REGION_TAG if element.tag == REGIONS_TAG else "region"):
        try:
            index, size_mib = int(region.get("index", "")), int(region.get("size-mib", ""))
        except ValueError:
            raise DomainXmlError(f"unreadable Orion metadata: {etree.tostring(region, encoding='unicode')}") from None
        persistent = region.get("persistent", "no")
        if persistent not in ("yes", "no"):
            raise DomainXmlError(f"unreadable Orion metadata: persistent={persistent!r} (want 'yes' or 'no')")
        records.append(RegionRecord(index, size_mib, persistent == "yes"))
    return records
