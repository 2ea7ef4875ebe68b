"""The pieces of domain XML that are Orion's: the ivshmem-plain `<shmem>` device and the `orion:` namespace.

Both the generated domains (xml_templates/domain.py) and the in-place editor (host_agent/libvirt_gateway.py)
build our device here, so a device attached to an existing domain and one in a generated domain are the
same bytes, and detach can recognise ours by the user alias libvirt keeps (`ua-` prefix).
"""
from __future__ import annotations

from lxml import etree

from ivshmem.region import SHM_PREFIX

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


def shmem_element(index: int, size_mib: int) -> etree._Element:
    """`<shmem name='orionsock<N>'><model type='ivshmem-plain'/><size unit='M'>S</size><alias name=…/></shmem>`.

    ivshmem-plain (no doorbell server): the wire polls shared memory, so no chardev or MSI-X is needed."""
    if index < 0:
        raise ValueError(f"region index must be 0 or more, not {index}")
    if size_mib <= 0 or size_mib & (size_mib - 1):
        raise ValueError(f"an ivshmem region size must be a power of two in MiB (QEMU's BAR rule), not {size_mib}")
    shmem = etree.Element("shmem", name=region_name(index))
    etree.SubElement(shmem, "model", type="ivshmem-plain")
    size = etree.SubElement(shmem, "size", unit="M")
    size.text = str(size_mib)
    etree.SubElement(shmem, "alias", name=shmem_alias(index))
    return shmem


def shmem_xml(index: int, size_mib: int) -> str:
    """The device as the XML string libvirt's attachDeviceFlags/detachDeviceFlags take."""
    return etree.tostring(shmem_element(index, size_mib), encoding="unicode")
