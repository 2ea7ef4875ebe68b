"""The native guest driver's JIT linker (guest_runtime/native/link_calls.c) against a real agent with the fake driver
(tests/forwarding_rig.py; the fake's cubin is tests/fake_driver.fake_cubin of the inputs, so its bytes are known):
inputs from memory and from a file, the guest's log options, a cubin larger than the first buffer, cuda.h's _v2
names, and the errors the fake and the host's ledger give. CPU only."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.fake_driver import fake_cubin
from tests.forwarding_rig import Rig, native_child_env, rig, start  # noqa: F401 (fixtures)

REPO = Path(__file__).resolve().parents[2]
SUCCESS, INVALID_VALUE, INVALID_HANDLE, FILE_NOT_FOUND, NOT_SUPPORTED = 0, 1, 400, 301, 801
PTX, CUBIN = 1, 0
PTX_TEXT = b".version 8.0\n.target sm_90\n.address_size 64\n"

PRELUDE = r"""
import ctypes, json, os, sys
from ctypes import byref, c_int, c_size_t, c_uint, c_void_p, c_char_p
lib = ctypes.CDLL(sys.argv[1])
out = {}
for name in ("cuLinkCreate", "cuLinkCreate_v2"):
    getattr(lib, name).argtypes = [c_uint, c_void_p, c_void_p, c_void_p]
for name in ("cuLinkAddData", "cuLinkAddData_v2"):
    getattr(lib, name).argtypes = [c_void_p, c_int, c_void_p, c_size_t, c_char_p, c_uint, c_void_p, c_void_p]
for name in ("cuLinkAddFile", "cuLinkAddFile_v2"):
    getattr(lib, name).argtypes = [c_void_p, c_int, c_char_p, c_uint, c_void_p, c_void_p]
lib.cuLinkComplete.argtypes = [c_void_p, c_void_p, c_void_p]
lib.cuLinkDestroy.argtypes = [c_void_p]
assert lib.cuInit(0) == 0
context = c_void_p()
assert lib.cuDevicePrimaryCtxRetain(byref(context), 0) == 0
assert lib.cuCtxSetCurrent(context) == 0

def create(pairs=(), name="cuLinkCreate"):
    options = (c_int * max(len(pairs), 1))(*[o for o, _ in pairs])
    values = (c_void_p * max(len(pairs), 1))(*[v for _, v in pairs])
    state = c_void_p()
    status = getattr(lib, name)(len(pairs), options if pairs else None, values if pairs else None, byref(state))
    return status, state.value, values

def add(state, kind, data, name=None, fn="cuLinkAddData"):
    buffer = ctypes.create_string_buffer(data, len(data))
    return getattr(lib, fn)(state, kind, buffer, len(data), name, 0, None, None)

def complete(state):
    cubin, size = c_void_p(), c_size_t()
    status = lib.cuLinkComplete(state, byref(cubin), byref(size))
    return status, (ctypes.string_at(cubin.value, size.value).hex() if status == 0 else ""), size.value
"""
EPILOGUE = r"""
print("RESULT " + json.dumps(out))
"""


def run(library: Path, rig: Rig, body: str, *args: str) -> dict[str, Any]:  # noqa: F811
    env = native_child_env(library, rig.path)
    done = subprocess.run([sys.executable, "-c", PRELUDE + body + EPILOGUE, str(library), *args], env=env,
                          capture_output=True, text=True, timeout=50, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def test_inputs_from_memory_and_a_file_link_into_the_cubin_the_program_reads(library: Path, rig: Rig,  # noqa: F811
                                                                            tmp_path: Path) -> None:
    """Scalar options reach the driver; the guest's log buffer holds an empty log and its size and the wall time
    read 0; a PTX file arrives with a NUL after it, named by its path; the cubin the program reads is the driver's,
    byte for byte, and stays readable until cuLinkDestroy."""
    path = tmp_path / "extra.ptx"
    path.write_bytes(PTX_TEXT)
    body = r"""
