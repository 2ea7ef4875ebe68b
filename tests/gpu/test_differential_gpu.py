"""The differential corpus (tests/differential/corpus.py) on the GPU machine, with the real driver as the reference:
seeded sequences of copies and memsets (1 byte to 2.5 MiB, pageable and page-locked host memory, synchronous and
posted on three streams, every direction, copies past an allocation's end), whose transcripts (every status, the
SHA-256 of every buffer at each check) must be equal value for value.

- The reference: the real libcuda, called in a child process that sees the GPU and has no Orion variable (the one
  `cuda.bindings` loads, found from the child's /proc/self/maps: the loader's own search, LD_LIBRARY_PATH first).
- Compared with it: the native guest driver (`libcuda.so.1`, built by the tests) and the capsule path (the
  Forwarder a cuda-python program gets from guest_runtime.activate), each in a child that sees no GPU
  (CUDA_VISIBLE_DEVICES=""), served by a real oriond on this machine and relayed over TCP loopback to a second
  one that holds the GPU (tests/gpu/test_forwarded_programs.py's fixtures).
- And the fake driver (tests/fake_driver.py), the reference of the CPU machine's runs of the same corpus
  (tests/differential/test_differential.py): if it differs from the real driver, those runs check the wrong thing.

Why: a wrong value with CUDA_SUCCESS is the worst defect this product can have (a relayed page-locked copy once
returned zeros), and only a comparison of values finds one. The corpus's expectations were made against the fake;
where the real driver legitimately differs, the comparison is still with the real driver, so the corpus is not
weakened here.

One program with a kernel joins them: tests/differential/pool_kernels.py, a real kernel given page-locked memory
at every coherence point (on a relayed session through the pool's mirror on the GPU host), compared with the real
driver's run and with the fake driver's (which runs that one kernel).

What does not belong here: frameworks (the programs' values: test_forwarded_programs.py and
test_native_frameworks.py), and timings.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.differential.corpus import Runner, compare, fake_table, sequence
from tests.differential.pool_kernels import UVA_STEP, PoolKernelProgram, fake_table_with_kernels
from tests.fake_driver import FakeDriver
from tests.gpu.test_forwarded_programs import HAS_GPU, PATHS, REPO, oriond, relayed, served  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not HAS_GPU, reason="needs an NVIDIA GPU (device machine)")]

SEEDS = tuple(range(1, 9))
RUN_TIMEOUT_S = 300  # a hang guard: the whole corpus takes seconds
# The real libcuda as cuda.bindings finds it: every libcuda file mapped once the driver answered cuInit.
FIND_REAL = ("import json; from cuda.bindings import driver; (err,) = driver.cuInit(0); assert int(err) == 0, err; "
             "print(json.dumps(sorted({l.split()[-1] for l in open('/proc/self/maps') if '/libcuda.so' in l})))")
Transcripts = list[list[list[Any]]]


def _without_orion(**extra: str) -> dict[str, str]:
    """This environment without Orion's variables, the repository importable, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORION_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    return env | extra


def _corpus(mode: str, *args: str, env: dict[str, str]) -> dict[str, Any]:
    """tests/differential/run_corpus.py's output for SEEDS, then the pool-kernel program (its last transcript)."""
    done = subprocess.run([sys.executable, "-m", "tests.differential.run_corpus", mode, *args, *map(str, SEEDS),
                           "pool-kernels"], cwd=REPO, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert done.returncode == 0, f"the corpus through {mode} {' '.join(args)} failed:\n{done.stderr[-5000:]}"
    out: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    assert len(out["transcripts"]) == len(SEEDS) + 1
    return out


def real_libcuda() -> str:
    done = subprocess.run([sys.executable, "-c", FIND_REAL], env=_without_orion(), capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S)
    assert done.returncode == 0, f"cuda.bindings found no working driver here:\n{done.stderr[-3000:]}"
    found: list[str] = json.loads(done.stdout.splitlines()[-1])
    assert len(found) == 1, f"not one libcuda mapped: {found}"
    return found[0]


@pytest.fixture(scope="module")
def reference() -> Transcripts:
    """The real driver's transcripts of SEEDS (one child for every test of this module)."""
    path = real_libcuda()
    out = _corpus("driver", path, env=_without_orion())
    assert out["libcuda"] == [path], out["libcuda"]
    sys.stderr.write(f"reference: {path}\n")
    transcripts: Transcripts = out["transcripts"]
    return transcripts


def _assert_same(reference: Transcripts, transcripts: Transcripts, what: str) -> None:
    differences = compare(SEEDS, reference[:len(SEEDS)], transcripts[:len(SEEDS)])
    assert not differences, f"{what} differs from the real driver:\n{differences}"
    assert transcripts[len(SEEDS):] == reference[len(SEEDS):], (
        f"{what}: a kernel given page-locked memory (tests/differential/pool_kernels.py) differs from the real "
        f"driver:\n{transcripts[len(SEEDS):]}\nreal: {reference[len(SEEDS):]}")


@pytest.mark.parametrize("path", PATHS)
def test_the_native_driver_gives_the_real_drivers_transcript(path: str, request: pytest.FixtureRequest,
                                                             library: Path, reference: Transcripts) -> None:
    agent = served(request, path)
    out = _corpus("driver", str(library), env=_without_orion(
        ORION_SHM=str(agent.region), ORION_NATIVE="1", ORION_NATIVE_LIB=str(library), CUDA_VISIBLE_DEVICES=""))
    assert all(Path(p).parent == library.parent for p in out["libcuda"]), f"the real libcuda mapped: {out['libcuda']}"
    _assert_same(reference, out["transcripts"], f"the native driver, {path}")


@pytest.mark.parametrize("path", PATHS)
def test_the_capsule_path_gives_the_real_drivers_transcript(path: str, request: pytest.FixtureRequest,
                                                            reference: Transcripts) -> None:
    agent = served(request, path)
    out = _corpus("capsule", env=_without_orion(ORION_SHM=str(agent.region), ORION_NATIVE="0",
                                                CUDA_VISIBLE_DEVICES=""))
    _assert_same(reference, out["transcripts"], f"the capsule path, {path}")


def test_the_fake_driver_gives_the_real_drivers_transcript(reference: Transcripts) -> None:
    """The CPU machine's reference agrees with the real driver: a failure here is the fake's (or the corpus's) to
    fix, not the product's."""
    fake = [Runner(fake_table(FakeDriver(devices=1))).run(sequence(seed)) for seed in SEEDS]
    driver = FakeDriver(devices=1)
    fake.append(PoolKernelProgram(fake_table_with_kernels(driver, fake_table(driver)), uva_copies=False).run())
    without_uva = [step for step in reference[-1] if step[0] != UVA_STEP]
    _assert_same(reference[:-1] + [without_uva], fake, "the fake driver")
