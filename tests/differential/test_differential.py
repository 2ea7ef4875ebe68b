"""The differential corpus (tests/differential/corpus.py) through every path this machine has, each transcript
compared value for value with the fake driver's own, called directly:

- the capsule path (guest_runtime.forward.Forwarder, in this process) and the native `libcuda.so.1` (ctypes, in a
  child process with ORION_SHM), each on a region served locally by a real agent over the fake driver
  (tests/forwarding_rig.py), and each relayed across two network namespaces to a relay listener over TCP
  (tests/relay_net.py);
- relayed over RDMA: tests/guest/rdma_guest.py runs the same corpus inside the Soft-RoCE guest
  (tests/guest/test_guest_rdma.py);
- on the GPU: tests/gpu/test_differential_gpu.py runs the same corpus with the real driver as the reference, and
  tests/gpu/test_forwarded_programs.py and test_native_frameworks.py compare the programs' values native, local
  and relayed.

Every difference fails with the first step that differs. 0 differences is the only pass.
"""
from __future__ import annotations

import functools
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from host_agent.relay import compiled_pump
from ivshmem.layout import Geometry
from ivshmem.region import Region
from tests import forwarding_rig
from tests.differential.corpus import Runner, compare, fake_table, first_difference, sequence
from tests.differential.pool_kernels import PoolKernelProgram, fake_table_with_kernels
from tests.fake_driver import FakeDriver
from tests.forwarding_rig import Rig, native_child_env

bounded, start = forwarding_rig.bounded, forwarding_rig.start  # the rig's fixtures

REPO = Path(__file__).resolve().parents[2]
SEEDS = range(1, 5)
NATIVE_TIMEOUT_S = 50


@functools.cache
def reference(seed: int) -> list[list[Any]]:
    """The fake driver's own transcript of `seed` (deterministic: computed once per test process)."""
    return Runner(fake_table(FakeDriver(devices=1))).run(sequence(seed))


def _assert_as_the_fake(transcripts: list[list[list[Any]]]) -> None:
    differences = compare(SEEDS, [reference(seed) for seed in SEEDS], transcripts)
    assert not differences, differences


def test_the_capsule_path_gives_the_fake_drivers_own_transcript(served: Rig) -> None:
    runner = Runner(served.guest().fn)
    _assert_as_the_fake([runner.run(sequence(seed)) for seed in SEEDS])


def _native_corpus(rig: Rig, library: Path, **env: str) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-m", "tests.differential.run_corpus", "driver", str(library),
                           *map(str, SEEDS)], cwd=REPO, env=native_child_env(library, rig.path) | env,
                          capture_output=True, text=True, timeout=NATIVE_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def test_the_native_driver_gives_the_fake_drivers_own_transcript(served: Rig, library: Path) -> None:
    _assert_as_the_fake(_native_corpus(served, library)["transcripts"])


def test_copies_split_over_two_guest_cores_give_the_fake_drivers_own_transcript(
        start: Callable[..., Rig], region_path: str, library: Path) -> None:
    """The native driver with its copy helper on (ORION_COPY_THREADS=2, copy_helper.c) on a region whose staging
    chunks are large enough to split (the rig's default region has 64 KiB chunks, which never are): the corpus'
    copies, 1 byte to 2.5 MiB both ways, each chunk filled or emptied half by the helper, give the fake's own
    values; and the helper did copy halves."""
    with Region.open(region_path) as region:
        region.format(Geometry.build(region.size, 2))
        assert region.geometry.chunk_size >= 256 << 10  # ORION_COPY_SPLIT_MIN (128 KiB) twice: split chunks
    seen = _native_corpus(start(), library, ORION_COPY_THREADS="2")
    _assert_as_the_fake(seen["transcripts"])
    assert seen["copy_halves"] > 0, seen["copy_halves"]


@functools.cache
def pool_kernels_reference() -> list[list[Any]]:
    driver = FakeDriver(devices=1)
    return PoolKernelProgram(fake_table_with_kernels(driver, fake_table(driver)), uva_copies=False).run()


def test_a_kernel_given_page_locked_memory_sees_and_leaves_the_fake_drivers_bytes(served: Rig) -> None:
    """Kernels given cuMemAllocHost memory (tests/differential/pool_kernels.py): on a relayed session through the
    pool's mirror on the GPU host (docs/remote.md); every step's words as the fake driver's own."""
    got = PoolKernelProgram(served.guest().fn, uva_copies=False).run()
    assert got == pool_kernels_reference()


def test_the_native_driver_gives_a_kernel_page_locked_memory_as_the_fake_does(served: Rig, library: Path,
                                                                              tmp_path: Path) -> None:
    """The same through the native driver. Relayed, once memory is mirrored the relay's compiled pump still forwards
    a launch that names no pinned memory while the CPU changed no mirrored byte (relay_pump.c, set_mirrored): the
    program's first such launch is the pump's (its ORION_STATS account), the others the relay's Python."""
    stats = tmp_path / "stats-%p.txt"
    done = subprocess.run([sys.executable, "-m", "tests.differential.run_corpus", "driver", str(library),
                           "pool-kernels-no-uva"], cwd=REPO, capture_output=True, text=True, timeout=NATIVE_TIMEOUT_S,
                          env=native_child_env(library, served.path) | {"ORION_STATS": str(stats)})
    assert done.returncode == 0, done.stderr[-4000:]
    assert json.loads(done.stdout)["transcripts"] == [pool_kernels_reference()]
    if served.relayed and compiled_pump.PROGRAM.load() is not None:
        (written,) = tmp_path.glob("stats-*.txt")
        row = next(line for line in written.read_text().splitlines() if line.startswith("(relayed cuLaunchKernel)"))
        pumped, _compiled_us, _driver_us, python = row.split("|")[1].split()[:4]
        pumped, python = int(pumped), int(python)
        assert pumped == 1 and python > 1, row


def test_the_corpus_sees_a_wrong_byte() -> None:
    """The comparison itself: the transcript of a driver whose posted device-to-host copies claim success and copy
    nothing (issue 26's defect) is told apart."""
    class Lossy(FakeDriver):
        def cuMemcpyDtoHAsync(self, *args: object) -> tuple[object, ...]:  # noqa: N802
            return (0,)  # claims success, copies nothing
    seed = next(s for s in SEEDS if any(op.kind == "dtoh" and op.stream for op in sequence(s)))
    ops = sequence(seed)
    lossy = Runner(fake_table(Lossy(devices=1))).run(ops)
    assert first_difference(reference(seed), lossy, ops).startswith("step ")
