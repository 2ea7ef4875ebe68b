"""A copy to the device that the driver would take returns once its bytes are in the channel, as the driver's
pageable copy returns once its staging holds them (guest_runtime/native/copy_calls.c, posted_as_the_driver_would),
against a real agent whose sessions run the executor over the fake driver (tests/forwarding_rig.py), locally or
relayed.

Posted: a copy from pageable memory of any size into memory this process allocated, synchronous (cuMemcpyHtoD),
async on a default stream or on a stream the process made (and has not destroyed), with a context current and no
capture under way. The program may overwrite its buffer as soon as the call returns, and the device holds the bytes
it gave, in stream order with the calls around it. Waited for, as before (ORION_STATS says which was which): a copy
on a stream the process destroyed (the host's INVALID_HANDLE is the call's answer), one from page-locked memory of
any size (the host's copy out of the pool, in stream order: earlier work may still write those pages,
tests/differential/pool_kernels.py), one while a capture may be under way, one into a reserved range that is not
mapped, and one into memory the process never allocated, whose error (the agent's, the driver's) is the call's own
answer."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests import forwarding_rig
from tests.forwarding_rig import Rig, native_child_env
from tests.wire.test_native_call_stats import _table
from tests.wire.test_native_callbacks import EXTRAS
from tests.wire.test_native_launch_calls import EPILOGUE, PRELUDE, PTX, REPO

bounded, start, rig = forwarding_rig.bounded, forwarding_rig.start, forwarding_rig.rig  # the rig's fixtures
SUCCESS, INVALID_VALUE, INVALID_HANDLE = 0, 1, 400

PROGRAM = r"""
lib.cuMemcpyDtoH.argtypes = [c_void_p, c_uint64, c_size_t]
lib.cuMemAddressReserve.argtypes = [c_void_p, c_size_t, c_size_t, c_uint64, c_uint64]
memory = device(1 << 20)
data = bytes((i * 7 + 3) & 0xFF for i in range(4096))
buffer = ctypes.create_string_buffer(data, len(data))
out["posted"] = [lib.cuMemcpyHtoDAsync(memory + 256 * i, buffer, 256, None) for i in range(16)]
ctypes.memset(buffer, 0, len(data))  # the bytes were taken: the program may reuse its buffer at once
back = ctypes.create_string_buffer(4096)
out["read_back"] = [lib.cuMemcpyDtoH(back, memory, 4096), back.raw == data]
ctypes.memmove(buffer, data, len(data))
side = stream(1)  # a stream this process made: a copy on it is posted too
out["created_stream"] = lib.cuMemcpyHtoDAsync(memory + 32768, buffer, 256, side)
ctypes.memset(buffer, 0, 256)
back = ctypes.create_string_buffer(256)
out["created_stream_read_back"] = [lib.cuStreamSynchronize(side), lib.cuMemcpyDtoH(back, memory + 32768, 256),
                                   back.raw == data[:256]]
ctypes.memmove(buffer, data, len(data))
assert lib.cuStreamDestroy(side) == 0
out["destroyed_stream"] = lib.cuMemcpyHtoDAsync(memory, buffer, 256, side)  # no longer known: waited for
large_data = bytes((i * 13 + 5) & 0xFF for i in range(640 << 10))  # 640 KiB: staged, many chunks
large = ctypes.create_string_buffer(large_data, len(large_data))
out["large"] = lib.cuMemcpyHtoDAsync(memory + (256 << 10), large, len(large_data), None)
ctypes.memset(large, 0, len(large_data))  # taken when the call returned, however large
large_back = ctypes.create_string_buffer(len(large_data))
out["large_read_back"] = [lib.cuMemcpyDtoH(large_back, memory + (256 << 10), len(large_data)),
                          large_back.raw == large_data]
