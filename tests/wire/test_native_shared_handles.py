"""cuMem memory, and legacy IPC memory and events, shared between two processes of one guest (issue 32: NCCL's P2P
transport between ranks; PyTorch's multiprocessing shares CUDA tensors by legacy IPC), through the
native guest driver (guest_runtime/native/shareable_handles.c) and a real agent whose sessions run the executor
over the fake driver (host_agent/session/shared_handles.py; tests/forwarding_rig.py).

The exporting process creates memory exportable as a POSIX file descriptor, maps it and writes it, exports it and
passes the descriptor to the other process over a UNIX socket (SCM_RIGHTS), as NCCL does; the importing process
imports it, maps it, reads the exporter's bytes and writes its own, which the exporter then reads. The fake driver
keeps such memory in a memfd, so the two session workers really share it, as two processes share a GPU's memory.
What is not an export of a session of the same region gets CUDA_ERROR_INVALID_VALUE, another handle type
CUDA_ERROR_NOT_SUPPORTED. CPU only; the real driver's side runs on the GPU machine (tests/gpu/test_multi_gpu.py).
"""
from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests import forwarding_rig, relay_net
from tests.forwarding_rig import Rig, local_only, native_child_env
from tests.wire.test_native_mem_pools import PRELUDE, REPO

bounded, start, rig = forwarding_rig.bounded, forwarding_rig.start, forwarding_rig.rig  # the rig's fixtures
SUCCESS, INVALID_VALUE, NOT_SUPPORTED = 0, 1, 801
SIZE = 2 << 20

SHARING = r"""
import array, os, socket
for name, args in {"cuMemExportToShareableHandle": [P, c_uint64, c_int, c_uint64],
                   "cuMemImportFromShareableHandle": [U64, P, c_int]}.items():
    getattr(lib, name).argtypes = args
peer = socket.socket(fileno=int(sys.argv[3]))
SIZE = int(sys.argv[4])
def mapped(handle):
    base = reserve(SIZE)
    assert lib.cuMemMap(base, SIZE, 0, handle, 0) == 0
    assert lib.cuMemSetAccess(base, SIZE, (Access * 1)(access(0)), 1) == 0
    return base
def write(base, data):
    source = ctypes.create_string_buffer(data, len(data))
    return lib.cuMemcpyHtoD(base, source, len(data))
def export(handle, kind=1):
    fd = c_int(-1)
    return lib.cuMemExportToShareableHandle(byref(fd), handle, kind, 0), fd.value
def import_(fd, kind=1):
    handle = c_uint64()
    return lib.cuMemImportFromShareableHandle(byref(handle), c_void_p(fd), kind), handle.value
setup()
"""

EXPORTER = r"""
prop = Prop()
prop.type, prop.requestedHandleTypes, prop.location = 1, 1, loc(0)  # exportable as a POSIX file descriptor
handle = c_uint64()
assert lib.cuMemCreate(byref(handle), SIZE, byref(prop), 0) == 0
base = mapped(handle.value)
out["write"] = write(base, pattern(SIZE, 5))
out["export"], fd = export(handle.value)
out["fabric"] = export(handle.value, 8)[0]  # CU_MEM_HANDLE_TYPE_FABRIC
plain = create(SIZE)[1]  # not created exportable: the driver's own refusal
out["plain"] = export(plain)[0]
socket.send_fds(peer, [b"fd"], [fd])
os.close(fd)  # the program's descriptor: its own to close, as the driver's is
assert peer.recv(4) == b"done"
out["read_back"] = read(base, SIZE)[1] == pattern(SIZE, 9)  # what the importing process wrote
"""

IMPORTER = r"""
_, fds, _, _ = socket.recv_fds(peer, 2, 1)
out["import"], handle = import_(fds[0])
base = mapped(handle)
status, data = read(base, SIZE)
out["read"] = [status, data == pattern(SIZE, 5)]
out["write"] = write(base, pattern(SIZE, 9))
out["again"] = import_(fds[0])[0]  # a descriptor imports as often as the driver's does
out["fabric"] = import_(fds[0], 8)[0]
forged = os.memfd_create("forged")
os.write(forged, b"ORIONSH1" + bytes(range(20)))  # the right shape, a secret no worker holds
out["forged"] = import_(forged)[0]
pipe = os.pipe()
out["not_an_export"] = import_(pipe[0])[0]
peer.sendall(b"done")
"""


def _start(library: Path, rig: Rig, body: str, end: socket.socket, size: int = SIZE) -> subprocess.Popen[str]:
    script = PRELUDE + SHARING + body + '\nprint("RESULT " + json.dumps(out))\n'
    return subprocess.Popen([sys.executable, "-c", script, str(library), "", str(end.fileno()), str(size)],
                            env=native_child_env(library, rig.path), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=REPO, pass_fds=[end.fileno()])


