"""Module images sent once (issue 13): loads by digest against a real agent (tests/forwarding_rig.py: a RegionServer
whose session workers run the CUDA executor over the fake driver) with a per-host image cache in a temporary
directory, from the Python capsule path and from the native guest driver.

What crossed the ring is counted on the agent's side: `received` wraps CudaExecutor.handle before the rig forks its
agent, so every session worker appends the opcode and payload length of each request it handles to a file. What
reached the "driver" is the fake's journal (each load's image length and SHA-256). CPU only."""
from __future__ import annotations

import ctypes
import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from host_agent.session.executor import CudaExecutor, ExecutorOptions
from host_agent.session.image_cache import CacheSettings
from ivshmem.driver_api import (
    CALLS,
    IMAGE_BY_DIGEST,
    IMAGE_BY_DIGEST_MIN,
    IMAGE_BY_DIGEST_REQUEST,
    IMAGE_NOT_CACHED,
)
from ivshmem.record import Record, Status
from tests.forwarding_rig import GUEST_DEVICES, SENTINELS, Rig, bounded, native_child_env, start  # noqa: F401 (fixtures)
from tests.unit.test_forwarding_roundtrip import fatbin, minimal_elf

REPO = Path(__file__).resolve().parents[2]
SUCCESS = 0
LOAD = CALLS["cuModuleLoadData"].opcode
LOAD_EX = CALLS["cuModuleLoadDataEx"].opcode
LIBRARY = CALLS["cuLibraryLoadData"].opcode
LOADS = {LOAD, LOAD_EX, LIBRARY}
DIGEST_REQUEST = 8 + 4 + 32  # size, the digest's length and the digest: IMAGE_BY_DIGEST_REQUEST without options
MIB = 1 << 20


def big_image(kernel: bytes = b"bigk", size: int = MIB, seed: int = 0) -> bytes:
    """A fatbin of about `size` bytes whose ELF has one kernel, `kernel`: the padding after the ELF lies inside the
    fatbin's declared size, so the whole of it travels and reaches the driver."""
    pad = hashlib.shake_256(kernel + seed.to_bytes(4, "little")).digest(size)
    return fatbin(minimal_elf(kernel) + pad)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def received(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[], list[tuple[int, int]]]:
    """The (opcode, payload length) of every request the agent's workers handle, in order; set up before the rig
    starts, whose agent (and its session workers) fork from this process and inherit the wrapper."""
    path = tmp_path / "received"
    original = CudaExecutor.handle

    def counting(self: CudaExecutor, record: Record) -> Any:
        with open(path, "a", encoding="ascii") as f:
            f.write(f"{record.opcode} {len(record.payload)} {os.getpid()}\n")
        return original(self, record)
    monkeypatch.setattr(CudaExecutor, "handle", counting)

    def read() -> list[tuple[int, int]]:
        return [(op, n) for op, n, _pid in workers(path) if op & ~IMAGE_BY_DIGEST in LOADS]
    return read


def workers(path: Path) -> list[tuple[int, int, int]]:
    """(opcode, payload length, the worker's pid) of each request handled."""
    if not path.exists():
        return []
    return [(int(op), int(n), int(pid)) for op, n, pid in (line.split() for line in path.read_text().splitlines())]


def cached_rig(start: Callable[..., Rig], directory: Path, limit: int = 64 * MIB) -> Rig:  # noqa: F811
    return start(ExecutorOptions(devices=GUEST_DEVICES, image_cache=CacheSettings(str(directory), limit)))


def loaded_images(rig: Rig, name: str = "cuModuleLoadData") -> list[tuple[int, str]]:
    return [(e["image"]["len"], e["image"]["sha256"]) for e in rig.entries(name=name) if "image" in e]


# --- the capsule path ----------------------------------------------------------------------------------------------

