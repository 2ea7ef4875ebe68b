"""The native guest driver's export tables (guest_runtime/native/export_tables.c) and the CUDA runtime's integrity
check (integrity.c): what the CUDA runtime inside PyTorch, CuPy and JAX asks the driver for before it will start.

The digest is checked two ways that do not share code with the library: MD2 against RFC 1319's test vectors, and
the HMAC construction and the message layout against Python's own `hmac` module over a message packed here from
the layout docs/native-driver.md gives. That the real CUDA runtime accepts the answer is tested on the GPU machine
(tests/gpu/test_native_frameworks.py) and was first seen on this machine with PyTorch 2.11's runtime.
"""
from __future__ import annotations

import ctypes
import hmac
import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from tests.forwarding_rig import GUEST_DEVICES, Rig, native_child_env, rig, start  # noqa: F401 (fixtures)

REPO = Path(__file__).resolve().parents[2]
KEY = bytes.fromhex("146addae53a9a752aa0841360bf55a9f")
CUDART_INTERFACE = bytes.fromhex("6bd5fb6c5bf4e74a8987d93912fd9df9")
INTEGRITY_CHECK = bytes.fromhex("d4082055bde6704b8d34ba123c66e1f2")
CONTEXT_LOCAL_STORAGE = bytes.fromhex("c693336e1121df11a8c368f355d89593")
TOOLS_TLS = bytes.fromhex("42d85a8123f6cb478298f6e78a3aecdc")
CONTEXT_IDENTITY = bytes.fromhex("21318c60971432488ca641ff7324c8f2")
KNOWN = {  # UUID: entries, as the table's first word gives them (CONTEXT_LOCAL_STORAGE's is a function)
    CUDART_INTERFACE: 10, TOOLS_TLS: 3, CONTEXT_IDENTITY: 93,
    bytes.fromhex("a094798c2e742e7493f20800200c0a66"): 7, bytes.fromhex("0ca50b8c1004929a89a7d0df10e77286"): 2,
    bytes.fromhex("195bcbf4d67d024aacc51d29cea631ae"): 3, bytes.fromhex("b10541e1f7c7c74a9f64f223be99f1e2"): 26,
    INTEGRITY_CHECK: 3, bytes.fromhex("263e88607cd2614392f6bbd5006dfa7e"): 4,
}


def _md2(lib: ctypes.CDLL, data: bytes) -> bytes:
    out = ctypes.create_string_buffer(16)
    lib.orion_md2(data, ctypes.c_size_t(len(data)), out)
    return out.raw


@pytest.mark.parametrize(("message", "digest"), [  # RFC 1319, appendix A.5
    (b"", "8350e5a3e24c153df2275c9f80692773"), (b"a", "32ec01ec4a6dac72c0ab96fb34c0b5d1"),
    (b"abc", "da853b0d3f88d99b30283a69e6ded6bb"), (b"message digest", "ab4f496bfb2a530b219ff33031fe06b0"),
    (b"abcdefghijklmnopqrstuvwxyz", "4e8ddff3650292ab5a4108c3aa47940b"),
    (b"12345678901234567890123456789012345678901234567890123456789012345678901234567890",
     "d5976f79d83d3a0dc9806c3c66f3efd8"),
])
def test_md2_gives_the_rfc_test_vectors(library: Path, message: bytes, digest: str) -> None:
    assert _md2(ctypes.CDLL(str(library)), message).hex() == digest


class _Md2:
    """A hashlib-shaped MD2 over the library's one-shot function, so that `hmac` builds the HMAC itself."""
    digest_size = block_size = 16

    def __init__(self, lib: ctypes.CDLL, data: bytes = b"") -> None:
        self.lib, self.data = lib, data

    def update(self, data: bytes) -> None:
        self.data += data

    def copy(self) -> _Md2:
        return _Md2(self.lib, self.data)

    def digest(self) -> bytes:
        return _md2(self.lib, self.data)


class Input(ctypes.Structure):
    _fields_ = [("driver_version", ctypes.c_uint32), ("version", ctypes.c_uint32), ("process", ctypes.c_uint32),
                ("thread", ctypes.c_uint32), ("cudart_table", ctypes.c_void_p), ("integrity_table", ctypes.c_void_p),
                ("integrity_function", ctypes.c_void_p), ("unix_seconds", ctypes.c_uint64)]


class Device(ctypes.Structure):
    _fields_ = [("uuid", ctypes.c_uint8 * 16), ("pci_domain", ctypes.c_int32), ("pci_bus", ctypes.c_int32),
                ("pci_device", ctypes.c_int32)]


def _expected(lib: ctypes.CDLL, fields: tuple[int, ...], devices: list[tuple[bytes, int, int, int]]) -> bytes:
    message = struct.pack("<4I3QQ", *fields) + b"".join(struct.pack("<16s3i", *d) for d in devices)
    return hmac.new(KEY, message, lambda *data: _Md2(lib, *data)).digest()