log = ctypes.create_string_buffer(b"x" * 64)
status, state, values = create([(7, 3), (3, ctypes.addressof(log)), (4, 64), (2, 12345)], "cuLinkCreate_v2")
out["create"] = status
out["log"] = [log.raw[0], values[2] or 0, values[3] or 0]
ptx = bytes.fromhex(sys.argv[3]) + b"\0"
out["adds"] = [add(state, 1, ptx, b"a.ptx"), add(state, 0, b"\x7fELF-ish", None, "cuLinkAddData_v2"),
               lib.cuLinkAddFile_v2(state, 1, sys.argv[2].encode(), 0, None, None)]
out["complete"] = complete(state)
out["again"] = complete(state)[0]
out["destroy"] = [lib.cuLinkDestroy(state), lib.cuLinkDestroy(state)]
"""
    out = run(library, rig, body, str(path), PTX_TEXT.hex())
    expected = fake_cubin([(PTX, b"a.ptx", PTX_TEXT + b"\0"), (CUBIN, b"", b"\x7fELF-ish"),
                           (PTX, str(path).encode(), PTX_TEXT + b"\0")])
    assert out["create"] == SUCCESS and out["log"] == [0, 0, 0]
    assert rig.entries(name="cuLinkCreate")[-1]["jit_options"] == [["CU_JIT_OPTIMIZATION_LEVEL", 3]]
    assert out["adds"] == [SUCCESS] * 3
    assert out["complete"] == [SUCCESS, expected.hex(), len(expected)]
    assert out["again"] == INVALID_VALUE  # the fake's answer to a second cuLinkComplete
    assert out["destroy"] == [SUCCESS, INVALID_HANDLE]  # the second refused by the host's ledger
    assert len(rig.entries(name="cuLinkDestroy")) == 1


def test_a_cubin_larger_than_the_first_buffer_arrives_whole(library: Path, rig: Rig) -> None:  # noqa: F811
    body = r"""
status, state, _ = create()
data = bytes(range(256)) * (3 * 4096)
out["add"] = add(state, 0, data, b"big")
status, cubin, size = complete(state)
out["complete"] = [status, size]
out["sha"] = __import__("hashlib").sha256(bytes.fromhex(cubin)).hexdigest()
out["destroy"] = lib.cuLinkDestroy(state)
"""
    out = run(library, rig, body)
    expected = fake_cubin([(CUBIN, b"big", bytes(range(256)) * (3 * 4096))])
    assert out["add"] == SUCCESS and out["complete"] == [SUCCESS, len(expected)] and out["destroy"] == SUCCESS
    assert out["sha"] == __import__("hashlib").sha256(expected).hexdigest()
    assert len(rig.entries(name="cuLinkComplete")) == 1  # asked twice, linked once


def test_what_the_linker_refuses(library: Path, rig: Rig, tmp_path: Path) -> None:  # noqa: F811
    body = r"""
out["option"] = create([(1, 128)])[0]  # CU_JIT_THREADS_PER_BLOCK: not carried
out["null_state"] = lib.cuLinkCreate(0, None, None, None)
status, state, _ = create()
out["no_file"] = lib.cuLinkAddFile(state, 1, sys.argv[2].encode(), 0, None, None)
out["unknown"] = [add(0xDEAD00, 0, b"x"), complete(0xDEAD00)[0]]
out["empty"] = complete(state)[0]
out["null_out"] = lib.cuLinkComplete(state, None, None)
out["destroy"] = lib.cuLinkDestroy(state)
"""
    out = run(library, rig, body, str(tmp_path / "missing.ptx"))
    assert out == {"option": NOT_SUPPORTED, "null_state": INVALID_VALUE, "no_file": FILE_NOT_FOUND,
                   "unknown": [INVALID_HANDLE, INVALID_HANDLE], "empty": INVALID_VALUE,
                   "null_out": INVALID_VALUE, "destroy": SUCCESS}
