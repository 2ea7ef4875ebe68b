"""The pieces of domain XML that are Orion's: the ivshmem-plain `<shmem>` device and the `orion:` namespace.

Both the generated domains (xml_templates/domain.py) and the in-place editor (host_agent/libvirt_gateway.py)
build our device here, so a device attached to an existing domain and one in a generated domain are the
same bytes, and detach can recognise ours by the user alias libvirt keeps (`ua-` prefix).
"""
from __future__ import annotations

from lxml import etree

from ivshmem.layout import REGION_INDEX_RANGE as INDEX_RANGE
from ivshmem.layout import REGION_SIZE_RANGE_MIB as SIZE_RANGE_MIB
from ivshmem.region import SHM_PREFIX

from .errors import DomainXmlError

# Namespace of our <metadata> child: <orion:regions xmlns:orion=ORION_NS>.
ORION_NS = "http://orion-vgpu.org/xmlns/libvirt/1"
ORION_PREFIX = "orion"
ALIAS_PREFIX = "ua-orion-"


def region_name(index: int) -> str:
    """The region file name QEMU opens under /dev/shm for region `index`: orionsock<index>."""
    return f"{SHM_PREFIX}{index}"


def shmem_alias(index: int) -> str:
    """The user alias our `<shmem>` device carries, e.g. ua-orion-orionsock0 (libvirt keeps `ua-` aliases)."""
    return ALIAS_PREFIX + region_name(index)


def check_region_index(index: int) -> None:
    """Orion's index range (orion-shm's), so every region we attach can also be made with orion-shm."""
    low, high = INDEX_RANGE
    if not low <= index <= high:
        raise DomainXmlError(f"region index {index} is out of range: it must be in [{low}, {high}]")


def check_region_size(size_mib: int) -> None:
    """Orion's size range, and a power of two: QEMU 7.2 maps the whole region as PCI BAR 2 and aborts on any
    other size (`pci_register_bar: Assertion 'is_power_of_2(size)' failed`, checked with ivshmem-plain on a
    100 MiB memory-backend-file); libvirt 9.0 defines such a domain but refuses to start it ("XML error: shmem
    size must be a power of two"). So a wrong size is refused here, not found at `virsh start`."""
    low, high = SIZE_RANGE_MIB
    if not low <= size_mib <= high or size_mib & (size_mib - 1):
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
