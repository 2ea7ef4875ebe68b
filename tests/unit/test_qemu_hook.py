"""The qemu hook as libvirt runs it: a subprocess with DOMAIN OPERATION SUBOP EXTRA and the domain XML on stdin.

Every case uses its own shm directory (server.conf's shm_path_base, passed through ORION_SERVER_CONF) and a
pid file naming no agent, so nothing here touches /dev/shm or a running oriond. The domain XML is shaped
like the live XML libvirt hands a hook, with our devices and metadata built by xml_templates.
"""
from __future__ import annotations

import grp
import os
import pwd
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from lxml import etree

from host_agent import shm_admin
from host_agent.server_conf import ShmSettings
from ivshmem import layout
from ivshmem.region import Region
from xml_templates.devices import shmem_xml
from xml_templates.metadata import RegionRecord, regions_element

REPO = Path(__file__).resolve().parents[2]
MIB = 1 << 20
AS_ROOT = os.geteuid() == 0
QEMU_USER, QEMU_GROUP = "nobody", "nogroup"  # exist on every Debian; the tests never depend on libvirt-qemu

DOMAIN = """<domain type='qemu' id='7'>
  <name>{name}</name>
  <uuid>6f1d3c5e-27a4-4b8e-9d0c-2a1b3c4d5e6f</uuid>
  {metadata}
  <memory unit='KiB'>524288</memory>
  <currentMemory unit='KiB'>524288</currentMemory>
  <vcpu placement='static'>1</vcpu>
  <os><type arch='x86_64' machine='pc-i440fx-7.2'>hvm</type><boot dev='hd'/></os>
  <features><acpi/></features>
  <devices>
    <emulator>/usr/bin/qemu-system-x86_64</emulator>
    <controller type='pci' index='0' model='pci-root'><alias name='pci.0'/></controller>
    {shmems}
    <memballoon model='none'/>
  </devices>
  <seclabel type='dynamic' model='dac' relabel='yes'><label>+64055:+107</label></seclabel>
</domain>
"""


def domain_xml(*regions: tuple[int, int], persistent: tuple[int, ...] = (), extra: str = "", name: str = "g1") -> str:
    """A domain with our `<shmem>` device for each (index, size MiB), and our metadata if any is persistent."""
    records = [RegionRecord(i, s, i in persistent) for i, s in regions]
    element = etree.tostring(regions_element(records), encoding="unicode")  # namespaced, as in a domain's XML
    metadata = f"<metadata>{element}</metadata>" if regions else ""
    shmems = "\n    ".join(shmem_xml(i, s) for i, s in regions) + extra
    return DOMAIN.format(name=name, metadata=metadata, shmems=shmems)


@dataclass
class Host:
    shm: Path
    conf: Path
    pid_file: Path

    def path(self, index: int) -> Path:
        return self.shm / f"orionsock{index}"

    def hook(self, operation: str, xml: str | bytes, domain: str = "g1") -> subprocess.CompletedProcess[str]:
        """The entry point exactly as the installed script starts it (-I: nothing from our environment)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("ORION_", "PYTHON"))}
        env.update(ORION_SERVER_CONF=str(self.conf), ORION_PID_FILE=str(self.pid_file))
        subop = "begin" if operation in ("prepare", "start", "started") else "end"
        data = xml.encode() if isinstance(xml, str) else xml
        result = subprocess.run([sys.executable, "-I", "-m", "libvirt_hooks.qemu_hook", domain, operation, subop,
                                 "-"], input=data, capture_output=True, cwd="/", env=env, timeout=60)
        return subprocess.CompletedProcess(result.args, result.returncode, result.stdout.decode(),
                                           result.stderr.decode())


@pytest.fixture
def host(tmp_path: Path) -> Host:
    shm = tmp_path / "shm"
    shm.mkdir()
    conf = tmp_path / "server.conf"
    conf.write_text(f'[server-shm]\n    shm_path_base = "{shm}/"\n    shm_user_name = "{QEMU_USER}"\n'
                    f'    shm_group_name = "{QEMU_GROUP}"\n')
    return Host(shm, conf, tmp_path / "run" / "oriond.pid")


def one_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got:\n{text}"
    return lines[0]


def test_prepare_creates_each_region_with_the_device_size_owner_and_mode(host: Host) -> None:
    result = host.hook("prepare", domain_xml((9101, 32), (9102, 64)))
    assert result.returncode == 0, result.stderr
    for index, size in ((9101, 32), (9102, 64)):
        st = host.path(index).stat()
        assert st.st_size == size * MIB
        if AS_ROOT:
            assert (pwd.getpwuid(st.st_uid).pw_name, grp.getgrgid(st.st_gid).gr_name) == (QEMU_USER, QEMU_GROUP)
            assert stat.S_IMODE(st.st_mode) == 0o660
        with Region.open(host.path(index)) as region:  # formatted at once, as `orion-shm create` does
            assert region.geometry.region_size == size * MIB
            assert region.agent_words()[2] == layout.AGENT_NEVER
    assert "host agent is not running" in result.stderr  # a note, not an error


def test_prepare_leaves_a_good_existing_region_alone(host: Host) -> None:
    shm_admin.create(9103, 32, directory=str(host.shm), settings=ShmSettings.load(str(host.conf)), mode=0o666)
    before = host.path(9103).stat()
    result = host.hook("prepare", domain_xml((9103, 32)))
    assert result.returncode == 0, result.stderr
    after = host.path(9103).stat()
    assert (after.st_ino, after.st_size, after.st_mode, after.st_mtime_ns) == \
           (before.st_ino, before.st_size, before.st_mode, before.st_mtime_ns)
    assert "left as it is" in result.stderr


def test_prepare_refuses_a_region_laid_out_larger_than_the_device(host: Host) -> None:
    """QEMU accepts a larger file, but the guest maps only the device's size and refuses the larger header."""
    shm_admin.create(9120, 64, directory=str(host.shm), settings=ShmSettings.load(str(host.conf)))
    result = host.hook("prepare", domain_xml((9120, 32)))
    assert result.returncode == 1
    line = one_line(result.stderr)
    assert "laid out for 64 MiB" in line and "orion-shm remove 9120" in line
    assert host.path(9120).stat().st_size == 64 * MIB


