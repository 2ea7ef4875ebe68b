"""region_file.examine: which files oriond serves, formats, or leaves alone (docs/security.md), on real files."""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from host_agent import region_file
from host_agent.limits import LogLimiter, TokenBucket
from ivshmem import layout
from ivshmem.region import Region

MIB = 1 << 20


def _file(path: Path, size: int = 32 * MIB, mode: int = 0o600, data: bytes = b"", at: int = 0) -> Path:
    with open(path, "wb") as f:
        f.truncate(size)
        if data:
            f.seek(at)
            f.write(data)
    os.chmod(path, mode)
    return path


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_file_of_zeros_is_formatted_and_a_formatted_one_served(tmp_path: Path) -> None:
    path = _file(tmp_path / "orionsock1")
    verdict = region_file.examine(str(path))
    assert (verdict.action, verdict.channels, verdict.warning) == (region_file.FORMAT, 8, "")
    with Region.open(path) as region:
        region.format(layout.Geometry.build(region.size, 4))
    verdict = region_file.examine(str(path))
    assert (verdict.action, verdict.channels) == (region_file.SERVE, 4)


def test_a_damaged_orion_header_is_formatted_again(tmp_path: Path) -> None:
    path = _file(tmp_path / "orionsock1")
    with Region.open(path) as region:
        region.format(layout.Geometry.build(region.size))
        region.buf[100] ^= 0xFF  # inside the CRC span
    verdict = region_file.examine(str(path))
    assert verdict.action == region_file.FORMAT and "checksum" in verdict.reason


@pytest.mark.parametrize("at", [0, 4096, 31 * MIB])
def test_a_file_holding_other_bytes_is_left_alone(tmp_path: Path, at: int) -> None:
    path = _file(tmp_path / "orionsock1", data=b"not a region", at=at)
    before = _digest(path)
    verdict = region_file.examine(str(path))
    assert verdict.action == region_file.REFUSE and "not an Orion region" in verdict.reason, verdict
    if at:  # no Orion header and zeros up front: the first byte of data is named
        assert f"offset {at}" in verdict.reason
    assert _digest(path) == before


def test_links_fifos_and_directories_are_refused_and_their_targets_untouched(tmp_path: Path) -> None:
    target = _file(tmp_path / "precious", data=b"keep me")
    before = _digest(target)
    (tmp_path / "orionsock1").symlink_to(target)
    os.mkfifo(tmp_path / "orionsock2")
    (tmp_path / "orionsock3").mkdir()
    reasons = [region_file.examine(str(tmp_path / f"orionsock{i}")) for i in (1, 2, 3)]
    assert [v.action for v in reasons] == [region_file.REFUSE] * 3
    assert "symbolic link" in reasons[0].reason and "not a regular file" in reasons[1].reason
    assert _digest(target) == before


@pytest.mark.parametrize("size", [0, 4096, 1 * MIB, 2 * MIB])
def test_a_file_too_small_for_a_region_is_refused_in_one_line(tmp_path: Path, size: int) -> None:
    verdict = region_file.examine(str(_file(tmp_path / "orionsock1", size=size)))
    assert verdict.action == region_file.REFUSE and "\n" not in verdict.reason and "orion-shm create" in verdict.reason


def test_who_may_reach_the_file_decides(open_shm_dir: Path) -> None:
    assert region_file.sealed_directory(str(open_shm_dir / "orionsock1")) is None
    writable = region_file.examine(str(_file(open_shm_dir / "orionsock1", mode=0o666)))
    assert writable.action == region_file.REFUSE and "writable by every local user" in writable.reason
    readable = region_file.examine(str(_file(open_shm_dir / "orionsock2", mode=0o644)))
    assert readable.action == region_file.FORMAT and "readable by every local user" in readable.warning
    tenant = region_file.examine(str(_file(open_shm_dir / "orionsock3", mode=0o660)))
    assert (tenant.action, tenant.warning) == (region_file.FORMAT, "")
    assert not any((open_shm_dir / "orionsock1").read_bytes()), "a refused file was written"


