"""A complete libvirt domain for a guest with Orion regions, built with lxml from a few choices (`DomainSpec`).

This is the generator behind `orion-domain render`: what the user gives (name, memory, vCPUs, a disk image and/or
a kernel, regions, network, console, read-only 9p shares) becomes a `<domain>` that `virsh define` takes as it
is. The shape follows what works on our machines (no KVM: TCG): `<features><acpi/>` so a guest power-off ends the
domain, and no `<cpu>` element (libvirt's default model works under TCG and KVM alike). Orion's own pieces come
from devices.py (the `<shmem>` device) and metadata.py (the `orion:` record), so generated and edited domains
carry the same bytes. Turning options into a spec (checking files, detecting the disk format, parsing `--region`)
is here too, as small functions the CLI calls; printing and exit codes are the CLI's.
"""
from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from lxml import etree

from .devices import check_region_index, check_region_size, shmem_element
from .errors import DomainXmlError
from .metadata import RegionRecord, regions_element

DEFAULT_REGION_SIZE_MIB = 128
DISK_FORMATS = ("qcow2", "raw")
DOMAIN_TYPES = ("qemu", "kvm")
QCOW2_MAGIC = b"QFI\xfb"
# libvirt refuses '/' in names; we stay with what is safe in file names and shells too.
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*\Z")
_TAG_RE = re.compile(r"[A-Za-z0-9_.-]{1,31}\Z")  # QEMU's virtio-9p mount_tag is at most 31 bytes


@dataclass(frozen=True)
class DiskBoot:
    """A disk image attached as virtio vda: the boot disk, or the root disk of a direct kernel boot."""

    path: str
    format: str


@dataclass(frozen=True)
class KernelBoot:
    """Direct kernel boot: QEMU loads the kernel and initrd itself (the root can still be a disk)."""

    kernel: str
    initrd: str | None = None
    cmdline: str | None = None


@dataclass(frozen=True)
class Network:
    """kind: 'none', 'user' (QEMU's slirp), 'network' (a libvirt network `source`) or 'bridge' (host bridge)."""

    kind: str = "none"
    source: str = ""


@dataclass(frozen=True)
class Share:
    """A host directory the guest mounts read-only over 9p: `mount -t 9p -o trans=virtio TAG /mnt`."""

    source: str
    tag: str


@dataclass(frozen=True)
class DomainSpec:
    name: str
    memory_mib: int
    vcpus: int
    disk: DiskBoot | None
    kernel: KernelBoot | None
    regions: tuple[RegionRecord, ...]
    domain_type: str = "qemu"
    network: Network = field(default_factory=Network)
    console: bool = False
    serial_log: str | None = None  # the serial console is also written here (by virtlogd), implies console
    shares: tuple[Share, ...] = ()


# --- from options to a spec --------------------------------------------------------------------------------
def check_name(name: str) -> str:
    if not _NAME_RE.match(name):
        raise DomainXmlError(f"bad domain name {name!r}: use letters, digits and . _ + - "
                             "(starting with a letter or digit)")
    return name


def parse_region(text: str) -> RegionRecord:
    """`INDEX[:SIZE_MIB]` (size defaults to 128 MiB) as given to --region."""
    index_text, _, size_text = text.partition(":")
    try:
        index = int(index_text)
        size_mib = int(size_text) if size_text else DEFAULT_REGION_SIZE_MIB
    except ValueError:
        raise DomainXmlError(f"bad --region {text!r}: expected INDEX or INDEX:SIZE_MIB, e.g. 0 or 1:256") from None
    try:
        check_region_index(index)
        check_region_size(size_mib)
    except DomainXmlError as exc:
        raise DomainXmlError(f"bad --region {text!r}: {exc}") from None
    return RegionRecord(index, size_mib)


def unique_regions(regions: Sequence[RegionRecord]) -> tuple[RegionRecord, ...]:
    if not regions:
        raise DomainXmlError("give at least one --region INDEX[:SIZE_MIB]")
    seen: set[int] = set()
    for region in regions:
        if region.index in seen:
            raise DomainXmlError(f"region {region.index} is given twice: each --region needs its own index")
        seen.add(region.index)
    return tuple(regions)


def parse_network(text: str) -> Network:
    """'none', 'user', 'network=NAME' or 'bridge=NAME' (virt-install's spelling)."""
    if text in ("none", "user"):
        return Network(text)
    kind, sep, source = text.partition("=")
    if sep and kind in ("network", "bridge") and source:
        return Network(kind, source)
    raise DomainXmlError(f"bad --network {text!r}: use none, user, network=NAME or bridge=NAME")


def parse_share(text: str) -> Share:
    """`DIR:TAG` as given to --share: an existing directory and the 9p mount tag the guest names it by."""
    source, sep, tag = text.rpartition(":")
    if not sep or not source or not _TAG_RE.match(tag):
        raise DomainXmlError(f"bad --share {text!r}: expected DIR:TAG, e.g. /srv/code:code (the tag is what the "
                             "guest mounts: letters, digits, _ . -, at most 31)")
    if not os.path.isdir(source):
        raise DomainXmlError(f"--share directory {source!r} does not exist (or is not a directory)")
    return Share(os.path.abspath(source), tag)


