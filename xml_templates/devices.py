"""The pieces of domain XML that are Orion's: the ivshmem-plain `<shmem>` device and the `orion:` namespace.

Both the generated domains (xml_templates/domain.py) and the in-place editor (host_agent/kvm/libvirt_gateway.py,
which attaches it for host_agent/kvm/region_attach.py) build our device here, so a device attached to an existing
domain and one in a generated domain are the same bytes, and detach can recognise ours by the user alias
libvirt keeps (`ua-` prefix). Reading a `<shmem>`'s `<size>` back (the in-place editor from libvirt's XML, the
qemu hook from the XML libvirt passes it) is here too, once, so both read every unit libvirt accepts alike.
"""
from __future__ import annotations

import re

from lxml import etree

from ivshmem.layout import MIB, region_index_allowed, region_size_allowed
from ivshmem.layout import REGION_INDEX_RANGE as INDEX_RANGE
from ivshmem.layout import REGION_SIZE_RANGE_MIB as SIZE_RANGE_MIB
from ivshmem.region import SHM_PREFIX

from .errors import DomainXmlError

# Namespace of our <metadata> child: <orion:regions xmlns:orion=ORION_NS>.
ORION_NS = "http://orion-vgpu.org/xmlns/libvirt/1"
ORION_PREFIX = "orion"
ALIAS_PREFIX = "ua-orion-"
# libvirt's scaled-integer units (the `unit` pattern of its schema, basictypes.rng, and virScaleInteger), in any
# case: b, byte, bytes; k, m, g, t, p, e alone or with "iB" (powers of 1024) or with "B" (powers of 1000). An
# empty or absent unit means bytes for <shmem><size> (libvirt parses it with a scale of 1).
_UNIT_BYTES = {"": 1, "b": 1, "byte": 1, "bytes": 1}
for _power, _letter in enumerate("kmgtpe", start=1):
    _UNIT_BYTES.update({_letter: 1024**_power, f"{_letter}ib": 1024**_power, f"{_letter}b": 1000**_power})
_UNITS_TEXT = "b, bytes, k or KiB, KB, M or MiB, MB, G or GiB, GB, T or TiB, TB, P, PiB, PB, E, EiB, EB"
_ULLONG_MAX = 2**64 - 1  # libvirt holds the size in an unsigned long long and refuses more
_DIGITS = re.compile(r"[0-9]+")  # ASCII only: str.isdigit() also takes '²', which int() then refuses


def region_name(index: int) -> str:
    """The region file name QEMU opens under /dev/shm for region `index`: orionsock<index>."""
    return f"{SHM_PREFIX}{index}"


def shmem_alias(index: int) -> str:
    """The user alias our `<shmem>` device carries, e.g. ua-orion-orionsock0 (libvirt keeps `ua-` aliases)."""
    return ALIAS_PREFIX + region_name(index)


def check_region_index(index: int) -> None:
    """Orion's index range (orion-shm's), so every region we attach can also be made with orion-shm."""
    low, high = INDEX_RANGE
    if not region_index_allowed(index):
        raise DomainXmlError(f"region index {index} is out of range: it must be in [{low}, {high}]")


def check_region_size(size_mib: int) -> None:
    """Orion's size range, and a power of two: QEMU 7.2 maps the whole region as PCI BAR 2 and aborts on any
    other size (`pci_register_bar: Assertion 'is_power_of_2(size)' failed`, checked with ivshmem-plain on a
    100 MiB memory-backend-file); libvirt 9.0 defines such a domain but refuses to start it ("XML error: shmem
    size must be a power of two"). So a wrong size is refused here, not found at `virsh start`."""
    low, high = SIZE_RANGE_MIB
    if not region_size_allowed(size_mib):
        raise DomainXmlError(f"region size {size_mib} MiB is not allowed: it must be a power of two in "
                             f"[{low}, {high}] MiB (QEMU maps the region as a PCI BAR, which must be a power of two)")


def shmem_element(index: int, size_mib: int) -> etree._Element:
    """`<shmem name='orionsock<N>'><model type='ivshmem-plain'/><size unit='M'>S</size><alias name=…/></shmem>`.

    ivshmem-plain (no doorbell server): the wire polls shared memory, so no chardev or MSI-X is needed."""
    check_region_index(index)
    check_region_size(size_mib)
    shmem = etree.Element("shmem", name=region_name(index))
    etree.SubElement(shmem, "model", type="ivshmem-plain")
    size = etree.SubElement(shmem, "size", unit="M")
    size.text = str(size_mib)
    etree.SubElement(shmem, "alias", name=shmem_alias(index))
    return shmem


def shmem_xml(index: int, size_mib: int) -> str:
    """The device as the XML string libvirt's attachDeviceFlags/detachDeviceFlags take."""
    return etree.tostring(shmem_element(index, size_mib), encoding="unicode")


def shmem_size_mib(shmem: etree._Element) -> int:
    """A `<shmem>` device's `<size>` in MiB, read in any unit libvirt accepts (libvirt itself writes unit='M').

    DomainXmlError, one line saying what to write instead, when there is no `<size>`, its number or unit is not
    one libvirt reads, it exceeds what libvirt holds, or it is not a whole number of MiB (no Orion region is)."""
    where = f"<shmem name='{_shown(shmem.get('name', ''))}'>"
    size = shmem.find("size")
    text = "" if size is None else (size.text or "").strip()
    if size is None or not text:
        raise DomainXmlError(f"{where} has no <size>; give it one, e.g. <size unit='M'>128</size>")
    unit = size.get("unit", "")
    written = f"<size unit='{_shown(unit)}'>{_shown(text)}</size>"
    factor = _UNIT_BYTES.get(unit.lower())
    if factor is None:
        raise DomainXmlError(f"{where} has an unreadable {written}: the unit is not one of libvirt's "
                             f"({_UNITS_TEXT}); write e.g. <size unit='M'>128</size>")
    if not _DIGITS.fullmatch(text):
        raise DomainXmlError(f"{where} has an unreadable {written}: the size must be a whole number in decimal "
                             "digits; write e.g. <size unit='M'>128</size>")
    nbytes = int(text) * factor
    if nbytes > _ULLONG_MAX:
        raise DomainXmlError(f"{where} has {written}, more than libvirt can hold (2^64 - 1 bytes); write e.g. "
                             "<size unit='M'>128</size>")
    if nbytes % MIB:
        raise DomainXmlError(f"{where} size is {nbytes} bytes, not a whole number of MiB; Orion regions are a "
                             "power of two of MiB, e.g. <size unit='M'>128</size>")
    return nbytes // MIB


def _shown(text: str) -> str:
    """Text from the XML as one bounded line: escapes (\\n, \\xb2) instead of line breaks and odd characters."""
    shown = ascii(text)[1:-1]
    return shown if len(shown) <= 40 else shown[:40] + "..."
