"""orion-domain render: golden outputs, schema validity, bad options, and the orion: metadata helpers.

Goldens: each case in GOLDEN renders through the real CLI into tests/unit/golden/<case>.xml and must match
byte for byte. The images and kernels are made in a tmp dir whose path is written as /IMAGES in the golden.
After an intended change of the output, refresh them with

    ORION_UPDATE_GOLDEN=1 .venv/bin/pytest tests/unit/test_domain_xml.py

and review the diff (`git diff tests/unit/golden`). Every rendered file also goes through
`virt-xml-validate FILE domain` (libvirt's RelaxNG schema; skipped only when the tool is missing).
Bad options run the CLI as a real process, so the exit code and streams are what a user sees.
The same XML defined on a real libvirtd is tests/libvirt/test_domain_define.py.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from lxml import etree

from xml_templates import domain
from xml_templates.cli import main
from xml_templates.devices import ORION_NS, shmem_alias, shmem_element
from xml_templates.errors import DomainXmlError
from xml_templates.metadata import RegionRecord, read_regions, regions_element, regions_xml

REPO = Path(__file__).resolve().parents[2]
GOLDEN_DIR = Path(__file__).resolve().parent / "golden"
UPDATE_GOLDEN = os.environ.get("ORION_UPDATE_GOLDEN") == "1"
IMAGES = "/IMAGES"  # stands for the tmp dir in goldens

GOLDEN = {
    "disk-qcow2": ["--name", "guest-disk", "--memory", "2048", "--vcpus", "2", "--disk", "{tmp}/guest.qcow2",
                   "--region", "0", "--network", "user", "--console", "--type", "qemu"],
    "kernel-two-regions": ["--name", "guest-kernel", "--memory", "512", "--kernel", "{tmp}/vmlinuz",
                           "--initrd", "{tmp}/initrd.img", "--cmdline", "console=ttyS0 root=/dev/vda",
                           "--region", "0:64", "--region", "1:256", "--console", "--type", "qemu"],
    "kernel-disk-share-log": ["--name", "guest-share", "--memory", "512", "--kernel", "{tmp}/vmlinuz",
                              "--initrd", "{tmp}/initrd.img", "--cmdline", "console=ttyS0 root=/dev/vda",
                              "--disk", "{tmp}/guest.qcow2", "--share", "{tmp}:code", "--serial-log",
                              "{tmp}/serial.log", "--region", "2:32", "--type", "qemu"],
    "disk-raw-kvm": ["--name", "guest-raw", "--disk", "{tmp}/guest.img", "--region", "7:1024",
                     "--network", "network=default", "--type", "kvm"],
}


@pytest.fixture
def images(tmp_path: Path) -> Path:
    """A qcow2-headed image, a raw image, a kernel and an initrd (contents only matter for format detection)."""
    (tmp_path / "guest.qcow2").write_bytes(domain.QCOW2_MAGIC + bytes(508))
    (tmp_path / "guest.img").write_bytes(bytes(512))
    (tmp_path / "vmlinuz").write_bytes(b"kernel")
    (tmp_path / "initrd.img").write_bytes(b"initrd")
    return tmp_path


def _args(case: str, tmp: Path) -> list[str]:
    return ["render", *(a.format(tmp=tmp) for a in GOLDEN[case])]


def _c14n(element: etree._Element) -> str:
    """The element alone, canonical and without indentation, to compare devices whatever their layout."""
    return etree.canonicalize(etree.tostring(element, encoding="unicode", with_tail=False), strip_text=True)


def _validate(path: Path) -> None:
    tool = shutil.which("virt-xml-validate")
    if tool is None or shutil.which("xmllint") is None:
        pytest.skip("virt-xml-validate/xmllint missing (apt: libvirt-clients libxml2-utils)")
    result = subprocess.run([tool, str(path), "domain"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


# --- goldens and schema ------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", sorted(GOLDEN))
def test_golden_and_schema(case: str, images: Path) -> None:
    out = images / f"{case}.xml"
    assert main([*_args(case, images), "--output", str(out)]) == 0
    _validate(out)
    rendered = out.read_bytes().replace(str(images).encode(), IMAGES.encode())
    golden = GOLDEN_DIR / f"{case}.xml"
    if UPDATE_GOLDEN:
        golden.write_bytes(rendered)
    assert golden.exists(), f"no golden {golden.name}: run with ORION_UPDATE_GOLDEN=1 to create it"
    assert rendered == golden.read_bytes(), f"{case} differs from its golden (ORION_UPDATE_GOLDEN=1 refreshes)"


def test_stdout_is_the_same_bytes(images: Path, capsysbinary: pytest.CaptureFixture[bytes]) -> None:
    out = images / "file.xml"
    assert main([*_args("kernel-two-regions", images), "--output", str(out)]) == 0
    assert main(_args("kernel-two-regions", images)) == 0
    assert capsysbinary.readouterr().out == out.read_bytes()


def test_regions_are_devices_and_metadata(images: Path, capsysbinary: pytest.CaptureFixture[bytes]) -> None:
    assert main(_args("kernel-two-regions", images)) == 0
    tree = etree.fromstring(capsysbinary.readouterr().out)
    shmems = tree.findall("devices/shmem")
    assert [(s.get("name"), s.findtext("size"), s.find("alias").get("name")) for s in shmems] == [
        ("orionsock0", "64", shmem_alias(0)), ("orionsock1", "256", shmem_alias(1))]
    assert [_c14n(s) for s in shmems] == [_c14n(shmem_element(i, size)) for i, size in ((0, 64), (1, 256))]
    assert read_regions(tree) == [RegionRecord(0, 64), RegionRecord(1, 256)]
    assert tree.find("features/acpi") is not None and tree.find("cpu") is None  # ACPI on, no <cpu>: boots under TCG


def test_disk_format_detected_or_given(images: Path) -> None:
    assert domain.disk_boot(str(images / "guest.qcow2")).format == "qcow2"
    assert domain.disk_boot(str(images / "guest.img")).format == "raw"
    assert domain.disk_boot(str(images / "guest.qcow2"), "raw").format == "raw"


def test_relative_paths_become_absolute(images: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(images)
    assert domain.kernel_boot("vmlinuz", "initrd.img").kernel == str(images / "vmlinuz")


def test_default_type_follows_the_kvm_device(tmp_path: Path) -> None:
    assert domain.default_domain_type(str(tmp_path / "no-kvm")) == "qemu"
    assert domain.default_domain_type(os.devnull) == "kvm"  # anything that opens read-write counts


# --- bad options -------------------------------------------------------------------------------------------
BAD = {
    "size-not-power-of-two": (["--disk", "{tmp}/guest.img", "--region", "0:100"], "power of two"),
    "size-too-small": (["--disk", "{tmp}/guest.img", "--region", "0:8"], "[16, 1048576]"),
    "size-too-large": (["--disk", "{tmp}/guest.img", "--region", "0:2097152"], "[16, 1048576]"),
    "index-negative": (["--disk", "{tmp}/guest.img", "--region", "-1"], "[0, 9999]"),
    "index-too-large": (["--disk", "{tmp}/guest.img", "--region", "10000"], "[0, 9999]"),
    "region-not-a-number": (["--disk", "{tmp}/guest.img", "--region", "a:b"], "INDEX:SIZE_MIB"),
    "duplicate-index": (["--disk", "{tmp}/guest.img", "--region", "3", "--region", "3:64"], "given twice"),
    "no-region": (["--disk", "{tmp}/guest.img"], "at least one --region"),
    "share-without-tag": (["--disk", "{tmp}/guest.img", "--share", "{tmp}", "--region", "0"], "DIR:TAG"),
    "share-tag-too-long": (["--disk", "{tmp}/guest.img", "--share", "{tmp}:" + "t" * 32, "--region", "0"],
                           "at most 31"),
    "share-missing-dir": (["--disk", "{tmp}/guest.img", "--share", "{tmp}/absent:code", "--region", "0"],
                          "does not exist"),
    "share-tag-twice": (["--disk", "{tmp}/guest.img", "--share", "{tmp}:code", "--share", "{tmp}:code",
                         "--region", "0"], "same tag"),
    "no-boot-source": (["--region", "0"], "--disk IMAGE or --kernel"),
    "missing-disk": (["--disk", "{tmp}/absent.qcow2", "--region", "0"], "does not exist"),
    "missing-kernel": (["--kernel", "{tmp}/absent", "--region", "0"], "does not exist"),
    "missing-initrd": (["--kernel", "{tmp}/vmlinuz", "--initrd", "{tmp}/absent", "--region", "0"], "does not exist"),
    "initrd-without-kernel": (["--disk", "{tmp}/guest.img", "--initrd", "{tmp}/initrd.img", "--region", "0"],
                              "need --kernel"),
    "format-without-disk": (["--kernel", "{tmp}/vmlinuz", "--disk-format", "raw", "--region", "0"], "needs --disk"),
    "bad-disk-format": (["--disk", "{tmp}/guest.img", "--disk-format", "vmdk", "--region", "0"], "invalid choice"),
    "bad-type": (["--disk", "{tmp}/guest.img", "--type", "xen", "--region", "0"], "invalid choice"),
    "bad-network": (["--disk", "{tmp}/guest.img", "--network", "tap", "--region", "0"], "--network"),
    "bad-name": (["--name", "a/b", "--disk", "{tmp}/guest.img", "--region", "0"], "bad domain name"),
    "memory-not-a-number": (["--disk", "{tmp}/guest.img", "--memory", "lots", "--region", "0"], "invalid int"),
    "memory-too-small": (["--disk", "{tmp}/guest.img", "--memory", "8", "--region", "0"], "too small"),
    "no-vcpus": (["--disk", "{tmp}/guest.img", "--vcpus", "0", "--region", "0"], "at least 1"),
    "unwritable-output": (["--disk", "{tmp}/guest.img", "--region", "0", "--output", "{tmp}/no/dir/x.xml"],
                          "cannot write"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_options_exit_2_with_one_line(case: str, images: Path) -> None:
    options, expected = BAD[case]
    argv = [a.format(tmp=images) for a in options]
    if "--name" not in argv:
        argv = ["--name", "g", *argv]
    result = subprocess.run([sys.executable, "-m", "xml_templates.cli", "render", *argv],
                            capture_output=True, text=True, cwd=REPO, timeout=60)
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("orion-domain render: error: "), result.stderr
    assert expected in lines[0]


def test_no_command_is_a_one_line_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        main([])
    assert stop.value.code == 2
    assert len(capsys.readouterr().err.splitlines()) == 1


# --- devices.py and metadata.py ----------------------------------------------------------------------------
@pytest.mark.parametrize("size_mib", [16, 128, 1024 * 1024])
def test_shmem_sizes_accepted(size_mib: int) -> None:
    assert shmem_element(0, size_mib).findtext("size") == str(size_mib)


@pytest.mark.parametrize(("index", "size_mib"), [(0, 100), (0, 8), (0, 2 * 1024 * 1024), (-1, 128), (10000, 128)])
def test_shmem_refuses(index: int, size_mib: int) -> None:
    with pytest.raises(DomainXmlError):
        shmem_element(index, size_mib)


def test_metadata_round_trip() -> None:
    regions = [RegionRecord(5, 16), RegionRecord(2, 512, persistent=True)]
    element = regions_element(regions)
    assert element.nsmap == {"orion": ORION_NS}
    assert read_regions(element) == regions
    assert read_regions(etree.fromstring(regions_xml(regions))) == regions
    assert etree.tostring(element, encoding="unicode") == (
        f'<orion:regions xmlns:orion="{ORION_NS}"><orion:region index="5" size-mib="16" persistent="no"/>'
        '<orion:region index="2" size-mib="512" persistent="yes"/></orion:regions>')
    assert regions_xml(regions) == (  # the bare form libvirt's metadata API speaks
        '<regions><region index="5" size-mib="16" persistent="no"/>'
        '<region index="2" size-mib="512" persistent="yes"/></regions>')


def test_metadata_refuses_duplicates() -> None:
    with pytest.raises(DomainXmlError, match="twice"):
        regions_element([RegionRecord(1, 16), RegionRecord(1, 32)])


def test_read_regions_absent_is_empty() -> None:
    assert read_regions(etree.fromstring("<domain><name>x</name></domain>")) == []


@pytest.mark.parametrize("region", ['index="x" size-mib="16"', 'index="1"',
                                    'index="1" size-mib="16" persistent="maybe"'])
def test_read_regions_refuses_unreadable(region: str) -> None:
    tree = etree.fromstring(f'<domain><metadata><o:regions xmlns:o="{ORION_NS}"><o:region {region}/></o:regions>'
                            "</metadata></domain>")
    with pytest.raises(DomainXmlError, match="unreadable"):
        read_regions(tree)


