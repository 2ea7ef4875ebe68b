"""host_agent/kvm/qemu_region.py: the one "is this region ready for QEMU" policy of the qemu hook and `orion-shm
attach`.

Each case uses its own directory and QEMU user nobody:nogroup (on every Debian), never /dev/shm or libvirt. The
hook's own cases (tests/unit/test_qemu_hook.py) and attach's (tests/libvirt/test_attach_detach.py) run the same
function through their entry points.
"""
from __future__ import annotations

import os
import pwd
import stat
from pathlib import Path
from typing import Any

import pytest

from host_agent import shm_admin
from host_agent.kvm import qemu_region
from host_agent.kvm.qemu_region import RegionNotReady, make_ready
from host_agent.server_conf import ShmSettings

MIB = 1 << 20
AS_ROOT = os.geteuid() == 0
QEMU = ShmSettings(user="nobody", group="nogroup")
needs_root = pytest.mark.skipif(not AS_ROOT, reason="giving a file to another user needs root")


def blank(path: Path, mib: int, mode: int = 0o600) -> Path:
    """What a root `truncate` leaves: a blank file QEMU's user cannot open."""
    with open(path, "wb") as f:
        f.truncate(mib * MIB)
    path.chmod(mode)
    return path


def refused(tmp_path: Path, index: int, size_mib: int, settings: ShmSettings = QEMU) -> str:
    with pytest.raises(RegionNotReady) as caught:
        make_ready(index, size_mib, str(tmp_path), settings, "g1")
    message = str(caught.value)
    assert "\n" not in message, message
    return message


def test_a_missing_region_is_created_for_qemu(tmp_path: Path) -> None:
    ready = make_ready(3, 32, str(tmp_path), QEMU, "g1")
    st = os.stat(ready.path)
    assert ready.created and ready.path == str(tmp_path / "orionsock3") and st.st_size == 32 * MIB
    assert ready.note.startswith(f"created {ready.path}: 32 MiB")
    if AS_ROOT:
        assert (pwd.getpwuid(st.st_uid).pw_name, stat.S_IMODE(st.st_mode)) == ("nobody", 0o660)


def test_a_good_existing_region_is_left_as_it_is(tmp_path: Path) -> None:
    made = shm_admin.create(4, 32, str(tmp_path), settings=QEMU, mode=0o666)
    before = os.stat(made.path)
    ready = make_ready(4, 32, str(tmp_path), QEMU, "g1")
    after = os.stat(made.path)
    assert not ready.created and "left as it is" in ready.note
    assert (after.st_ino, after.st_mode, after.st_uid, after.st_mtime_ns) == \
           (before.st_ino, before.st_mode, before.st_uid, before.st_mtime_ns)


@needs_root
def test_a_region_qemu_cannot_open_is_handed_to_qemu(tmp_path: Path) -> None:
    """The policy: hand it over (as the hook always did), not refuse it (as attach did)."""
    path = blank(tmp_path / "orionsock5", 32)
    ready = make_ready(5, 32, str(tmp_path), QEMU, "g1")
    st = path.stat()
    assert (pwd.getpwuid(st.st_uid).pw_name, stat.S_IMODE(st.st_mode)) == ("nobody", 0o660)
    assert not ready.created and "gave it to them with mode 0660" in ready.note


def test_a_hand_over_this_user_may_not_make_is_one_line_with_the_chown(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """attach run by a libvirt-group member rather than root: fchown fails; say what to run instead."""
    path = blank(tmp_path / "orionsock6", 32)

    def not_root(*_args: Any) -> None:
        raise PermissionError(1, "Operation not permitted")
    monkeypatch.setattr(qemu_region.os, "fchown", not_root)
    message = refused(tmp_path, 6, 32)
    assert "only root may give it" in message and "run as root" in message
    assert f"'chown nobody:nogroup {path} && chmod 0660 {path}'" in message
    assert stat.S_IMODE(path.stat().st_mode) == 0o600  # nothing changed


@needs_root
def test_a_name_replaced_by_a_link_after_the_check_gives_nothing_away(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """/dev/shm is everyone's: a region swapped for a link between the check and the chown must not make root
    give the link's target to QEMU (the hook used to chown by name, following the link)."""
    path = blank(tmp_path / "orionsock7", 32)
    victim = blank(tmp_path / "victim", 1)

    def swap_then_judge(*_args: Any) -> bool:
        path.unlink()
        path.symlink_to(victim)
        return False
    monkeypatch.setattr(qemu_region, "_can_read_write", swap_then_judge)
    assert "was replaced or removed while it was checked" in refused(tmp_path, 7, 32)
    st = victim.stat()
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o600)


@pytest.mark.parametrize(("make", "words"), [
    (lambda p: p.mkdir(), "is a directory, not a region file"),
    (lambda p: p.symlink_to(p.parent / "elsewhere"), "is a symbolic link, not a region file"),
    (lambda p: os.mkfifo(p), "is a special file, not a region file"),
], ids=["directory", "link", "fifo"])
def test_what_is_not_a_file_is_refused(tmp_path: Path, make: Any, words: str) -> None:
    make(tmp_path / "orionsock8")
    message = refused(tmp_path, 8, 32)
    assert words in message and "orion-shm remove 8" in message


def test_a_region_smaller_than_the_device_is_refused_with_the_size_that_fits(tmp_path: Path) -> None:
    blank(tmp_path / "orionsock9", 100, mode=0o666)
    message = refused(tmp_path, 9, 128)
    assert "is 100 MiB but domain g1 wants 128 MiB" in message and "orion-shm remove 9" in message
    assert "at most 64 MiB (orion-shm attach -s)" in message  # a power of two: QEMU's PCI BAR
    assert (tmp_path / "orionsock9").stat().st_size == 100 * MIB


def test_a_region_laid_out_larger_than_the_device_is_refused(tmp_path: Path) -> None:
    shm_admin.create(10, 64, str(tmp_path), settings=QEMU, mode=0o666)
    message = refused(tmp_path, 10, 32)
    assert "is laid out for 64 MiB but domain g1's device maps only 32 MiB" in message
    assert "orion-shm remove 10" in message and "a size of 64 MiB" in message


def test_a_corrupt_header_is_refused(tmp_path: Path) -> None:
    made = shm_admin.create(11, 32, str(tmp_path), settings=QEMU, mode=0o666)
    with open(made.path, "r+b") as f:
        f.write(b"\xff" * 64)
    assert "orion-shm inspect" in refused(tmp_path, 11, 32)


def test_an_unknown_qemu_user_leaves_the_region_as_it_is(tmp_path: Path) -> None:
    path = blank(tmp_path / "orionsock12", 32)
    ready = make_ready(12, 32, str(tmp_path), ShmSettings(user="no-such-user-here", group="nogroup"), "g1")
    assert "left as it is" in ready.note and "does not exist here" in ready.note
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_a_region_made_meanwhile_by_someone_else_is_checked_not_failed(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    real_create = shm_admin.create

    def racing_create(index: int, size_mib: int, **kwargs: Any) -> Any:
        real_create(index, size_mib, kwargs["directory"], settings=QEMU, mode=0o666)  # the other creator
        return real_create(index, size_mib, **kwargs)  # "has already exists."
    monkeypatch.setattr(shm_admin, "create", racing_create)
    ready = make_ready(13, 32, str(tmp_path), QEMU, "g1")
    assert not ready.created and "left as it is" in ready.note
