"""`orion-shm attach/detach` against the real libvirtd (qemu:///system) and, for live changes, a running
`type='qemu'` (TCG) guest that boots the kernel from tests/guest/build-image.sh into its initramfs shell.

What is checked: everything in a domain that is not ours survives attach + detach byte for byte (persistent and
live XML); attaching twice changes nothing; the region is created for QEMU or an existing one reused (and
handed to QEMU's user when it cannot open it, as the qemu hook does); each failure (unknown domain, libvirtd
unreachable, a user libvirt refuses, a region too small or laid out too large, something not ours in the way, a
change libvirt refuses) exits with its status and one line, and an attach that libvirt refuses part-way leaves
nothing behind. Live detach is an ACPI eject: a paused guest does not answer it, which must end in a bounded
wait and exit 8. Region indexes are random in 100..9999 and removed afterwards.
"""
from __future__ import annotations

import contextlib
import os
import pwd
import random
import shutil
import stat
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import libvirt
import pytest
from lxml import etree

from host_agent.shm_admin import create
from ivshmem.region import SHM_DIR
from xml_templates.devices import ORION_NS, region_name, shmem_alias
from xml_templates.metadata import RegionRecord, read_regions

pytestmark = pytest.mark.functional

REPO = Path(__file__).resolve().parents[2]
GUEST_DIR = Path(os.environ.get("ORION_GUEST_DIR", "/var/tmp/orion-guest"))
LOG_DIR = Path("/var/tmp/orion-attach-tests")  # QEMU's serial log; /tmp/pytest-of-root is not QEMU's to write
GUEST_READY_TIMEOUT_S = 300.0  # TCG boot to the initramfs shell is ~5 s alone; generous for a busy machine
DETACH_WAIT = "120"  # seconds orion-shm waits for the guest's ACPI eject (bounded; a Linux guest takes < 1 s)
INACTIVE = libvirt.VIR_DOMAIN_XML_INACTIVE | libvirt.VIR_DOMAIN_XML_SECURE

# A domain with many devices and settings that are not ours; %(...)s are filled in by `busy_domain`.
BUSY_DOMAIN = """<domain type='qemu'>
  <name>placeholder</name>
  <title>not ours</title>
  <description>a domain with many devices that orion-shm must leave alone</description>%(metadata)s
  <memory unit='MiB'>256</memory>
  <vcpu>1</vcpu>
  <os>
    <type arch='x86_64' machine='pc'>hvm</type>%(boot)s
  </os>
  <features><acpi/><apic/></features>
  <clock offset='utc'><timer name='rtc' tickpolicy='catchup'/></clock>
  <on_poweroff>destroy</on_poweroff>
  <on_reboot>destroy</on_reboot>
  <on_crash>destroy</on_crash>
  <devices>
    <emulator>/usr/bin/qemu-system-x86_64</emulator>
    <disk type='file' device='cdrom'><driver name='qemu' type='raw'/><target dev='hdc' bus='ide'/><readonly/></disk>
    <controller type='virtio-serial' index='0'/>
    <serial type='file'><source path='%(log)s'/><target port='0'/></serial>
    <channel type='pty'><target type='virtio' name='org.example.agent.0'/></channel>
    <input type='tablet' bus='usb'/>
    <graphics type='vnc' port='-1' autoport='yes' listen='127.0.0.1' passwd='s3cret'/>
    <video><model type='cirrus'/></video>
    <watchdog model='i6300esb' action='reset'/>
    <rng model='virtio'><backend model='random'>/dev/urandom</backend></rng>
    <shmem name='%(foreign)s'><model type='ivshmem-plain'/><size unit='M'>1</size></shmem>
    <memballoon model='virtio'/>
  </devices>
</domain>"""
OTHER_METADATA = """
  <metadata>
    <libosinfo:libosinfo xmlns:libosinfo="http://libosinfo.org/xmlns/libvirt/domain/1.0">
      <libosinfo:os id="http://debian.org/debian/12"/>
    </libosinfo:libosinfo>
  </metadata>"""


