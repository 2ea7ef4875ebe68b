"""host_agent/kvm/domain_edit.py: what attach/detach decide from a domain's XML alone (no libvirt), and the one
in-place lxml edit (dropping a `<metadata>` that holds only our record) keeping every other byte.

The same decisions against a real libvirtd are in tests/libvirt/test_attach_detach.py."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from lxml import etree

from host_agent.kvm.domain_edit import (
    CONFIG,
    LIVE,
    EditConflict,
    RegionState,
    plan_attach,
    plan_detach,
    read_state,
    scope_text,
    without_our_metadata,
)
from xml_templates.devices import ORION_NS, shmem_xml
from xml_templates.metadata import RegionRecord, regions_element

REPO = Path(__file__).resolve().parents[2]
OTHER_META = '<app:info xmlns:app="http://example.com/app"><app:os id="debian12"/></app:info>'


def domain(devices: str = "", metadata: str | None = None) -> str:
    """A domain as libvirt formats one (double quotes, as lxml writes them, so byte comparisons are exact)."""
    meta = "" if metadata is None else f"\n  <metadata>{metadata}</metadata>"
    return (f'<domain type="qemu">\n  <name>d</name>\n  <uuid>0b6f1c1e-6d2a-4b4e-9a57-1f2f3f4f5f6f</uuid>{meta}\n'
            f'  <memory unit="KiB">262144</memory>\n  <devices>\n    <serial type="pty"/>{devices}\n'
            f'    <memballoon model="none"/>\n  </devices>\n</domain>')


def state(index: int = 100, size: int | None = None, foreign: bool = False,
          records: tuple[RegionRecord, ...] = ()) -> RegionState:
    return RegionState(index=index, device_size_mib=size, foreign=foreign, records=records)


# --- reading ----------------------------------------------------------------------------------------------
def test_read_state_finds_our_device_by_alias_and_our_record() -> None:
    record = etree.tostring(regions_element([RegionRecord(100, 64, True)]), encoding="unicode")
    xml = domain(shmem_xml(100, 64) + shmem_xml(101, 16), record)
    got = read_state(xml, 100)
    assert (got.device_size_mib, got.foreign, got.record) == (64, False, RegionRecord(100, 64, True))
    assert read_state(xml, 102) == state(102, records=(RegionRecord(100, 64, True),))


def test_a_shmem_of_our_name_without_our_alias_is_foreign() -> None:
    xml = domain("<shmem name='orionsock100'><model type='ivshmem-plain'/><size unit='M'>16</size></shmem>")
    got = read_state(xml, 100)
    assert got.device_size_mib is None and got.foreign


@pytest.mark.parametrize(("size", "unit", "mib"), [("16", "M", 16), ("1", "G", 1024), ("33554432", "b", 32),
                                                    ("65536", "KiB", 64), ("x", "M", None), ("1", "parsec", None),
                                                    ("\u00b2", "M", None)])
def test_our_device_size_in_any_unit_and_unreadable_as_absent(size: str, unit: str, mib: int | None) -> None:
    """The units themselves are tests/unit/test_shmem_size.py's; here: an unreadable size reads as no device."""
    device = (f"<shmem name='orionsock100'><size unit='{unit}'>{size}</size>"
              "<alias name='ua-orion-orionsock100'/></shmem>")
    assert read_state(domain(device), 100).device_size_mib == mib


def test_scope_text_names_both_definitions() -> None:
    assert (scope_text(LIVE), scope_text(CONFIG)) == ("running domain", "persistent definition")


# --- attach -----------------------------------------------------------------------------------------------
def test_attach_to_a_clean_domain_adds_device_and_record_in_each_definition() -> None:
    plan = plan_attach({CONFIG: state(), LIVE: state()}, 100, 32, None, default_size_mib=128)
    assert plan.size_mib == 32 and plan.changes
    for step, scope in zip(plan.steps, (CONFIG, LIVE), strict=True):
        assert (step.scope, step.device, step.records) == (scope, True, (RegionRecord(100, 32, False),))


def test_attach_again_changes_nothing() -> None:
    ours = state(size=32, records=(RegionRecord(100, 32, True),))
    plan = plan_attach({CONFIG: ours, LIVE: ours}, 100, None, None, default_size_mib=128)
    assert plan.size_mib == 32 and not plan.changes  # size from the device; persistent kept from the record
    assert not plan_attach({CONFIG: ours}, 100, 32, True, default_size_mib=128).changes


def test_attach_completes_a_half_done_attach_and_keeps_other_records() -> None:
    other = RegionRecord(7, 128, False)
    plan = plan_attach({CONFIG: state(size=32, records=(other, RegionRecord(100, 32))),
                        LIVE: state(records=(other,))}, 100, None, None, default_size_mib=128)
    config, live = plan.steps
    assert (config.device, config.records) == (False, None)
    assert (live.device, live.records) == (True, (other, RegionRecord(100, 32)))


def test_persistent_flag_only_rewrites_the_record() -> None:
    plan = plan_attach({CONFIG: state(size=16, records=(RegionRecord(100, 16),))}, 100, None, True, 128)
    assert [(s.device, s.records) for s in plan.steps] == [(False, (RegionRecord(100, 16, True),))]


def test_default_size_is_used_only_when_nothing_is_attached() -> None:
    assert plan_attach({CONFIG: state()}, 100, None, None, default_size_mib=64).size_mib == 64