def _result(child: subprocess.Popen[str]) -> dict[str, Any]:
    stdout, stderr = child.communicate(timeout=60)
    assert child.returncode == 0, stderr[-3000:]
    return json.loads(next(line for line in stdout.splitlines() if line.startswith("RESULT "))[len("RESULT "):])


@local_only("a relayed session's region is not the GPU host's to vouch for: export answers NOT_SUPPORTED there")
@pytest.mark.parametrize("size", [SIZE, 3 * SIZE])  # one granule, and several: every byte compared
def test_two_processes_of_a_guest_share_exported_memory(library: Path, rig: Rig, size: int) -> None:
    mark = rig.mark()
    ours, theirs = socket.socketpair()
    with ours, theirs:
        exporter, importer = _start(library, rig, EXPORTER, ours, size), _start(library, rig, IMPORTER, theirs, size)
        exported, imported = _result(exporter), _result(importer)
    assert exported == {"write": SUCCESS, "export": SUCCESS, "fabric": NOT_SUPPORTED, "plain": INVALID_VALUE,
                        "read_back": True}, exported
    assert imported == {"import": SUCCESS, "read": [SUCCESS, True], "write": SUCCESS, "again": SUCCESS,
                        "fabric": NOT_SUPPORTED, "forged": INVALID_VALUE, "not_an_export": INVALID_VALUE}, imported
    exports = rig.entries(since=mark, name="cuMemExportToShareableHandle")
    imports = rig.entries(since=mark, name="cuMemImportFromShareableHandle")
    assert len(exports) == 2 and len(imports) == 2  # the plain one reached the driver; forged and foreign did not


@local_only("a relayed session's region is not the GPU host's to vouch for: export answers NOT_SUPPORTED there")
def test_the_gpu_program_runs_through_the_native_driver_on_the_fake(library: Path, rig: Rig) -> None:
    """tests/gpu/programs/shared_memory_program.py, unmodified, as cuda-python runs it on the native driver (both of
    its processes): its results are the fake driver's (on a GPU they are compared with a native run instead)."""
    done = subprocess.run([sys.executable, str(REPO / "tests" / "gpu" / "programs" / "shared_memory_program.py")],
                          env=native_child_env(library, rig.path), capture_output=True, text=True, timeout=120,
                          cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))[len("RESULT "):])
    assert out == {"export": SUCCESS, "export_plain": INVALID_VALUE, "ipc_export": SUCCESS,
                   "importer": {"import": SUCCESS, "read": True, "ipc_open": SUCCESS, "ipc_read": True,
                                "ipc_close": SUCCESS},
                   "importer_exit": 0, "read_back": True, "ipc_read_back": True, "size": SIZE}, out


IPC_SHARING = r"""
class Handle(ctypes.Structure):  # CUipcMemHandle, CUipcEventHandle: 64 bytes, passed by value
    _fields_ = [("reserved", ctypes.c_char * 64)]
for name, args in {"cuIpcGetMemHandle": [P, c_uint64], "cuIpcOpenMemHandle": [U64, Handle, c_uint],
                   "cuIpcCloseMemHandle": [c_uint64], "cuIpcGetEventHandle": [P, P],
                   "cuIpcOpenEventHandle": [P, Handle], "cuEventCreate": [P, c_uint], "cuEventRecord": [P, P],
                   "cuEventSynchronize": [P]}.items():
    getattr(lib, name).argtypes = args
def event(flags):
    e = c_void_p()
    assert lib.cuEventCreate(byref(e), flags) == 0
    return e
"""

IPC_EXPORTER = r"""
status, pointer = alloc(SIZE)
assert status == 0 and write(pointer, pattern(SIZE, 5)) == 0
memory, shared_event = Handle(), event(0x6)  # CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING
out["export"] = lib.cuIpcGetMemHandle(byref(memory), pointer)
out["export_event"] = lib.cuIpcGetEventHandle(byref(Handle()), event(0))  # not interprocess: the driver's refusal
out["export_foreign"] = lib.cuIpcGetMemHandle(byref(Handle()), 0xDEAD0000)  # not the session's memory
ipc_event = Handle()
out["export_ipc_event"] = lib.cuIpcGetEventHandle(byref(ipc_event), shared_event)
assert lib.cuEventRecord(shared_event, None) == 0
peer.sendall(bytes(memory) + bytes(ipc_event))
assert peer.recv(4) == b"done"
out["read_back"] = read(pointer, SIZE)[1] == pattern(SIZE, 9)  # what the other process wrote
"""