def shm(*args: str, user: str | None = None) -> subprocess.CompletedProcess[str]:
    """orion-shm as a user runs it."""
    prefix = ["runuser", "-u", user, "--"] if user else []
    return subprocess.run([*prefix, sys.executable, "-m", "host_agent.admin.shm_cli", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=600)


def assert_fails(result: subprocess.CompletedProcess[str], status: int, *words: str) -> None:
    assert result.returncode == status, result
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    for word in words:
        assert word in result.stderr, result.stderr


def region_file(index: int) -> Path:
    return Path(SHM_DIR, region_name(index))


def ours(xml: str, index: int) -> list[etree._Element]:
    """Our <shmem> devices for `index` in a domain XML."""
    return [s for s in etree.fromstring(xml).iterfind("devices/shmem")
            if s.find(f"alias[@name='{shmem_alias(index)}']") is not None]


@pytest.fixture
def index() -> Iterator[int]:
    """A region index in 100..9999 whose file does not exist (nor the next one's); both removed at the end."""
    rng = random.Random()
    for _ in range(100):
        chosen = rng.randrange(100, 9999)
        if not region_file(chosen).exists() and not region_file(chosen + 1).exists():
            break
    else:
        pytest.skip("no free region index in 100..9999")
    try:
        yield chosen
    finally:
        for i in (chosen, chosen + 1):
            with contextlib.suppress(FileNotFoundError):
                region_file(i).unlink()


@pytest.fixture
def busy_domain(define_domain: Callable[[str], Any]) -> Iterator[Callable[..., Any]]:
    """`busy_domain(metadata=False, kernel=False) -> virDomain`: BUSY_DOMAIN defined under a fresh name. With
    `kernel`, it boots the guest kernel into its initramfs shell (skipped without the image)."""
    LOG_DIR.mkdir(mode=0o755, exist_ok=True)
    foreign: list[Path] = []

    def make(metadata: bool = False, kernel: bool = False) -> Any:
        boot = ""
        if kernel:
            if not (GUEST_DIR / "vmlinuz").exists():
                pytest.skip(f"no guest kernel in {GUEST_DIR}: run tests/guest/build-image.sh")
            boot = (f"\n    <kernel>{GUEST_DIR}/vmlinuz</kernel><initrd>{GUEST_DIR}/initrd.img</initrd>"
                    "\n    <cmdline>console=ttyS0</cmdline>")
        name = f"orion-test-foreign-{uuid.uuid4().hex[:8]}"  # someone else's <shmem>: QEMU makes its file
        foreign.append(Path(SHM_DIR, name))
        log = LOG_DIR / f"{name}.log"
        log.unlink(missing_ok=True)
        xml = BUSY_DOMAIN % {"metadata": OTHER_METADATA if metadata else "", "boot": boot, "log": log,
                             "foreign": name}
        dom = define_domain(xml)
        dom.serial_log = log
        return dom

    try:
        yield make
    finally:
        for path in foreign:
            path.unlink(missing_ok=True)
            (LOG_DIR / f"{path.name}.log").unlink(missing_ok=True)


def start_and_wait_for_shell(dom: Any) -> None:
    """Start the domain and wait (bounded) until its kernel runs the initramfs shell, so ACPI events are handled."""
    dom.create()
    deadline = time.monotonic() + GUEST_READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if "(initramfs)" in dom.serial_log.read_text(errors="replace"):
            return
        time.sleep(0.2)
    pytest.fail(f"the guest did not reach its initramfs shell within {GUEST_READY_TIMEOUT_S:.0f} s; see "
                f"{dom.serial_log}")


def timed(*args: str) -> subprocess.CompletedProcess[str]:
    start = time.monotonic()
    result = shm(*args)
    print(f"orion-shm {' '.join(args)}: exit {result.returncode} after {time.monotonic() - start:.2f} s")
    return result


# --- the persistent definition of a stopped domain -----------------------------------------------------------
def test_stopped_domain_comes_back_byte_for_byte(busy_domain: Callable[..., Any], index: int) -> None:
    dom = busy_domain()
    before = dom.XMLDesc(INACTIVE)
    result = shm("attach", dom.name(), "-i", str(index), "-s", "16")
    assert result.returncode == 0, result.stderr
    assert "is attached" in result.stdout and "persistent definition" in result.stdout
    st = region_file(index).stat()
    assert (st.st_size, stat.S_IMODE(st.st_mode), pwd.getpwuid(st.st_uid).pw_name) == (16 << 20, 0o660,
                                                                                        "libvirt-qemu")
    attached = dom.XMLDesc(INACTIVE)
    (device,) = ours(attached, index)
    assert (device.get("name"), device.find("model").get("type"), device.findtext("size")) == (
        region_name(index), "ivshmem-plain", "16")
    assert read_regions(etree.fromstring(attached)) == [RegionRecord(index, 16, False)]
    assert f'xmlns:orion="{ORION_NS}"' in attached

    again = shm("attach", dom.name(), "-i", str(index))
    assert again.returncode == 0 and "already attached" in again.stdout, again
    assert dom.XMLDesc(INACTIVE) == attached

    result = shm("detach", dom.name(), "-i", str(index))
    assert result.returncode == 0 and "is detached" in result.stdout, result
    assert dom.XMLDesc(INACTIVE) == before  # the foreign <shmem>, VNC password, metadata-less shape: all kept
    assert region_file(index).exists()  # detach leaves the region file
    gone = shm("detach", dom.name(), "-i", str(index))
    assert gone.returncode == 0 and "not attached" in gone.stdout
    assert_fails(shm("detach", dom.name(), "-i", str(index), "--live"), 7, "is not running", "--config")


def test_persistent_flag_and_an_existing_region_are_kept(busy_domain: Callable[..., Any], index: int) -> None:
    dom = busy_domain(metadata=True)
    made = create(index, 32, SHM_DIR)
    result = shm("attach", dom.name(), "-i", str(index), "--persistent")
    assert result.returncode == 0 and "existing" in result.stdout, result
    records = read_regions(etree.fromstring(dom.XMLDesc(INACTIVE)))
    assert records == [RegionRecord(index, 32, True)]  # the size of the region found
    assert os.stat(made.path).st_size == 32 << 20


# --- a running guest -------------------------------------------------------------------------------------------
def test_running_domain_live_and_config(busy_domain: Callable[..., Any], index: int) -> None:
    dom = busy_domain(metadata=True, kernel=True)
    start_and_wait_for_shell(dom)
    live_before, config_before = dom.XMLDesc(0), dom.XMLDesc(INACTIVE)
    result = timed("attach", dom.name(), "-i", str(index), "-s", "16")
    assert result.returncode == 0 and "persistent definition and the running domain" in result.stdout, result
    (live,) = ours(dom.XMLDesc(0), index)
    assert live.find("address").get("type") == "pci"  # QEMU hot-plugged it: the guest sees a PCI device
    assert len(ours(dom.XMLDesc(INACTIVE), index)) == 1
    assert read_regions(etree.fromstring(dom.XMLDesc(0))) == [RegionRecord(index, 16, False)]
    assert shm("attach", dom.name(), "-i", str(index)).stdout.count("already attached") == 1

    result = timed("detach", dom.name(), "-i", str(index), "--wait", DETACH_WAIT)
    assert result.returncode == 0, result.stderr
    assert dom.XMLDesc(0) == live_before and dom.XMLDesc(INACTIVE) == config_before


def test_live_detach_from_a_paused_guest_ends_and_can_be_finished(busy_domain: Callable[..., Any],
                                                                  index: int) -> None:
    dom = busy_domain(metadata=True, kernel=True)
    start_and_wait_for_shell(dom)
    live_before = dom.XMLDesc(0)
    assert shm("attach", dom.name(), "-i", str(index), "-s", "16", "--live").returncode == 0
    dom.suspend()  # a paused guest cannot acknowledge the ACPI eject
    pending = timed("detach", dom.name(), "-i", str(index), "--live", "--wait", "1")
    assert_fails(pending, 8, "has not done so within 1 s", "again later")
    assert len(ours(dom.XMLDesc(0), index)) == 1  # still there, and so is our record
    assert read_regions(etree.fromstring(dom.XMLDesc(0))) == [RegionRecord(index, 16, False)]
    dom.resume()  # the guest now handles the eject it was sent
    result = timed("detach", dom.name(), "-i", str(index), "--live", "--wait", DETACH_WAIT)
    assert result.returncode == 0, result.stderr
    assert dom.XMLDesc(0) == live_before


# --- failures -----------------------------------------------------------------------------------------------------
def test_attach_that_libvirt_refuses_part_way_is_undone(busy_domain: Callable[..., Any], index: int) -> None:
    dom = busy_domain()
    before = dom.XMLDesc(INACTIVE)
    # The definition is changed first, then libvirt refuses the live attach (the domain is not running).
    result = shm("attach", dom.name(), "-i", str(index), "-s", "16", "--config", "--live")
    assert_fails(result, 7, "domain is not running", "undone:", f"removed {region_file(index)}",
                 "detached it from the persistent definition")
    assert not region_file(index).exists()
    assert dom.XMLDesc(INACTIVE) == before


def test_a_region_we_did_not_create_is_never_removed_by_an_undo(busy_domain: Callable[..., Any],
                                                               index: int) -> None:
    dom = busy_domain()
    create(index, 16, SHM_DIR)
    assert_fails(shm("attach", dom.name(), "-i", str(index), "--live"), 7, "domain is not running")
    assert region_file(index).exists()


def test_region_smaller_than_the_device(busy_domain: Callable[..., Any], index: int) -> None:
    dom = busy_domain()
    before = dom.XMLDesc(INACTIVE)
    create(index, 16, SHM_DIR)
    assert_fails(shm("attach", dom.name(), "-i", str(index), "-s", "64"), 5,
                 f"is 16 MiB but domain {dom.name()} wants 64 MiB", "at most 16 MiB (orion-shm attach -s)",
                 f"orion-shm remove {index}")
    assert region_file(index).stat().st_size == 16 << 20 and dom.XMLDesc(INACTIVE) == before


def test_region_laid_out_larger_than_the_device(busy_domain: Callable[..., Any], index: int) -> None:
    """The guest would map 16 MiB of a header describing 32 and refuse it; the hook refuses it at start too."""
    dom = busy_domain()
    before = dom.XMLDesc(INACTIVE)
    create(index, 32, SHM_DIR)
    assert_fails(shm("attach", dom.name(), "-i", str(index), "-s", "16"), 5, "is laid out for 32 MiB",
                 "a size of 32 MiB", f"orion-shm remove {index}")
    assert region_file(index).stat().st_size == 32 << 20 and dom.XMLDesc(INACTIVE) == before


def test_region_qemu_cannot_open_is_handed_to_qemu(busy_domain: Callable[..., Any], index: int) -> None:
    """One policy with the qemu hook (host_agent/kvm/qemu_region.py): hand the region over, as the hook would at
    the next start anyway; refusing made a stopped domain's attach fail for nothing."""
    dom = busy_domain()
    create(index, 16, SHM_DIR, mode=0o600)  # owned by libvirt-qemu:kvm, but give it to root:
    os.chown(region_file(index), 0, 0)
    result = shm("attach", dom.name(), "-i", str(index))
    assert result.returncode == 0 and "existing" in result.stdout, result
    st = region_file(index).stat()
    assert (pwd.getpwuid(st.st_uid).pw_name, stat.S_IMODE(st.st_mode)) == ("libvirt-qemu", 0o660)


def test_a_shmem_of_that_name_not_ours_is_left_alone(define_domain: Callable[[str], Any], index: int) -> None:
    xml = BUSY_DOMAIN % {"metadata": "", "boot": "", "log": LOG_DIR / "unused.log", "foreign": region_name(index)}
    dom = define_domain(xml)
    before = dom.XMLDesc(INACTIVE)
    assert_fails(shm("attach", dom.name(), "-i", str(index)), 6, "did not attach", "virsh detach-device")
    assert_fails(shm("detach", dom.name(), "-i", str(index)), 6, "left alone")
    assert dom.XMLDesc(INACTIVE) == before and not region_file(index).exists()


def test_unknown_domain(libvirt_conn: Any, index: int) -> None:
    assert_fails(shm("attach", "orion-test-no-such-domain", "-i", str(index)), 3, "no-such-domain",
                 "virsh -c qemu:///system list --all")
    assert not region_file(index).exists()
    assert_fails(shm("detach", "orion-test-no-such-domain", "-i", str(index)), 3)


def test_libvirtd_not_running(index: int) -> None:
    """A URI whose socket does not exist stands in for a stopped libvirtd (the real one is shared)."""
    uri = f"qemu:///system?socket=/nonexistent-{uuid.uuid4().hex}/libvirt-sock"
    for command in ("attach", "detach"):
        assert_fails(shm(command, "some-domain", "-i", str(index), "--connect", uri), 2,
                     "libvirtd is not running", "libvirtd -d")
    assert not region_file(index).exists()


def test_user_libvirt_refuses(libvirt_conn: Any, index: int) -> None:
    if os.geteuid() != 0 or shutil.which("runuser") is None:
        pytest.skip("needs root and runuser to run orion-shm as 'nobody'")
    assert_fails(shm("attach", "orion-test-any", "-i", str(index), user="nobody"), 4,
                 "did not let user nobody connect", "run as root")
    assert not region_file(index).exists()