def test_the_integrity_digest_is_hmac_md2_of_the_documented_message(library: Path) -> None:
    lib = ctypes.CDLL(str(library))
    devices = [(bytes(range(16)), 0, 0x18, 0), (bytes(range(100, 116)), 1, 0xC1, 3)]
    array = (Device * 2)(*(Device((ctypes.c_uint8 * 16)(*u), d, b, v) for u, d, b, v in devices))
    for version, seconds in ((13002, 1_764_000_000), (12089, 1), (13005, 0xFFFF_FFFF_FFFF)):
        fields = (13000, version, 4242, 0xF79C1000, 0x7FFFF6958240, 0x7FFFF6958220, 0x7FFFF2AAF4A0, seconds)
        out = ctypes.create_string_buffer(16)
        lib.orion_integrity_digest(ctypes.byref(Input(*fields)), array, ctypes.c_uint32(2), out)
        assert out.raw == _expected(lib, fields, devices)
        one = ctypes.create_string_buffer(16)  # the devices count: one device is another digest
        lib.orion_integrity_digest(ctypes.byref(Input(*fields)), array, ctypes.c_uint32(1), one)
        assert one.raw == _expected(lib, fields, devices[:1]) != out.raw


def test_runtime_versions_ending_in_0_or_1_get_the_drivers_fixed_answers(library: Path) -> None:
    lib = ctypes.CDLL(str(library))
    fixed = {0: (0x3341181C03CB675C, 0x8ED383AA1F4CD1E8), 1: (0x1841181C03CB675C, 0x8ED383AA1F4CD1E8)}
    for version in (13000, 13001, 12090, 12091):
        out = ctypes.create_string_buffer(16)
        lib.orion_integrity_digest(ctypes.byref(Input(13000, version, 1, 2, 3, 4, 5, 6)), None, 0, out)
        assert struct.unpack("<2Q", out.raw) == fixed[version % 10]


# A process with the library as its libcuda, talking to the fake-driver agent: the tables as cudart uses them.
CHILD = r"""
import ctypes, json, os, struct, sys
lib = ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_GLOBAL)
out = {}
def table(uuid):
    p = ctypes.c_void_p()
    rc = lib.cuGetExportTable(ctypes.byref(p), ctypes.create_string_buffer(bytes.fromhex(uuid), 16))
    return rc, p.value
out["init"] = lib.cuInit(0)
out["tables"] = {}
for uuid in json.loads(sys.argv[2]):
    rc, p = table(uuid)
    out["tables"][uuid] = [rc, ctypes.c_size_t.from_address(p).value if rc == 0 else None]
out["unknown"] = table("f8cff95121468b4eb9e2fb469e7c0dd9")
out["null"] = lib.cuGetExportTable(None, ctypes.create_string_buffer(16))

# the integrity entry, called as cudart calls it, against the inputs it must hash
_, integrity = table(sys.argv[3])
_, cudart = table(sys.argv[4])
entry = ctypes.c_void_p.from_address(integrity + 8).value
check = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_uint32, ctypes.c_uint64, ctypes.c_void_p)(entry)
result = ctypes.create_string_buffer(16)
out["check"] = [check(13002, 1764000000, result), result.raw.hex()]
driver, count = ctypes.c_int(), ctypes.c_int()
lib.cuDriverGetVersion(ctypes.byref(driver)); lib.cuDeviceGetCount(ctypes.byref(count))
devices = []
for d in range(count.value):
    uuid, value = ctypes.create_string_buffer(16), ctypes.c_int()
    lib.cuDeviceGetUuid(uuid, d)
    pci = []
    for attribute in (50, 33, 34):
        lib.cuDeviceGetAttribute(ctypes.byref(value), attribute, d); pci.append(value.value)
    devices.append([uuid.raw.hex(), *pci])
libc = ctypes.CDLL(None)
libc.pthread_self.restype = ctypes.c_ulong
out["inputs"] = [driver.value, 13002, os.getpid(), libc.pthread_self() & 0xFFFFFFFF, cudart, integrity, entry,
                 1764000000]
out["devices"] = devices

# context-local storage: put, get, get of another key, delete, get again
_, storage = table(sys.argv[5])
put, delete, get = (ctypes.c_void_p.from_address(storage + 8 * i).value for i in range(3))
put = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)(put)
delete = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)(delete)
get = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)(get)
ctx, value = ctypes.c_void_p(), ctypes.c_void_p()
lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0)
out["storage"] = [put(ctx, 0x1234, 0xABCD, None), get(ctypes.byref(value), ctx, 0x1234), value.value,
                  get(ctypes.byref(value), ctx, 0x9999), delete(ctx, 0x1234), get(ctypes.byref(value), ctx, 0x1234),
                  get(None, ctx, 0x1234)]

# cuBLASLt's context lookup: TOOLS_TLS entry 2 (the current context), CONTEXT_IDENTITY entry 4 (its ID)
_, tools = table(sys.argv[6])
_, identity = table(sys.argv[7])
current = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)(ctypes.c_void_p.from_address(tools + 16).value)
context_id = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)(
    ctypes.c_void_p.from_address(identity + 32).value)
other = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.c_void_p.from_address(identity + 8).value)
seen, real, ident, real_id = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_ulonglong(), ctypes.c_ulonglong()
out["no_context"] = [current(ctypes.byref(seen)), seen.value]
lib.cuCtxSetCurrent(ctx)
out["tools_current"] = [current(ctypes.byref(seen)), lib.cuCtxGetCurrent(ctypes.byref(real)), seen.value == real.value,
                        seen.value == ctx.value]
out["identity"] = [context_id(seen, ctypes.byref(ident)), lib.cuCtxGetId(ctx, ctypes.byref(real_id)),
                   ident.value == real_id.value]
out["identity_other"] = [other(), other()]
print(json.dumps(out))
"""