IPC_OPENER = r"""
received = b""
while len(received) < 128:
    received += peer.recv(128 - len(received))
memory, ipc_event = Handle.from_buffer_copy(received[:64]), Handle.from_buffer_copy(received[64:])
pointer = c_uint64()
out["open"] = lib.cuIpcOpenMemHandle(byref(pointer), memory, 1)  # CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS
status, data = read(pointer.value, SIZE)
out["read"] = [status, data == pattern(SIZE, 5)]
out["write"] = write(pointer.value, pattern(SIZE, 9))
opened = c_void_p()
out["open_event"] = lib.cuIpcOpenEventHandle(byref(opened), ipc_event)
out["event_sync"] = lib.cuEventSynchronize(opened)
out["open_as_event"] = lib.cuIpcOpenEventHandle(byref(c_void_p()), memory)  # a memory handle is no event's
out["free"] = lib.cuMemFree(pointer.value)  # opened memory is closed, never freed
out["close"] = lib.cuIpcCloseMemHandle(pointer.value)
out["close_again"] = lib.cuIpcCloseMemHandle(pointer.value)
out["read_closed"] = read(pointer.value, 16)[0]
out["zeros"] = lib.cuIpcOpenMemHandle(byref(c_uint64()), Handle(), 0)
forged = Handle.from_buffer_copy(b"ORIONIP1" + bytes(56))
out["forged"] = lib.cuIpcOpenMemHandle(byref(c_uint64()), forged, 0)
peer.sendall(b"done")
"""


@local_only("a relayed session's region is not the GPU host's to vouch for: IPC answers NOT_SUPPORTED there")
@pytest.mark.parametrize("size", [100, 3 * SIZE])  # a small allocation, and a large one: every byte compared
def test_two_processes_of_a_guest_share_memory_and_events_by_legacy_ipc(library: Path, rig: Rig, size: int) -> None:
    mark = rig.mark()
    ours, theirs = socket.socketpair()
    with ours, theirs:
        exporter = _start(library, rig, IPC_SHARING + IPC_EXPORTER, ours, size)
        opener = _start(library, rig, IPC_SHARING + IPC_OPENER, theirs, size)
        exported, opened = _result(exporter), _result(opener)
    assert exported == {"export": SUCCESS, "export_event": INVALID_VALUE, "export_foreign": INVALID_VALUE,
                        "export_ipc_event": SUCCESS, "read_back": True}, exported
    assert opened == {"open": SUCCESS, "read": [SUCCESS, True], "write": SUCCESS, "open_event": SUCCESS,
                      "event_sync": SUCCESS, "open_as_event": INVALID_VALUE, "free": INVALID_VALUE,
                      "close": SUCCESS, "close_again": INVALID_VALUE, "read_closed": INVALID_VALUE,
                      "zeros": INVALID_VALUE, "forged": INVALID_VALUE}, opened
    assert len(rig.entries(since=mark, name="cuIpcOpenMemHandle")) == 1  # the refused ones never reached the driver
    assert len(rig.entries(since=mark, name="cuIpcCloseMemHandle")) == 1


RELAYED_BODY = r"""
prop = Prop()
prop.type, prop.requestedHandleTypes, prop.location = 1, 1, loc(0)
handle = c_uint64()
assert lib.cuMemCreate(byref(handle), SIZE, byref(prop), 0) == 0
out["export"] = export(handle.value)[0]
status, pointer = alloc(SIZE)
out["ipc_export"] = lib.cuIpcGetMemHandle(byref(Handle()), pointer)
out["ipc_open"] = lib.cuIpcOpenMemHandle(byref(c_uint64()), Handle.from_buffer_copy(b"ORIONIP1" + bytes(56)), 0)
"""


def test_a_relayed_session_shares_nothing(library: Path, start: Any) -> None:
    """The GPU host cannot tell which guest a relayed session's region is: sharing answers NOT_SUPPORTED there, before
    the driver."""
    if relay_net.why_not():
        pytest.skip(relay_net.why_not())
    rig = start(relayed=True)
    mark = rig.mark()
    ours, theirs = socket.socketpair()
    with ours, theirs:
        out = _result(_start(library, rig, IPC_SHARING + RELAYED_BODY, ours))
    assert out == {"export": NOT_SUPPORTED, "ipc_export": NOT_SUPPORTED, "ipc_open": NOT_SUPPORTED}, out
    assert [e for e in rig.entries(since=mark) if "Ipc" in e["name"] or "Shareable" in e["name"]] == []