def _existing_file(path: str, what: str) -> str:
    if not os.path.isfile(path):
        raise DomainXmlError(f"{what} {path!r} does not exist (or is not a file)")
    return os.path.abspath(path)  # libvirt wants absolute paths; keep symlinks as the user named them


def detect_disk_format(path: str) -> str:
    """qcow2 if the image starts with QEMU's qcow magic, else raw."""
    try:
        with open(path, "rb") as image:
            magic = image.read(len(QCOW2_MAGIC))
    except OSError as exc:
        raise DomainXmlError(f"cannot read disk image {path!r} to detect its format ({exc.strerror}); "
                             "give --disk-format") from None
    return "qcow2" if magic == QCOW2_MAGIC else "raw"


def disk_boot(path: str, disk_format: str | None = None) -> DiskBoot:
    path = _existing_file(path, "disk image")
    return DiskBoot(path, disk_format or detect_disk_format(path))


def kernel_boot(kernel: str, initrd: str | None = None, cmdline: str | None = None) -> KernelBoot:
    return KernelBoot(_existing_file(kernel, "kernel"), _existing_file(initrd, "initrd") if initrd else None, cmdline)


def default_domain_type(kvm_device: str = "/dev/kvm") -> str:
    """'kvm' when /dev/kvm can be opened read-write, else 'qemu' (TCG).

    Note: on our PVM-backed machines /dev/kvm opens but a stock kernel never boots under it;
    pass --type qemu there."""
    try:
        os.close(os.open(kvm_device, os.O_RDWR | os.O_CLOEXEC))
    except OSError:
        return "qemu"
    return "kvm"


# --- the spec as XML ---------------------------------------------------------------------------------------
def _sub(parent: etree._Element, tag: str, text: str | None = None, **attrs: str) -> etree._Element:
    element = etree.SubElement(parent, tag, attrs)
    if text is not None:
        element.text = text
    return element


def _os(domain: etree._Element, spec: DomainSpec) -> None:
    os_el = _sub(domain, "os")
    _sub(os_el, "type", "hvm", arch="x86_64")
    if spec.kernel is not None:
        _sub(os_el, "kernel", spec.kernel.kernel)
        if spec.kernel.initrd:
            _sub(os_el, "initrd", spec.kernel.initrd)
        if spec.kernel.cmdline:
            _sub(os_el, "cmdline", spec.kernel.cmdline)
    else:
        _sub(os_el, "boot", dev="hd")


def _devices(domain: etree._Element, spec: DomainSpec) -> None:
    devices = _sub(domain, "devices")
    if spec.disk is not None:
        disk = _sub(devices, "disk", type="file", device="disk")
        _sub(disk, "driver", name="qemu", type=spec.disk.format)
        _sub(disk, "source", file=spec.disk.path)
        _sub(disk, "target", dev="vda", bus="virtio")
    for share in spec.shares:
        filesystem = _sub(devices, "filesystem", type="mount", accessmode="passthrough")
        _sub(filesystem, "source", dir=share.source)
        _sub(filesystem, "target", dir=share.tag)
        _sub(filesystem, "readonly")
    if spec.network.kind != "none":
        interface = _sub(devices, "interface", type=spec.network.kind)
        if spec.network.source:
            _sub(interface, "source", **{spec.network.kind: spec.network.source})
        _sub(interface, "model", type="virtio")
    if spec.console or spec.serial_log:
        serial = _sub(devices, "serial", type="pty")
        if spec.serial_log:
            _sub(serial, "log", file=spec.serial_log, append="off")
        _sub(serial, "target", port="0")
        console = _sub(devices, "console", type="pty")
        _sub(console, "target", type="serial", port="0")
    for region in spec.regions:
        devices.append(shmem_element(region.index, region.size_mib))


def build_domain(spec: DomainSpec) -> etree._Element:
    """The `<domain>` element for `spec`, in libvirt's element order."""
    if spec.domain_type not in DOMAIN_TYPES:
        raise DomainXmlError(f"bad domain type {spec.domain_type!r}: use one of {', '.join(DOMAIN_TYPES)}")
    if spec.memory_mib < 16:
        raise DomainXmlError(f"--memory {spec.memory_mib} MiB is too small: give at least 16")
    if spec.vcpus < 1:
        raise DomainXmlError(f"--vcpus {spec.vcpus}: give at least 1")
    if spec.disk is None and spec.kernel is None:
        raise DomainXmlError("give a boot source: --disk IMAGE or --kernel FILE [--initrd FILE]")
    if len({share.tag for share in spec.shares}) < len(spec.shares):
        raise DomainXmlError("two --share options use the same tag: give each its own")
    domain = etree.Element("domain", type=spec.domain_type)
    _sub(domain, "name", check_name(spec.name))
    _sub(domain, "metadata").append(regions_element(spec.regions))
    _sub(domain, "memory", str(spec.memory_mib), unit="MiB")
    _sub(domain, "vcpu", str(spec.vcpus))
    _os(domain, spec)
    _sub(_sub(domain, "features"), "acpi")
    _devices(domain, spec)
    return domain


def render(spec: DomainSpec) -> bytes:
    """The domain as UTF-8 XML text, indented two spaces, ending in a newline: the `virsh define` input."""
    domain = build_domain(spec)
    etree.indent(domain, space="  ")
    return etree.tostring(domain, encoding="utf-8", pretty_print=True)