@pytest.mark.parametrize("directory_mode", [0o700, 0o744, 0o766])
def test_in_a_sealed_directory_the_files_mode_does_not_let_others_in(open_shm_dir: Path, directory_mode: int) -> None:
    """orion-k8s-plugin's regions: mode 0666 in a directory that neither group nor others may search."""
    sealed = open_shm_dir / "k8s"
    sealed.mkdir()
    sealed.chmod(directory_mode)
    region = _file(sealed / "orionsock1", mode=0o666)
    assert region_file.sealed_directory(str(region)) == str(sealed)
    verdict = region_file.examine(str(region))
    assert (verdict.action, verdict.warning) == (region_file.FORMAT, "")
    sealed.chmod(directory_mode | 0o001)  # others may pass now: the file's own mode is all that is left
    assert region_file.sealed_directory(str(region)) is None
    assert region_file.examine(str(region)).action == region_file.REFUSE


def test_first_nonzero_byte_skips_holes_and_finds_data(tmp_path: Path) -> None:
    path = _file(tmp_path / "f", size=8 * MIB, data=b"\0\0\0\x01", at=5 * MIB)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert region_file.first_nonzero_byte(fd, 8 * MIB) == 5 * MIB + 3
        assert region_file.first_nonzero_byte(fd, 5 * MIB) is None  # what lies beyond `size` is not looked at
    finally:
        os.close(fd)


def test_token_bucket_allows_a_burst_then_the_rate() -> None:
    now = [0.0]
    bucket = TokenBucket(rate=2.0, burst=4, clock=lambda: now[0])
    assert [bucket.take() for _ in range(5)] == [True] * 4 + [False]
    now[0] += 0.5
    assert (bucket.ready(), bucket.take(), bucket.take()) == (True, True, False)
    now[0] += 100
    assert sum(bucket.take() for _ in range(10)) == 4  # never more than the burst at once


def test_log_limiter_logs_the_first_then_one_line_per_period(caplog: pytest.LogCaptureFixture) -> None:
    import logging

    now = [0.0]
    limiter = LogLimiter(logging.getLogger("test.limiter"), first=3, every=60.0, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="test.limiter"):
        for i in range(1000):
            limiter.log(logging.WARNING, "bad things", "bad thing %d", i)
        now[0] += 61
        limiter.log(logging.WARNING, "bad things", "bad thing %d", 1000)
    lines = [r.getMessage() for r in caplog.records]
    assert lines[:3] == ["bad thing 0", "bad thing 1", "bad thing 2"]
    assert len(lines) == 5 and lines[-1].startswith("998 more bad things (1001 in all)"), lines


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a file another user's and to mark it")
def test_another_users_file_is_served_only_with_roots_mark_for_that_user(open_shm_dir: Path) -> None:
    path = _file(open_shm_dir / "orionsock1")
    os.chown(path, 4242, 4242)
    owners = frozenset({0})
    refused = region_file.examine(str(path), owners=owners)
    assert refused.action == region_file.REFUSE and "belongs to uid 4242" in refused.reason
    assert "orion-shm create -i N --owner USER" in refused.reason and "\n" not in refused.reason
    assert region_file.examine(str(path)).action == region_file.FORMAT  # named on the command line: any owner
    os.setxattr(path, region_file.TENANT_MARK, b"4243")  # made for someone else
    assert region_file.examine(str(path), owners=owners).action == region_file.REFUSE
    os.setxattr(path, region_file.TENANT_MARK, b"4242")
    assert region_file.examine(str(path), owners=owners).action == region_file.FORMAT
    assert region_file.examine(str(path), owners=frozenset({0, 4242})).action == region_file.FORMAT
    # The premise: the user cannot write the mark on a file of their own.
    own = _file(open_shm_dir / "orionsock2")
    os.chown(own, 4242, 4242)
    tried = subprocess.run(["setpriv", "--reuid", "4242", "--regid", "4242", "--clear-groups", sys.executable, "-c",
                            f"import os; os.setxattr({str(own)!r}, {region_file.TENANT_MARK!r}, b'4242')"],
                           capture_output=True, text=True, timeout=30)
    assert tried.returncode != 0 and "Operation not permitted" in tried.stderr, tried.stderr
    assert region_file.examine(str(own), owners=owners).action == region_file.REFUSE