def test_second_load_and_another_session_send_only_the_digest(start: Callable[..., Rig], tmp_path: Path,  # noqa: F811
                                                              received: Callable[[], list[tuple[int, int]]]) -> None:
    cache = tmp_path / "images"
    rig = cached_rig(start, cache)
    image = big_image()
    g = rig.guest()
    g.setup()
    status, first = g.load_module(image)
    assert status == SUCCESS
    # Asked by digest (not held yet), then sent whole; the agent filed it under the digest it computed.
    assert received() == [(LOAD + IMAGE_BY_DIGEST, DIGEST_REQUEST), (LOAD, len(image))]
    assert os.listdir(cache) == [sha(image)]
    assert (cache / sha(image)).stat().st_mode & 0o777 == 0o600

    status, second = g.load_module(image)
    assert status == SUCCESS and second not in (first, SENTINELS["Q"])
    assert received()[2:] == [(LOAD + IMAGE_BY_DIGEST, DIGEST_REQUEST)]  # 44 bytes instead of a MiB
    # The module loaded from the cache is the image itself and works: its kernel resolves and launches.
    assert loaded_images(rig) == [(len(image), sha(image))] * 2
    status, (function,) = g.by_name("cuModuleGetFunction", second, b"bigk")
    assert status == SUCCESS
    assert g.fn["cuLaunchKernel"](function, 1, 1, 1, 32, 1, 1, 0, 0, None, None) == SUCCESS
    assert g.sync() == SUCCESS
    assert rig.entries(name="cuLaunchKernel")[-1]["launch"]["kernel"] == "bigk"

    other = rig.guest()  # another guest process: its own session, in its own worker process
    other.setup()
    status, third = other.load_module(image)
    assert status == SUCCESS
    assert received()[3:] == [(LOAD + IMAGE_BY_DIGEST, DIGEST_REQUEST)]
    pids = [pid for op, _n, pid in workers(tmp_path / "received") if op & ~IMAGE_BY_DIGEST == LOAD]
    assert pids[0] == pids[2] != pids[3]  # the cache is shared by worker processes, not kept in one
    assert other.by_name("cuModuleGetFunction", third, b"bigk")[0] == SUCCESS


def test_a_digest_of_bytes_never_sent_is_refused(start: Callable[..., Rig], tmp_path: Path,  # noqa: F811
                                                 received: Callable[[], list[tuple[int, int]]]) -> None:
    """A guest can only name what the agent hashed itself: any other digest, a wrong size or a malformed request
    loads nothing, and the agent goes on."""
    rig = cached_rig(start, tmp_path / "images")
    g = rig.guest()
    g.setup()
    image, never_sent = big_image(), big_image(seed=1)
    assert g.load_module(image)[0] == SUCCESS
    mark = rig.mark()

    def by_digest(opcode: int, size: int, digest: bytes, head: bytes = b"") -> Any:
        return g.channel.call(opcode + IMAGE_BY_DIGEST, IMAGE_BY_DIGEST_REQUEST.encode(size, digest, head))

    held = hashlib.sha256(image).digest()
    assert by_digest(LOAD, len(never_sent), hashlib.sha256(never_sent).digest()).status == IMAGE_NOT_CACHED
    assert by_digest(LOAD, len(image) - 1, held).status == IMAGE_NOT_CACHED  # the right digest, not its size
    assert by_digest(LOAD, 1 << 63, held).status == IMAGE_NOT_CACHED
    assert by_digest(LOAD, len(image), held[:16]).status == IMAGE_NOT_CACHED  # not a SHA-256
    assert by_digest(LOAD, len(image), b"../../etc/passwd".ljust(32, b"/")).status == IMAGE_NOT_CACHED
    assert by_digest(LOAD_EX, len(image), held, b"\xff\xff").status == Status.MALFORMED  # options cut short
    assert g.channel.call(LOAD + IMAGE_BY_DIGEST, b"\x01\x02\x03").status == Status.MALFORMED
    alloc = CALLS["cuMemAlloc_v2"].opcode if "cuMemAlloc_v2" in CALLS else CALLS["cuMemAlloc"].opcode
    assert g.channel.call(alloc + IMAGE_BY_DIGEST, IMAGE_BY_DIGEST_REQUEST.encode(len(image), held, b"")).status \
        == Status.UNKNOWN_OPCODE
    assert rig.entries(mark, "cuModuleLoadData") == [] and rig.entries(mark, "cuModuleLoadDataEx") == []
    # The agent is unharmed and still holds the image.
    assert os.listdir(tmp_path / "images") == [sha(image)]
    reply = by_digest(LOAD, len(image), held)
    assert reply.status == SUCCESS
    assert g.by_name("cuModuleGetFunction", CALLS["cuModuleLoadData"].reply.decode(reply.payload)[0],
                     b"bigk")[0] == SUCCESS


