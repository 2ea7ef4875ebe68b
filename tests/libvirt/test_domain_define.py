"""`orion-domain render` output on the real libvirtd: it defines, libvirt keeps our devices and our metadata,
and (with the guest kernel from tests/guest/build-image.sh) QEMU starts with the regions attached.

Regions used when starting a domain get a free index in 90..99 (so they never clash with a host's real
regions) and are removed afterwards, whoever created them (orion-shm, QEMU, or an installed qemu hook).
"""
from __future__ import annotations

import contextlib
import os
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import libvirt
import pytest
from lxml import etree

from ivshmem.region import SHM_DIR
from xml_templates.devices import ORION_NS, ORION_PREFIX, region_name, shmem_alias
from xml_templates.metadata import RegionRecord, find_regions_element, read_regions, regions_xml

pytestmark = pytest.mark.functional

REPO = Path(__file__).resolve().parents[2]
GUEST_DIR = Path(os.environ.get("ORION_GUEST_DIR", "/var/tmp/orion-guest"))
TEST_INDEXES = range(90, 100)


def render(*options: str) -> str:
    """The CLI's output, run as a user runs it."""
    result = subprocess.run([sys.executable, "-m", "xml_templates.cli", "render", "--name", "placeholder",
                             "--type", "qemu", *options], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout


def our_devices(xml: str) -> list[tuple[str | None, str | None, str | None, str | None]]:
    """(name, model, size, alias) of every <shmem> in a domain XML."""
    tree = etree.fromstring(xml)
    return [(s.get("name"), s.find("model").get("type"), s.findtext("size"), s.find("alias").get("name"))
            for s in tree.findall("devices/shmem")]


@pytest.fixture
def disk_image(tmp_path: Path) -> Path:
    image = tmp_path / "guest.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(image), "64M"], check=True, timeout=60)
    return image


@pytest.fixture
def test_regions() -> Iterator[list[int]]:
    """Two free region indexes in 90..99; their /dev/shm files are removed at the end."""
    free = [i for i in TEST_INDEXES if not os.path.exists(os.path.join(SHM_DIR, region_name(i)))]
    if len(free) < 2:
        pytest.skip(f"no two free test regions among orionsock{TEST_INDEXES[0]}..{TEST_INDEXES[-1]}")
    picked = random.sample(free, 2)
    try:
        yield picked
    finally:
        for index in picked:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(SHM_DIR, region_name(index)))


def test_disk_domain_defines_with_devices_and_metadata(define_domain: Any, disk_image: Path) -> None:
    dom = define_domain(render("--disk", str(disk_image), "--region", "3", "--region", "4:512", "--console"))
    expected = [("orionsock3", "ivshmem-plain", "128", shmem_alias(3)),
                ("orionsock4", "ivshmem-plain", "512", shmem_alias(4))]
    for flags in (0, libvirt.VIR_DOMAIN_XML_INACTIVE):
        xml = dom.XMLDesc(flags)
        assert our_devices(xml) == expected
        assert read_regions(etree.fromstring(xml)) == [RegionRecord(3, 128), RegionRecord(4, 512)]
    tree = etree.fromstring(dom.XMLDesc(0))
    assert tree.find("devices/disk/driver").get("type") == "qcow2"
    assert tree.find("devices/disk/source").get("file") == str(disk_image)


def test_metadata_api_speaks_the_bare_form(define_domain: Any, disk_image: Path) -> None:
    """virDomain.metadata/setMetadata (for the gateway) read and write our record through metadata.py's forms."""
    dom = define_domain(render("--disk", str(disk_image), "--region", "9:64"))
    config = libvirt.VIR_DOMAIN_AFFECT_CONFIG
    element = dom.metadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, ORION_NS, config)
    assert read_regions(etree.fromstring(element)) == [RegionRecord(9, 64)]
    records = [RegionRecord(9, 64), RegionRecord(10, 16, persistent=True)]
    dom.setMetadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, regions_xml(records), ORION_PREFIX, ORION_NS, config)
    tree = etree.fromstring(dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))
    assert read_regions(tree) == records
    assert etree.tostring(find_regions_element(tree), with_tail=False).startswith(b"<orion:regions")


def test_kernel_domain_starts_with_its_regions(define_domain: Any, test_regions: list[int]) -> None:
    """QEMU accepts the devices: one region made by orion-shm beforehand, one QEMU creates itself."""
    kernel, initrd = GUEST_DIR / "vmlinuz", GUEST_DIR / "initrd.img"
    if not (kernel.is_file() and initrd.is_file()):
        pytest.skip(f"no guest kernel in {GUEST_DIR} (make guest-image builds it)")
    made, left = test_regions
    subprocess.run([sys.executable, "-m", "host_agent.admin.shm_cli", "create", "-i", str(made), "-s", "16"],
                   check=True, capture_output=True, timeout=60, cwd=REPO)
    dom = define_domain(render("--kernel", str(kernel), "--initrd", str(initrd), "--cmdline", "console=ttyS0",
                               "--memory", "256", "--region", f"{made}:16", "--region", f"{left}:32"))
    dom.create()
    try:
        assert dom.isActive()
        assert our_devices(dom.XMLDesc(0)) == [
            (region_name(made), "ivshmem-plain", "16", shmem_alias(made)),
            (region_name(left), "ivshmem-plain", "32", shmem_alias(left))]
        assert os.path.getsize(os.path.join(SHM_DIR, region_name(left))) == 32 << 20
    finally:
        dom.destroy()


def test_libvirt_refuses_to_start_a_non_power_of_two_region(define_domain: Any, test_regions: list[int]) -> None:
    """Why devices.py refuses such sizes: libvirt defines the domain but will not start it."""
    kernel = GUEST_DIR / "vmlinuz"
    if not kernel.is_file():
        pytest.skip(f"no guest kernel in {GUEST_DIR} (make guest-image builds it)")
    tree = etree.fromstring(render("--kernel", str(kernel), "--memory", "256", "--region", f"{test_regions[0]}:64"))
    tree.find("devices/shmem/size").text = "48"
    dom = define_domain(etree.tostring(tree, encoding="unicode"))
    with pytest.raises(libvirt.libvirtError, match="power of two"):
        dom.create()