@pytest.mark.parametrize(("states", "words"), [
    ({CONFIG: state(size=16)}, "with 16 MiB, not 32 MiB; detach it first"),
    ({LIVE: state(foreign=True)}, "did not attach (no alias ua-orion-orionsock100)"),
])
def test_attach_conflicts_say_what_to_do(states: dict[str, RegionState], words: str) -> None:
    with pytest.raises(EditConflict, match=words.replace("(", r"\(").replace(")", r"\)")):
        plan_attach(states, 100, 32, None, default_size_mib=128)


# --- detach -----------------------------------------------------------------------------------------------
def test_detach_removes_only_our_device_and_entry() -> None:
    other = RegionRecord(7, 128, False)
    plan = plan_detach({CONFIG: state(size=16, foreign=False, records=(other, RegionRecord(100, 16))),
                        LIVE: state(size=16, records=(RegionRecord(100, 16),))}, 100)
    assert [(s.scope, s.device, s.records) for s in plan.steps] == [(CONFIG, True, (other,)), (LIVE, True, ())]


def test_detach_of_what_is_not_there_changes_nothing() -> None:
    assert not plan_detach({CONFIG: state(records=(RegionRecord(7, 128),)), LIVE: state()}, 100).changes


def test_detach_leaves_a_foreign_device_alone() -> None:
    with pytest.raises(EditConflict, match="left alone"):
        plan_detach({CONFIG: state(foreign=True)}, 100)
    # ours beside a foreign one of the same name: ours goes, theirs is not ours to touch
    assert plan_detach({CONFIG: state(size=16, foreign=True)}, 100).steps[0].device


# --- the in-place <metadata> edit ---------------------------------------------------------------------------
def test_metadata_holding_only_our_record_is_removed_and_every_other_byte_kept() -> None:
    before = domain(shmem_xml(3, 16))
    with_ours = domain(shmem_xml(3, 16), f'<orion:regions xmlns:orion="{ORION_NS}"/>')
    assert without_our_metadata(with_ours) == before


def test_metadata_with_anything_else_is_left_to_libvirt() -> None:
    ours = f'<orion:regions xmlns:orion="{ORION_NS}"/>'
    assert without_our_metadata(domain(metadata=OTHER_META + ours)) is None
    assert without_our_metadata(domain(metadata="<!-- a note -->" + ours)) is None
    assert without_our_metadata(domain()) is None


def test_first_child_metadata_keeps_the_layout() -> None:
    xml = f'<domain>\n  <metadata><orion:regions xmlns:orion="{ORION_NS}"/></metadata>\n  <name>d</name>\n</domain>'
    assert without_our_metadata(xml) == "<domain>\n  <name>d</name>\n</domain>"


# --- the CLI without libvirt ---------------------------------------------------------------------------------
def shm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "host_agent.admin.shm_cli", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=60)


def test_overview_and_help_list_attach_and_detach_with_exit_statuses() -> None:
    overview = shm("help").stdout
    assert "orion-shm attach DOMAIN" in overview and "orion-shm detach DOMAIN" in overview
    for command in ("attach", "detach"):
        result = shm("help", command)
        assert result.returncode == 0
        assert "--live" in result.stdout and "--config" in result.stdout and "--connect" in result.stdout
        assert "8 live detach" in " ".join(result.stdout.split())


@pytest.mark.parametrize("args", [["attach"], ["detach"], ["attach", "d", "-i", "x"], ["detach", "d", "--wait", "-1"],
                                  ["attach", "d", "--bogus"]])
def test_bad_attach_detach_arguments_exit_1_in_one_line(args: list[str]) -> None:
    result = shm(*args)
    assert result.returncode == 1, result
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr


# --- the gateway's translation of libvirt errors (no daemon needed) -----------------------------------------
class FakeLibvirtError:
    def __init__(self, code: int, message: str, domain: int = 0) -> None:
        self.code, self.message, self.domain = code, message, domain

    def get_error_code(self) -> int:
        return self.code

    def get_error_message(self) -> str:
        return self.message

    def get_error_domain(self) -> int:
        return self.domain


@pytest.mark.parametrize(("code", "message", "domain", "doing", "kind", "words"), [
    ("VIR_ERR_SYSTEM_ERROR", "Failed to connect socket to '/x': No such file", 0, "connect", "LibvirtdUnreachable",
     "libvirtd -d"),
    ("VIR_ERR_SYSTEM_ERROR", "End of file while reading data", "VIR_FROM_RPC", "attach", "LibvirtdUnreachable",
     "not running"),
    ("VIR_ERR_SYSTEM_ERROR", "Failed to connect socket: Permission denied", 0, "connect", "NotPermitted",
     "run as root"),
    ("VIR_ERR_SYSTEM_ERROR", "cannot open file: Permission denied", "VIR_FROM_QEMU", "attach", "Refused",
     "libvirt refused to attach"),
    ("VIR_ERR_ACCESS_DENIED", "access denied", 0, "attach", "NotPermitted", "'libvirt' group"),
    ("VIR_ERR_OPERATION_DENIED", "operation forbidden for read only access", 0, "attach", "NotPermitted", ""),
    ("VIR_ERR_NO_DOMAIN", "Domain not found", 0, "look up", "DomainNotFound", "list --all"),
    ("VIR_ERR_OPERATION_INVALID", "domain is not running", 0, "attach it", "Refused", "refused to attach it"),
])
def test_libvirt_errors_become_ours(code: str, message: str, domain: int | str, doing: str, kind: str,
                                    words: str) -> None:
    from host_agent.kvm import libvirt_gateway as gw

    libvirt = pytest.importorskip("libvirt")
    error_domain = getattr(libvirt, domain) if isinstance(domain, str) else domain
    got = gw._translate(FakeLibvirtError(getattr(libvirt, code), message, error_domain), "qemu:///system", doing)
    assert type(got).__name__ == kind and words in str(got) and message in str(got)