@pytest.mark.parametrize("damage", ["flipped", "truncated"])
def test_a_corrupted_cache_file_is_not_loaded(start: Callable[..., Rig], tmp_path: Path, damage: str,  # noqa: F811
                                              received: Callable[[], list[tuple[int, int]]]) -> None:
    cache = tmp_path / "images"
    rig = cached_rig(start, cache)
    g = rig.guest()
    g.setup()
    image = big_image()
    assert g.load_module(image)[0] == SUCCESS
    path = cache / sha(image)
    raw = bytearray(path.read_bytes())
    if damage == "flipped":
        raw[len(raw) // 2] ^= 1
    else:
        del raw[len(raw) // 2:]
    path.write_bytes(bytes(raw))
    before = len(received())
    status, module = g.load_module(image)
    assert status == SUCCESS
    # Not served from the damaged file: the guest was told so and sent the image whole again...
    assert received()[before:] == [(LOAD + IMAGE_BY_DIGEST, DIGEST_REQUEST), (LOAD, len(image))]
    # ...so the driver got the true image both times, and the file holds it again.
    assert loaded_images(rig) == [(len(image), sha(image))] * 2
    assert path.read_bytes() == image
    assert g.by_name("cuModuleGetFunction", module, b"bigk")[0] == SUCCESS


def test_eviction_keeps_the_bound(start: Callable[..., Rig], tmp_path: Path,  # noqa: F811
                                  received: Callable[[], list[tuple[int, int]]]) -> None:
    cache = tmp_path / "images"
    images = [big_image(size=256 * 1024, seed=n) for n in range(3)]
    rig = cached_rig(start, cache, limit=2 * len(images[0]) + 1024)  # room for two
    g = rig.guest()
    g.setup()
    for image in images:
        assert g.load_module(image)[0] == SUCCESS
    assert sorted(os.listdir(cache)) == sorted(sha(i) for i in images[1:])  # the least recently used went
    assert sum(p.stat().st_size for p in cache.iterdir()) <= 2 * len(images[0]) + 1024
    before = len(received())
    assert g.load_module(images[2])[0] == SUCCESS  # still held: by digest only
    assert g.load_module(images[0])[0] == SUCCESS  # evicted: whole again
    assert received()[before:] == [(LOAD + IMAGE_BY_DIGEST, DIGEST_REQUEST), (LOAD + IMAGE_BY_DIGEST, DIGEST_REQUEST),
                                   (LOAD, len(images[0]))]


def test_small_images_always_travel_whole(start: Callable[..., Rig], tmp_path: Path,  # noqa: F811
                                          received: Callable[[], list[tuple[int, int]]]) -> None:
    rig = cached_rig(start, tmp_path / "images")
    g = rig.guest()
    g.setup()
    image = fatbin(minimal_elf(b"small"))
    assert len(image) < IMAGE_BY_DIGEST_MIN
    for _ in range(2):
        assert g.load_module(image)[0] == SUCCESS
    assert received() == [(LOAD, len(image))] * 2
    assert os.listdir(tmp_path / "images") == []


def test_jit_options_and_libraries_by_digest(start: Callable[..., Rig], tmp_path: Path,  # noqa: F811
                                             received: Callable[[], list[tuple[int, int]]]) -> None:
    """cuModuleLoadDataEx's options travel after the digest and reach the driver as they would with the image;
    one image is one file, whichever call sent it (a library load of it then goes by digest at once)."""
    rig = cached_rig(start, tmp_path / "images")
    g = rig.guest()
    g.setup()
    image = big_image(b"jitk")
    holder = ctypes.create_string_buffer(image, len(image))
    options = (ctypes.c_int * 1)(0)  # CU_JIT_MAX_REGISTERS
    values = (ctypes.c_void_p * 1)(32)
    for _ in range(2):
        cell = ctypes.c_uint64(0)
        assert g.fn["cuModuleLoadDataEx"](ctypes.addressof(cell), ctypes.addressof(holder), 1,
                                          ctypes.addressof(options), ctypes.addressof(values)) == SUCCESS
        assert g.by_name("cuModuleGetFunction", cell.value, b"jitk")[0] == SUCCESS
    options_bytes = 4 + 12  # one (option, value) pair
    assert received() == [(LOAD_EX + IMAGE_BY_DIGEST, DIGEST_REQUEST + options_bytes),
                          (LOAD_EX, options_bytes + len(image)),
                          (LOAD_EX + IMAGE_BY_DIGEST, DIGEST_REQUEST + options_bytes)]
    seen = rig.entries(name="cuModuleLoadDataEx")
    assert [e["jit_options"] for e in seen][0] == [e["jit_options"] for e in seen][1]
    assert loaded_images(rig, "cuModuleLoadDataEx") == [(len(image), sha(image))] * 2

    library = ctypes.c_uint64(0)
    assert g.fn["cuLibraryLoadData"](ctypes.addressof(library), ctypes.addressof(holder), None, None, 0, None,
                                     None, 0) == SUCCESS
    assert received()[3:] == [(LIBRARY + IMAGE_BY_DIGEST, DIGEST_REQUEST + 4)]  # no JIT options: a zero count
    assert loaded_images(rig, "cuLibraryLoadData") == [(len(image), sha(image))]
    assert g.by_name("cuLibraryGetKernel", library.value, b"jitk")[0] == SUCCESS


def test_without_a_cache_the_guest_stops_asking(start: Callable[..., Rig],  # noqa: F811
                                                received: Callable[[], list[tuple[int, int]]]) -> None:
    """An agent that keeps nothing (no cache configured) answers every digest "not cached": the guest notices when
    images it saw the agent load are not held, and after two such answers sends images whole without asking."""
    rig = start(ExecutorOptions(devices=GUEST_DEVICES))
    g = rig.guest()
    g.setup()
    image = big_image()
    for _ in range(4):
        assert g.load_module(image)[0] == SUCCESS
    asked, whole = (LOAD + IMAGE_BY_DIGEST, DIGEST_REQUEST), (LOAD, len(image))
    assert received() == [asked, whole, asked, whole, asked, whole, whole]
    assert loaded_images(rig) == [(len(image), sha(image))] * 4


# --- the native guest driver -------------------------------------------------------------------------------------

NATIVE = r"""
import ctypes, json, sys
from ctypes import byref, c_void_p, c_uint
lib = ctypes.CDLL(sys.argv[1])
image = open(sys.argv[2], "rb").read()
lib.cuModuleLoadData.argtypes = [c_void_p, c_void_p]
lib.cuModuleGetFunction.argtypes = [c_void_p, c_void_p, ctypes.c_char_p]
U = c_uint
lib.cuLaunchKernel.argtypes = [c_void_p, U, U, U, U, U, U, U, c_void_p, c_void_p, c_void_p]
assert lib.cuInit(0) == 0
context = c_void_p()
assert lib.cuDevicePrimaryCtxRetain(byref(context), 0) == 0
assert lib.cuCtxSetCurrent(context) == 0
holder = ctypes.create_string_buffer(image, len(image))
out = []
for _ in range(int(sys.argv[3])):
    module, function = c_void_p(), c_void_p()
    status = lib.cuModuleLoadData(byref(module), holder)
    found = lib.cuModuleGetFunction(byref(function), module, b"bigk") if status == 0 else -1
    launched = lib.cuLaunchKernel(function, 1, 1, 1, 32, 1, 1, 0, None, None, None) if found == 0 else -1
    out.append([status, found, launched, lib.cuCtxSynchronize()])
print("RESULT " + json.dumps(out))
"""


def native_loads(library: Path, rig: Rig, image: Path, times: int) -> list[list[int]]:  # noqa: F811
    env = native_child_env(library, rig.path)
    done = subprocess.run([sys.executable, "-c", NATIVE, str(library), str(image), str(times)], env=env,
                          capture_output=True, text=True, timeout=50, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])  # type: ignore[no-any-return]


def test_native_second_load_and_another_process_send_only_the_digest(
        library: Path, start: Callable[..., Rig], tmp_path: Path,  # noqa: F811
        received: Callable[[], list[tuple[int, int]]]) -> None:
    cache = tmp_path / "images"
    rig = cached_rig(start, cache)
    image = big_image(size=3 * MIB)
    path = tmp_path / "image.fatbin"
    path.write_bytes(image)
    assert native_loads(library, rig, path, 2) == [[SUCCESS] * 4] * 2  # loaded, resolved, launched, synchronised
    asked, whole = (LOAD + IMAGE_BY_DIGEST, DIGEST_REQUEST), (LOAD, len(image))
    assert received() == [asked, whole, asked]
    assert os.listdir(cache) == [sha(image)]  # the digest the C SHA-256 named is the agent's
    assert native_loads(library, rig, path, 1) == [[SUCCESS] * 4]  # another guest process
    assert received()[3:] == [asked]
    assert loaded_images(rig) == [(len(image), sha(image))] * 3
    assert [e["launch"]["kernel"] for e in rig.entries(name="cuLaunchKernel")] == ["bigk"] * 3


def test_native_loads_without_a_cache(library: Path, start: Callable[..., Rig], tmp_path: Path,  # noqa: F811
                                      received: Callable[[], list[tuple[int, int]]]) -> None:
    """The native driver's note: images go whole, unasked, once the agent showed twice that it keeps nothing."""
    rig = start(ExecutorOptions(devices=GUEST_DEVICES))
    image = big_image()
    path = tmp_path / "image.fatbin"
    path.write_bytes(image)
    assert native_loads(library, rig, path, 4) == [[SUCCESS] * 4] * 4
    asked, whole = (LOAD + IMAGE_BY_DIGEST, DIGEST_REQUEST), (LOAD, len(image))
    assert received() == [asked, whole, asked, whole, asked, whole, whole]