reserved = c_uint64()
assert lib.cuMemAddressReserve(byref(reserved), 2 << 20, 0, 0, 0) == 0
out["reserved"] = lib.cuMemcpyHtoDAsync(reserved.value, buffer, 256, None)
out["unallocated"] = lib.cuMemcpyHtoDAsync(0xDEAD0000, buffer, 256, None)
assert lib.cuCtxSynchronize() == 0

lib.cuMemcpyHtoD.argtypes = [c_uint64, c_void_p, c_size_t]
out["sync"] = [lib.cuMemcpyHtoD(memory + 8192 + 256 * i, addressof(buffer) + 256 * i, 256) for i in range(4)]
ctypes.memset(buffer, 0, len(data))
pinned = c_void_p()
assert lib.cuMemAllocHost(byref(pinned), 4096) == 0
ctypes.memmove(pinned, data, 4096)
out["sync_pinned"] = lib.cuMemcpyHtoD(memory + 16384, pinned, 4096)  # the host's copy: waited
ctypes.memset(pinned, 0xEE, 4096)  # taken when the call returned, as the driver's copy had finished with them
pinned_large = c_void_p()
assert lib.cuMemAllocHost(byref(pinned_large), 128 << 10) == 0
ctypes.memmove(pinned_large, large_data, 128 << 10)
out["sync_pinned_large"] = lib.cuMemcpyHtoD(memory + (128 << 10), pinned_large, 128 << 10)  # the host's DMA: waited
back = ctypes.create_string_buffer(12288)
out["sync_read_back"] = [lib.cuMemcpyDtoH(back, memory + 8192, 12288), back.raw[:1024] == data[:1024],
                         back.raw[-4096:] == data]
out["sync_unallocated"] = lib.cuMemcpyHtoD(0xDEAD0000, buffer, 256)
capturing = stream(1)
assert lib.cuStreamBeginCapture(capturing, 2) == 0  # relaxed: a legacy-stream copy is allowed beside it
out["sync_capturing"] = lib.cuMemcpyHtoD(memory, buffer, 256)
graph = c_void_p()
assert lib.cuStreamEndCapture(capturing, byref(graph)) == 0
"""


def test_a_copy_the_driver_would_take_returns_once_its_bytes_are_in_the_channel(library: Path, rig: Rig,
                                                                                      tmp_path: Path) -> None:
    stats = tmp_path / "stats.txt"
    env = native_child_env(library, rig.path) | {"ORION_STATS": str(stats)}
    done = subprocess.run([sys.executable, "-c", PRELUDE + EXTRAS + PROGRAM + EPILOGUE, str(library), PTX.hex()],
                          env=env, capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))[7:])
    assert out["posted"] == [SUCCESS] * 16
    assert out["read_back"] == [SUCCESS, True]  # the bytes given, in stream order before the read
    assert out["created_stream"] == SUCCESS and out["created_stream_read_back"] == [SUCCESS, SUCCESS, True]
    assert out["destroyed_stream"] == INVALID_HANDLE  # the host's error, at once
    assert out["large"] == SUCCESS and out["large_read_back"] == [SUCCESS, True]
    assert out["reserved"] != SUCCESS and out["unallocated"] == INVALID_VALUE  # the call's own error, at once
    assert out["sync"] == [SUCCESS] * 4 and out["sync_pinned"] == SUCCESS and out["sync_pinned_large"] == SUCCESS
    assert out["sync_read_back"] == [SUCCESS, True, True]
    assert out["sync_unallocated"] == INVALID_VALUE and out["sync_capturing"] == SUCCESS
    _summary, rows = _table(stats.read_text())
    calls, guest, posted, round_trip = rows["cuMemcpyHtoDAsync"][:4]
    assert (calls, guest, posted, round_trip) == ("21", "0", "18", "3")  # the large one posted too
    calls, guest, posted, round_trip = rows["cuMemcpyHtoD"][:4]
    assert (calls, guest, posted, round_trip) == ("8", "0", "4", "4")  # the capture's, the unallocated one and the
    # two page-locked ones waited