@pytest.mark.skipif(not AS_ROOT, reason="giving a file to another user needs root")
def test_prepare_hands_an_existing_region_qemu_cannot_open_to_the_qemu_user(host: Host) -> None:
    path = host.path(9104)
    with open(path, "wb") as f:  # what a root `truncate` leaves: QEMU gets Permission denied
        f.truncate(32 * MIB)
    path.chmod(0o600)
    result = host.hook("prepare", domain_xml((9104, 32)))
    assert result.returncode == 0, result.stderr
    st = path.stat()
    assert (pwd.getpwuid(st.st_uid).pw_name, stat.S_IMODE(st.st_mode)) == (QEMU_USER, 0o660)


def test_prepare_refuses_a_region_smaller_than_the_device_and_says_what_to_do(host: Host) -> None:
    path = host.path(9105)
    with open(path, "wb") as f:
        f.truncate(16 * MIB)
    result = host.hook("prepare", domain_xml((9105, 32)))
    assert result.returncode != 0
    line = one_line(result.stderr)
    assert str(path) in line and "16 MiB" in line and "32 MiB" in line and "orion-shm remove 9105" in line
    assert path.stat().st_size == 16 * MIB  # left as it was


def test_a_failed_prepare_removes_the_regions_it_created(host: Host) -> None:
    with open(host.path(9107), "wb") as f:
        f.truncate(16 * MIB)
    result = host.hook("prepare", domain_xml((9106, 32), (9107, 32)))
    assert result.returncode != 0
    assert "orionsock9107" in one_line(result.stderr)
    assert not host.path(9106).exists()


def test_release_after_a_failed_prepare_keeps_the_users_region(host: Host) -> None:
    """libvirt runs release for a start whose prepare failed: the user's too-small file must survive it."""
    with open(host.path(9122), "wb") as f:
        f.truncate(16 * MIB)
    xml = domain_xml((9122, 32))
    assert host.hook("prepare", xml).returncode != 0
    result = host.hook("release", xml)
    assert result.returncode == 0, result.stderr
    assert "kept every region" in result.stderr
    assert host.path(9122).stat().st_size == 16 * MIB
    host.path(9122).unlink()  # the user fixes it; the next start succeeds and its release removes the region
    assert host.hook("prepare", xml).returncode == 0
    assert host.hook("release", xml).returncode == 0
    assert not host.path(9122).exists()


def test_release_removes_regions_and_keeps_persistent_ones(host: Host) -> None:
    xml = domain_xml((9108, 32), (9109, 32), persistent=(9109,))
    assert host.hook("prepare", xml).returncode == 0
    result = host.hook("release", xml)
    assert result.returncode == 0, result.stderr
    assert not host.path(9108).exists()
    assert host.path(9109).stat().st_size == 32 * MIB
    assert "kept" in result.stderr and "persistent" in result.stderr
    assert host.hook("release", xml).returncode == 0  # again: nothing left to remove, no error


