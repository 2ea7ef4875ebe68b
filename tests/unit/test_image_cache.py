"""The agent's module image cache (host_agent/session/image_cache.py), its server.conf keys, and the native guest's
SHA-256
(guest_runtime/native/sha256.c) against FIPS 180-2's test vectors. CPU only; no agent
(tests/wire/test_images_by_digest.py runs the cache behind a real agent)."""
from __future__ import annotations

import hashlib
import json
import logging
import multiprocessing
import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from guest_runtime.native.build import CFLAGS, SOURCE_DIR, find_compiler
from host_agent.daemon.config import DEFAULT_IMAGE_CACHE_DIR, DEFAULT_IMAGE_CACHE_MIB, ServerConfig
from host_agent.session.image_cache import STALE_TEMP_S, TEMP_PREFIX, CacheSettings, ImageCache
from ivshmem.driver_api import IMAGE_BY_DIGEST_MIN
from ivshmem.shared.ini import ConfigError

KIB = 1024


def image(seed: int, size: int = 100 * KIB) -> bytes:
    """Distinct bytes per seed (the cache neither knows nor cares that they are not a fatbin)."""
    return hashlib.shake_256(seed.to_bytes(4, "little")).digest(size)


def sha(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


@pytest.fixture
def cache_dir(tmp_path: Path) -> Path:
    return tmp_path / "images"


def make(directory: Path, limit: int = 16 << 20) -> ImageCache:
    return ImageCache(CacheSettings(str(directory), limit))


def files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


# --- storing and loading ------------------------------------------------------------------------------------------

def test_an_image_is_filed_under_the_digest_the_cache_computes(cache_dir: Path) -> None:
    cache = make(cache_dir)
    data = image(1)
    assert cache.store(memoryview(data)) == sha(data)
    assert stat.S_IMODE(cache_dir.stat().st_mode) == 0o700  # created private
    (name,) = files(cache_dir)
    assert name == sha(data).hex()
    assert stat.S_IMODE((cache_dir / name).stat().st_mode) == 0o600
    assert cache.load(sha(data), len(data)) == data
    # A second worker (another session's process) sees the same directory.
    assert make(cache_dir).load(sha(data), len(data)) == data


def test_a_digest_of_bytes_never_stored_or_a_hostile_request_is_not_cached(cache_dir: Path) -> None:
    cache = make(cache_dir)
    data = image(2)
    cache.store(data)
    assert cache.load(sha(image(3)), len(data)) is None  # never stored
    assert cache.load(sha(data), len(data) - 1) is None  # the right digest, the wrong size
    assert cache.load(sha(data), 1 << 62) is None
    assert cache.load(sha(data), 0) is None
    assert cache.load(sha(data)[:31], len(data)) is None  # not a SHA-256
    assert cache.load(b"../" * 11 + b"xx", len(data)) is None  # 35 bytes: never a path
    assert cache.load(b"", len(data)) is None
    assert files(cache_dir) == [sha(data).hex()]


def test_small_images_and_images_past_the_bound_are_not_kept(cache_dir: Path) -> None:
    cache = make(cache_dir, limit=200 * KIB)
    small = image(4, IMAGE_BY_DIGEST_MIN - 1)
    assert cache.store(small) is None
    assert cache.store(image(5, 201 * KIB)) is None
    assert files(cache_dir) == []
    assert cache.store(image(6, IMAGE_BY_DIGEST_MIN)) is not None


@pytest.mark.parametrize("damage", ["flipped", "truncated", "extended"])
def test_a_corrupted_file_is_detected_removed_and_replaced(cache_dir: Path, damage: str,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    cache = make(cache_dir)
    data = image(7)
    cache.store(data)
    path = cache_dir / sha(data).hex()
    raw = bytearray(path.read_bytes())
    if damage == "flipped":
        raw[len(raw) // 2] ^= 0x40
    elif damage == "truncated":
        del raw[-100:]
    else:
        raw += b"\0"
    path.write_bytes(bytes(raw))
    with caplog.at_level(logging.WARNING, logger="host_agent.session.image_cache"):
        assert cache.load(sha(data), len(data)) is None
        # The right size but the wrong bytes is corruption: removed. Another size is a miss (a guest may name any
        # size); the guest's whole image, stored next, replaces the file either way.
        assert path.exists() == (damage != "flipped")
        assert cache.store(data) == sha(data)
        assert path.read_bytes() == data
        assert cache.load(sha(data), len(data)) == data
    assert sum("removed" in r.getMessage() for r in caplog.records) == (damage == "flipped")


def test_a_symlink_under_a_digest_is_not_followed(cache_dir: Path, tmp_path: Path) -> None:
    cache = make(cache_dir)
    data = image(8)
    (tmp_path / "elsewhere").write_bytes(data)
    (cache_dir / sha(data).hex()).symlink_to(tmp_path / "elsewhere")
    assert cache.load(sha(data), len(data)) is None


# --- the bound ----------------------------------------------------------------------------------------------------

def test_least_recently_used_images_go_beyond_the_bound(cache_dir: Path) -> None:
    size = 100 * KIB
    cache = make(cache_dir, limit=3 * size)
    a, b, c, d = (image(10 + i, size) for i in range(4))
    for n, data in enumerate((a, b, c)):
        cache.store(data)
        os.utime(cache_dir / sha(data).hex(), (1000 + n, 1000 + n))  # a clear order, whatever the clock's grain
    assert cache.load(sha(a), size) == a  # a hit: `a` is now the most recently used
    cache.store(d)
    assert set(files(cache_dir)) == {sha(x).hex() for x in (a, c, d)}  # `b`, the least recently used, went
    assert sum(p.stat().st_size for p in cache_dir.iterdir()) <= 3 * size
    cache.store(image(20, size))
    cache.store(image(21, size))
    assert sum(p.stat().st_size for p in cache_dir.iterdir()) <= 3 * size
    assert len(files(cache_dir)) == 3


def test_temporary_files_of_writers_that_died_are_cleared(cache_dir: Path) -> None:
    cache = make(cache_dir)
    stale, fresh = cache_dir / f"{TEMP_PREFIX}1-dead", cache_dir / f"{TEMP_PREFIX}2-live"
    stale.write_bytes(b"half an image")
    fresh.write_bytes(b"being written")
    old = time.time() - STALE_TEMP_S - 60
    os.utime(stale, (old, old))
    cache.store(image(30))
    assert not stale.exists() and fresh.exists()


# --- concurrency ----------------------------------------------------------------------------------------------------

def _store_repeatedly(directory: str, seed: int, rounds: int) -> None:
    cache = ImageCache(CacheSettings(directory, 16 << 20))
    data = image(seed, 512 * KIB)
    for _ in range(rounds):
        if cache.store(data) != sha(data):
            os._exit(3)
        got = cache.load(sha(data), len(data))
        if got is not None and got != data:  # a reader never sees a half-written image
            os._exit(4)
    os._exit(0)


def test_concurrent_workers_storing_the_same_image(cache_dir: Path) -> None:
    """Four worker processes store (and read back) the same image at once: one intact file, no temporaries left."""
    make(cache_dir)
    context = multiprocessing.get_context("fork")
    workers = [context.Process(target=_store_repeatedly, args=(str(cache_dir), 40, 20)) for _ in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(30)
    assert [w.exitcode for w in workers] == [0, 0, 0, 0]
    data = image(40, 512 * KIB)
    assert files(cache_dir) == [sha(data).hex()]
    assert (cache_dir / sha(data).hex()).read_bytes() == data


# --- an unusable directory --------------------------------------------------------------------------------------

def test_an_unusable_directory_means_no_cache_logged_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_bytes(b"")
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)  # others may write: they could plant files and race renames
    data = image(50)
    with caplog.at_level(logging.WARNING, logger="host_agent.session.image_cache"):
        for where in (not_a_dir / "images", shared):
            cache = make(where)
            assert not cache.usable
            for _ in range(3):
                assert cache.store(data) is None
                assert cache.load(sha(data), len(data)) is None
    assert len(caplog.records) == 2  # one line per directory, however often it is asked
    assert "0700" in caplog.records[1].getMessage()
    assert list(shared.iterdir()) == []
    assert not make(tmp_path / "off", limit=0).usable  # a zero bound turns it off
    assert not ImageCache(CacheSettings()).usable


def test_a_directory_that_vanishes_or_turns_read_only_falls_back(cache_dir: Path,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    cache = make(cache_dir)
    data = image(51)
    if os.geteuid() != 0:  # root writes through a read-only mode
        cache_dir.chmod(0o500)
        with caplog.at_level(logging.WARNING, logger="host_agent.session.image_cache"):
            assert cache.store(data) is None
            assert cache.store(data) is None
        assert len(caplog.records) == 1
        cache_dir.chmod(0o700)
    shutil.rmtree(cache_dir)
    assert cache.store(data) is None and cache.load(sha(data), len(data)) is None


# --- server.conf -----------------------------------------------------------------------------------------------------

def test_the_cache_keys_of_server_conf(tmp_path: Path) -> None:
    conf = tmp_path / "server.conf"
    conf.write_text("[server]\nvgpu_count = 2\n")
    default = ServerConfig.load(str(conf), environ={}).image_cache
    assert default == CacheSettings(DEFAULT_IMAGE_CACHE_DIR, DEFAULT_IMAGE_CACHE_MIB << 20)
    conf.write_text("[server-image-cache]\nimage_cache_dir = /srv/orion/images\nimage_cache_mib = 512\n")
    loaded = ServerConfig.load(str(conf), environ={})
    assert loaded.image_cache == CacheSettings("/srv/orion/images", 512 << 20)
    assert loaded.unknown_keys == ()
    conf.write_text("[server-image-cache]\nimage_cache_mib = 0\n")
    assert ServerConfig.load(str(conf), environ={}).image_cache.limit == 0
    for bad in ("image_cache_dir = images", "image_cache_mib = -1", "image_cache_mib = 2GB",
                "image_cache_mib = 99999999"):
        conf.write_text(f"[server-image-cache]\n{bad}\n")
        with pytest.raises(ConfigError, match=r"\[server-image-cache\] image_cache_"):
            ServerConfig.load(str(conf), environ={})


# --- the native guest's SHA-256 ---------------------------------------------------------------------------------

# FIPS 180-2, appendix B: one block, two blocks, a million 'a's; and the empty message.
FIPS_VECTORS = [
    (b"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"),
    (b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
     "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"),
    (b"a" * 1_000_000, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"),
    (b"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"),
]

CHECK = r"""
import ctypes, hashlib, json, os, sys
lib = ctypes.CDLL(sys.argv[1])
vectors = json.loads(sys.stdin.read())
out = ctypes.create_string_buffer(32)
got = []
for text in vectors:
    data = bytes.fromhex(text)
    lib.orion_sha256(data, len(data), out)
    got.append(out.raw.hex())
# Streamed in uneven pieces (partial blocks carried over), against hashlib for lengths around block edges.
ctx = ctypes.create_string_buffer(512)
for length in list(range(0, 130)) + [1000, 4096 + 55, 65536 + 63, 300000]:
    data = hashlib.shake_128(length.to_bytes(4, "little")).digest(length)
    lib.orion_sha256_init(ctx)
    at, step = 0, 1
    while at < length:
        lib.orion_sha256_update(ctx, data[at:at + step], len(data[at:at + step]))
        at, step = at + step, step * 3 % 97 + 1
    lib.orion_sha256_final(ctx, out)
    if out.raw != hashlib.sha256(data).digest():
        got.append(f"streamed length {length} differs")
print(json.dumps({"accelerated": lib.orion_sha256_accelerated(), "digests": got}))
"""


@pytest.fixture(scope="module")
def sha_library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    compiler = find_compiler()
    if compiler is None:
        pytest.skip("no C compiler (setup.sh installs gcc)")
    target = tmp_path_factory.mktemp("sha") / "sha256.so"
    subprocess.run([*compiler, *CFLAGS, "-Werror", "-o", str(target), str(SOURCE_DIR / "sha256.c")], check=True,
                   timeout=120)
    return target


@pytest.mark.parametrize("portable", ["1", "0"])
def test_the_native_sha256_gives_the_fips_digests(sha_library: Path, portable: str) -> None:
    """Both the portable rounds and (where the CPU has them) the SHA-NI rounds, each in its own process."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORION_")} | {"ORION_SHA256_PORTABLE": portable}
    done = subprocess.run([sys.executable, "-c", CHECK, str(sha_library)], env=env, capture_output=True, text=True,
                          input=json.dumps([text.hex() for text, _ in FIPS_VECTORS]), timeout=120, check=True)
    result = json.loads(done.stdout)
    assert result["digests"] == [digest for _, digest in FIPS_VECTORS]
    cpu_has_sha = "sha_ni" in Path("/proc/cpuinfo").read_text()
    assert result["accelerated"] == (portable == "0" and cpu_has_sha)


def test_the_python_and_c_image_limits_agree() -> None:
    """The native driver's copies of the table's constants (it has no generated header for them)."""
    source = (SOURCE_DIR / "module_calls.c").read_text()
    from ivshmem.driver_api import IMAGE_BY_DIGEST, IMAGE_NOT_CACHED
    assert f"IMAGE_BY_DIGEST = {IMAGE_BY_DIGEST:#x}" in source
    assert f"IMAGE_BY_DIGEST_MIN = {IMAGE_BY_DIGEST_MIN // KIB} * 1024" in source
    assert f"#define ORION_IMAGE_NOT_CACHED ({IMAGE_NOT_CACHED})" in (SOURCE_DIR / "cuda_client.h").read_text()