def test_the_runtime_gets_its_tables_and_a_verifiable_integrity_answer(library: Path, rig: Rig) -> None:  # noqa: F811
    env = native_child_env(library, rig.path)
    args = [json.dumps([u.hex() for u in KNOWN]), INTEGRITY_CHECK.hex(), CUDART_INTERFACE.hex(),
            CONTEXT_LOCAL_STORAGE.hex(), TOOLS_TLS.hex(), CONTEXT_IDENTITY.hex()]
    done = subprocess.run([sys.executable, "-c", CHILD, str(library), *args], env=env, capture_output=True,
                          text=True, timeout=60, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout)
    assert out["init"] == 0
    assert out["tables"] == {u.hex(): [0, 8 * n] for u, n in KNOWN.items()}  # each table's size in bytes
    assert out["unknown"] == [1, None]  # CUDA_ERROR_INVALID_VALUE and no table, as the driver answers
    assert out["null"] == 1
    assert [bus for _uuid, _domain, bus, _device in out["devices"]] == [0x18 + d for d in GUEST_DEVICES]

    lib = ctypes.CDLL(str(library))
    devices = [(bytes.fromhex(u), dom, bus, dev) for u, dom, bus, dev in out["devices"]]
    assert out["check"] == [0, _expected(lib, tuple(out["inputs"]), devices).hex()]
    assert out["storage"] == [0, 0, 0xABCD, 400, 0, 400, 1]  # a missing key is CUDA_ERROR_INVALID_HANDLE
    assert out["no_context"] == [0, None]  # no context current on this thread yet, as cuCtxGetCurrent answers
    assert out["tools_current"] == [0, 0, True, True]
    assert out["identity"] == [0, 0, True]
    assert out["identity_other"] == [801, 801]  # an entry nothing was seen to call: 801, named once
    assert done.stderr.count("export table 21318c60, an entry other than 4") == 1


COMPOSED = r"""
import ctypes, json, sys
lib = ctypes.CDLL(sys.argv[1])
out = {"init": lib.cuInit(0)}
bus = ctypes.create_string_buffer(32)
out["bus_id"] = [lib.cuDeviceGetPCIBusId(bus, 32, 0), bus.value.decode()]
ctx, pointer = ctypes.c_void_p(), ctypes.c_uint64()
lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0); lib.cuCtxSetCurrent(ctx)
lib.cuMemAlloc(ctypes.byref(pointer), ctypes.c_size_t(4096))
kind, ordinal, start = ctypes.c_uint32(7), ctypes.c_int32(7), ctypes.c_uint64(7)
attributes = (ctypes.c_int * 3)(2, 9, 11)  # MEMORY_TYPE, DEVICE_ORDINAL, RANGE_START_ADDR
data = (ctypes.c_void_p * 3)(*(ctypes.addressof(v) for v in (kind, ordinal, start)))
rc = lib.cuPointerGetAttributes(3, attributes, data, ctypes.c_uint64(pointer.value + 100))
out["device"] = [rc, kind.value, ordinal.value, start.value == pointer.value]
host = ctypes.create_string_buffer(64)  # not CUDA memory: no error, every attribute zero
rc = lib.cuPointerGetAttributes(3, attributes, data, ctypes.c_uint64(ctypes.addressof(host)))
out["host"] = [rc, kind.value, ordinal.value, start.value]
out["bad_attribute"] = lib.cuPointerGetAttributes(1, (ctypes.c_int * 1)(5000), data, ctypes.c_uint64(0))
print(json.dumps(out))
"""


def test_calls_outside_the_table_composed_of_forwarded_ones(library: Path, rig: Rig) -> None:  # noqa: F811
    """cuDeviceGetPCIBusId (JAX) from the PCI attributes; cuPointerGetAttributes (CuPy) from cuPointerGetAttribute,
    with cuda.h's rule that a pointer CUDA does not know reads as zeros, not an error."""
    done = subprocess.run([sys.executable, "-c", COMPOSED, str(library)], env=native_child_env(library, rig.path),
                          capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout)
    assert out["bus_id"] == [0, f"0000:{0x18 + GUEST_DEVICES[0]:02x}:00.0"]
    assert out["device"] == [0, 2, 0, True]  # CU_MEMORYTYPE_DEVICE, guest device 0, the allocation's start
    assert out["host"] == [0, 0, 0, 0]
    assert out["bad_attribute"] == 1
