"""Relay connections over RDMA, for real: Soft-RoCE (rdma_rxe) inside the test guest, since the CI machine's kernel
has no RDMA (TESTBED.md). One boot runs tests/guest/rdma_guest.py check:
- the transport alone (host_agent/relay/rdma_stream.py): two processes move a TCP connection to an RC queue pair and
  exchange records of every size class (empty, one piece, exactly a piece, several, twice the whole inbox) and a
  frame written and read in uneven pieces, each checked byte for byte; then the far end dies and the near end says
  so;
- two real orionds relaying a client's session (a relay with enable_rdma and [server-relay] remote_addr, a GPU host
  with its listener over the stand-in driver): the session's 12 MiB copy comes back intact over RDMA, both logs
  say RDMA; the link drops under a session (the guest's calls fail, the GPU host ends the session) and a new
  session works once it is back; then, with the GPU host's ibverbs_device naming a device it does not have, the
  same session over TCP, and both logs say why;
- the differential corpus (tests/differential/corpus.py, its first seeds) relayed over RDMA through the capsule
  path and the native `libcuda.so.1`, each transcript equal to the fake driver's own, computed in the guest. The
  native library is built here, into the checkout's build/ (the guest sees the checkout over 9p and has no C
  compiler); where it cannot be built, the guest finds none and the test fails, saying why.
"""
from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from guest_runtime.native.build import BuildError, build_driver

from .vm import REPO_ROOT, image_ready, run_guest

pytestmark = [
    pytest.mark.guest,
    pytest.mark.skipif(not image_ready() and not os.environ.get("CI"),
                       reason="guest image not built: run `bash tests/guest/build-image.sh` (make test does)"),
]


@pytest.fixture(scope="module")
def native_build() -> Iterator[tuple[str, str]]:
    """(the native library's path relative to the checkout, '' or why it could not be built): a fresh build in a
    directory of the checkout's build/ (ignored by git), removed afterwards."""
    parent = REPO_ROOT / "build"
    parent.mkdir(exist_ok=True)
    where = Path(tempfile.mkdtemp(prefix="rdma-guest-native-", dir=parent))
    library, why = where / "libcuda.so.1", ""
    try:
        build_driver(library)
    except BuildError as exc:
        why = str(exc)
    try:
        yield library.relative_to(REPO_ROOT).as_posix(), why
    finally:
        shutil.rmtree(where, ignore_errors=True)


@pytest.fixture(scope="module")
def guest_run(native_build: tuple[str, str]) -> list[str]:
    result = run_guest("tests/guest/rdma_guest.py", ["check", f"native={native_build[0]}"], timeout=480,
                       memory_mb=1024, cpus=2)
    assert result.rc == 0, result.serial[-6000:] + result.qemu_log
    return result.lines("RDMA-")


def test_soft_roce_is_up_in_the_guest(guest_run: list[str]) -> None:
    assert "RDMA-SETUP ok" in guest_run
    assert "RDMA-PORT rxe0 port 1, GID index 1" in guest_run  # the GID of 127.0.0.1 (::ffff:7f00:1), found by address


def test_records_of_every_size_cross_the_rdma_transport_intact(guest_run: list[str]) -> None:
    echoes = [line for line in guest_run if line.startswith("RDMA-ECHO")]
    assert len(echoes) == 8 and all(line.endswith(" ok") for line in echoes), echoes


def test_a_frame_written_and_read_in_uneven_pieces_arrives_whole(guest_run: list[str]) -> None:
    assert any(line.startswith("RDMA-PIECES size=") and line.endswith(" ok") for line in guest_run), guest_run


def test_the_transport_sees_the_far_end_die(guest_run: list[str]) -> None:
    death = next(line for line in guest_run if line.startswith("RDMA-DEATH"))
    assert re.match(r"RDMA-DEATH seen in [0-9.]+ s: the relay peer closed the connection", death), death


def test_a_relayed_session_runs_over_rdma_when_both_hosts_have_it(guest_run: list[str]) -> None:
    assert any(line.startswith("RDMA-RELAY rdma copy=ok") for line in guest_run), guest_run
    logs = [line for line in guest_run if line.startswith("RDMA-LOG rdma ")]
    assert any("relayed to 127.0.0.1:" in line and "over rdma (rxe0 port 1, GID index 1)" in line
               for line in logs), logs
    assert "RDMA-LOG rdma gpu: RDMA ibverbs using device: rxe0." in logs
    assert "RDMA-LOG rdma gpu: Client supports RDMA mode, then server runs in RDMA mode." in logs


def test_the_link_drops_calls_fail_the_gpu_host_ends_the_session_and_a_new_one_works_once_it_heals(
        guest_run: list[str]) -> None:
    drop = next(line for line in guest_run if line.startswith("RDMA-LINKDOWN"))
    assert re.match(r"RDMA-LINKDOWN sync=46 after [0-9.]+ s, then 46$", drop), drop  # CUDA_ERROR_DEVICE_UNAVAILABLE
    logs = [line for line in guest_run if line.startswith("RDMA-LOG rdma ")]
    assert any(" relay: " in line and "the GPU host is gone" in line for line in logs), logs
    assert any(" gpu: " in line and " ended: " in line for line in logs), logs  # its GPU memory freed with it
    assert "RDMA-HEALED copy=ok" in guest_run


def test_without_a_device_on_the_gpu_host_the_session_falls_back_to_tcp_and_both_ends_say_why(
        guest_run: list[str]) -> None:
    assert any(line.startswith("RDMA-RELAY fallback copy=ok") for line in guest_run), guest_run
    logs = [line for line in guest_run if line.startswith("RDMA-LOG fallback ")]
    why = "ibverbs_device rxe9 is not an RDMA device here (there are: rxe0)"
    assert any("over tcp: " + why in line for line in logs if " relay: " in line), logs
    assert "RDMA-LOG fallback gpu: Client supports TCP mode, then server also falls back to TCP mode." in logs
    assert any(why + ": relayed sessions use TCP" in line for line in logs if "listens on" in line), logs


@pytest.mark.parametrize("path", ["capsule", "native"])
def test_the_differential_corpus_relayed_over_rdma_gives_the_fake_drivers_own_transcript(
        guest_run: list[str], native_build: tuple[str, str], path: str) -> None:
    line = next((line for line in guest_run if line.startswith(f"RDMA-DIFF {path} ")), f"no RDMA-DIFF {path} line")
    why = "\n".join(line for line in guest_run if line.startswith(f"RDMA-WHY {path} "))
    built = f"\n(the host could not build the native library: {native_build[1]})" if native_build[1] else ""
    assert re.match(rf"RDMA-DIFF {path} seeds=[1-9]\d* differences=0 relayed=rdma(,rdma)* took_s=", line), \
        f"{line}\n{why}{built}"