def test_release_keeps_a_region_another_process_still_maps(host: Host) -> None:
    """Say a second running domain was given the same region: removing it would cut that guest off."""
    xml = domain_xml((9121, 32))
    assert host.hook("prepare", xml).returncode == 0
    with Region.open(host.path(9121)):
        result = host.hook("release", xml)
        assert result.returncode == 0, result.stderr
        assert f"still in use by pid {os.getpid()}" in result.stderr
        assert host.path(9121).exists()
    assert host.hook("release", xml).returncode == 0
    assert not host.path(9121).exists()


def test_a_domain_without_orion_regions_touches_nothing(host: Host, tmp_path: Path) -> None:
    host.conf.write_text("this is not an INI file\n")  # would fail loudly if the hook read it
    other = host.path(9110)
    other.write_bytes(b"someone else's")
    plain = domain_xml(extra="<shmem name='other'><model type='ivshmem-plain'/><size unit='M'>4</size></shmem>")
    for operation in ("prepare", "start", "started", "stopped", "release"):
        result = host.hook(operation, plain)
        assert (result.returncode, result.stderr) == (0, ""), (operation, result.stderr)
    assert sorted(p.name for p in host.shm.iterdir()) == ["orionsock9110"]
    assert other.read_bytes() == b"someone else's"


def test_other_operations_of_an_orion_domain_do_nothing(host: Host) -> None:
    xml = domain_xml((9111, 32))
    for operation in ("start", "started", "stopped", "migrate", "restore", "reconnect", "attach"):
        assert host.hook(operation, xml).returncode == 0
    assert not host.path(9111).exists()


def test_doorbell_and_legacy_ivshmem_devices_are_not_orion_regions(host: Host) -> None:
    extra = ("<shmem name='orionsock9112'><model type='ivshmem-doorbell'/><server path='/tmp/x'/></shmem>"
             "<shmem name='orionsock9113'><model type='ivshmem'/><size unit='M'>32</size></shmem>")
    result = host.hook("prepare", domain_xml(extra=extra))
    assert result.returncode == 0, result.stderr
    assert list(host.shm.iterdir()) == []


def test_the_size_unit_is_honoured(host: Host) -> None:
    extra = "<shmem name='orionsock9114'><model type='ivshmem-plain'/><size unit='KiB'>32768</size></shmem>"
    assert host.hook("prepare", domain_xml(extra=extra)).returncode == 0
    assert host.path(9114).stat().st_size == 32 * MIB


@pytest.mark.parametrize("xml, words", [
    (b"<domain><devices><shmem name='orionsock9115'>", "cannot be parsed"),
    (b"<network><name>orionsock</name></network>", "not the <domain> XML"),
    (domain_xml(extra="<shmem name='orionsock9116'><model type='ivshmem-plain'/></shmem>").encode(), "no <size>"),
    (domain_xml(extra="<shmem name='orionsock9117'><size unit='M'>8</size></shmem>").encode(), "Invalid SHM file size"),
], ids=["truncated", "not-a-domain", "no-size", "too-small-for-orion"])
def test_bad_input_fails_prepare_with_one_clear_line(host: Host, xml: bytes, words: str) -> None:
    result = host.hook("prepare", xml)
    assert result.returncode == 1
    line = one_line(result.stderr)
    assert line.startswith("Orion vGPU hook: prepare of domain g1 failed: ") and words in line, line
    assert "Traceback" not in result.stderr
    assert list(host.shm.iterdir()) == []


def test_a_bad_server_conf_fails_prepare_with_one_clear_line(host: Host) -> None:
    host.conf.write_text("[server-shm]\n    shm_buffer_size = lots\n")
    result = host.hook("prepare", domain_xml((9118, 32)))
    assert result.returncode == 1
    assert str(host.conf) in one_line(result.stderr)


def test_the_hook_never_imports_libvirt(host: Host) -> None:
    """libvirt holds its locks while a hook runs: the libvirt module must not even be loaded."""
    code = ("import io, sys; from libvirt_hooks import qemu_hook; "
            f"rc = qemu_hook.main(['g1', 'prepare', 'begin', '-'], io.BytesIO({domain_xml((9119, 32))!r}.encode())); "
            "assert rc == 0, rc; print(sorted(m for m in sys.modules if m.split('.')[0] == 'libvirt'))")
    env = {**os.environ, "ORION_SERVER_CONF": str(host.conf), "ORION_PID_FILE": str(host.pid_file)}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, env=env,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
    assert host.path(9119).exists()
