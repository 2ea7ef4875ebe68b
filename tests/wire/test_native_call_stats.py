"""ORION_STATS: the native guest driver's account of a program's driver calls (guest_runtime/native/call_stats.c) and
the agent's side of it (the wire's STATS record, answered by host_agent/session_loop.py), against a real agent whose
sessions run the executor over the fake driver (tests/forwarding_rig.py), locally or relayed.

A program makes a known number of calls of each kind: answered in the guest, posted, and waited for. The table it
prints at exit must count exactly those, class each as it was served, and give the agent's count of the records of
each call (the compiled hot path's and Python's together) equal to what the program sent. The library's own use of
an entry point (cuGetProcAddress calls cuGetProcAddress_v2) is not counted twice. A fork child that exits writes no
table and never speaks on the parent's channel. Without ORION_STATS nothing is printed."""
from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from host_agent.relay import compiled_pump
from tests import forwarding_rig
from tests.forwarding_rig import Rig, native_child_env
from tests.wire.test_native_launch_calls import EPILOGUE, PRELUDE, PTX, REPO
from tests.wire.test_native_page_locked_fallback import PRELUDE as POOL_PRELUDE

bounded, start, rig = forwarding_rig.bounded, forwarding_rig.start, forwarding_rig.rig  # the rig's fixtures

CALLS = r"""
mode = c_int()
for _ in range(5):
    assert lib.cuModuleGetLoadingMode(byref(mode)) == 0          # answered in the guest
status, module = load(PTX)
assert status == 0
noargs = function(module, b"noargs")
for _ in range(10):
    assert launch(noargs) == 0                                   # posted
import os
child = os.fork()
if child == 0:
    sys.exit(0)  # through exit(): the child writes no table and leaves the parent's channel alone
assert os.waitpid(child, 0)[1] == 0
for _ in range(4):
    assert lib.cuCtxSynchronize() == 0                           # waited for
entry = c_void_p()
lib.cuGetProcAddress.argtypes = [ctypes.c_char_p, c_void_p, c_int, ctypes.c_uint64]
assert lib.cuGetProcAddress(b"cuCtxSynchronize", byref(entry), 12000, 0) == 0  # calls cuGetProcAddress_v2 inside
"""


def _run(library: Path, rig: Rig, stats: str | None) -> subprocess.CompletedProcess[str]:
    env = native_child_env(library, rig.path) | ({"ORION_STATS": stats} if stats is not None else {})
    done = subprocess.run([sys.executable, "-c", PRELUDE + CALLS + EPILOGUE, str(library), PTX.hex()], env=env,
                          capture_output=True, text=True, timeout=50, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def _table(text: str) -> tuple[str, dict[str, list[str]]]:
    """The summary line, and each call's row: calls, guest, posted, round trip, total ms, mean us | compiled, compiled
    us, driver us, python, python us."""
    lines = [line for line in text.splitlines() if line.strip()]
    summary = next(line for line in lines if line.startswith("orion-stats: pid"))
    rows = {}
    for line in lines:
        if "|" in line and not line.startswith("call "):
            left, right = line.split("|")
            name, *cells = left.split()
            rows[name] = cells + right.split()
    return summary, rows


def test_each_call_is_counted_once_and_classed_by_how_it_was_served(library: Path, rig: Rig,
                                                                     tmp_path: Path) -> None:
    _run(library, rig, str(tmp_path / "stats-%p.txt"))
    (written,) = tmp_path.glob("stats-*.txt")  # "%p": the process id; the fork child wrote none
    summary, rows = _table(written.read_text())
    calls, guest, posted, round_trip = (0, 1, 2, 3)
    compiled, python = 6, 9
    assert rows["cuModuleGetLoadingMode"][:4] == ["5", "5", "0", "0"]
    assert rows["cuModuleGetLoadingMode"][compiled:] == ["-"] * 5  # no record of it reached the agent
    assert rows["cuLaunchKernel"][:4] == ["10", "0", "10", "0"]
    assert int(rows["cuLaunchKernel"][compiled]) + int(rows["cuLaunchKernel"][python]) == 10
    assert rows["cuCtxSynchronize"][:4] == ["4", "0", "0", "4"]
    assert int(rows["cuCtxSynchronize"][compiled]) + int(rows["cuCtxSynchronize"][python]) == 4
    assert rows["cuInit"][calls] == "1" and rows["cuInit"][round_trip] == "1"
    assert rows["cuGetProcAddress"][:4] == ["1", "1", "0", "0"]
    assert "cuGetProcAddress_v2" not in rows  # the library's own call inside it
    total = sum(int(cells[calls]) for cells in rows.values() if cells[calls].isdigit())
    assert f", {total} calls (" in summary
    assert sum(int(cells[guest]) + int(cells[posted]) + int(cells[round_trip]) for cells in rows.values()
               if cells[calls].isdigit()) == total
    assert float(rows["cuCtxSynchronize"][5]) > 0  # a mean time in microseconds


def test_without_orion_stats_nothing_is_counted_or_printed(library: Path, rig: Rig) -> None:
    done = _run(library, rig, None)
    assert "orion-stats" not in done.stderr
    done = _run(library, rig, "1")  # to stderr
    summary, rows = _table(done.stderr)
    assert rows["cuCtxSynchronize"][:4] == ["4", "0", "0", "4"]


CAPSULE_PROGRAM = r"""
from cuda.bindings import driver
assert driver.cuInit(0)[0] == 0
err, device = driver.cuDeviceGet(0)
err, context = driver.cuDevicePrimaryCtxRetain(device)
assert driver.cuCtxSetCurrent(context)[0] == 0
for _ in range(3):
    assert driver.cuCtxSynchronize()[0] == 0
print("RESULT {}")
"""


def _run_capsule(rig: Rig, tmp_path: Path) -> tuple[str, dict[str, str]]:
    """CAPSULE_PROGRAM on the capsule path under ORION_STATS: its table, and its environment."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORION_")} | {
        "ORION_SHM": rig.path, "ORION_NATIVE": "0", "ORION_STATS": str(tmp_path / "capsule-%p.txt")}
    done = subprocess.run([sys.executable, "-c", CAPSULE_PROGRAM], env=env, capture_output=True, text=True,
                          timeout=60, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    (written,) = tmp_path.glob("capsule-*.txt")
    return written.read_text(), env


def test_the_capsule_path_keeps_the_same_account(rig: Rig, tmp_path: Path) -> None:
    """A cuda-python program forwarded without the native driver (guest_runtime/call_stats.py): its driver calls
    counted and classed as the native library counts them, with the agent's side; nothing without ORION_STATS."""
    text, env = _run_capsule(rig, tmp_path)
    summary, rows = _table(text)
    assert "(the capsule path)" in summary
    assert rows["cuCtxSynchronize"][:4] == ["3", "0", "0", "3"]
    assert int(rows["cuCtxSynchronize"][6]) + int(rows["cuCtxSynchronize"][9]) == 3
    assert rows["cuInit"][0] == "1"
    total = sum(int(cells[0]) for cells in rows.values() if cells[0].isdigit())
    assert f", {total} calls (" in summary
    quiet = subprocess.run([sys.executable, "-c", CAPSULE_PROGRAM], env=env | {"ORION_STATS": "0"},
                           capture_output=True, text=True, timeout=60, cwd=REPO)
    assert quiet.returncode == 0 and "orion-stats" not in quiet.stderr


RELAYED_CALLS = r"""
setup()
device = alloc(4096)
assert lib.cuMemcpyHtoD(device, b"abcd", 4) == 0
status, pinned = host_alloc(4096)
assert status == 0
for _ in range(5):
    ctypes.memset(pinned, 0, 4)
    assert lib.cuMemcpyDtoH(pinned, device, 4) == 0 and at(pinned, 4) == b"abcd"
for i in range(3):  # page-locked reads, posted, each landed by the stream's synchronisation
    assert lib.cuMemcpyHtoD(device, bytes([i + 7]) * 4, 4) == 0
    ctypes.memset(pinned, 0, 4)
    assert lib.cuMemcpyDtoHAsync(pinned, device, 4, None) == 0 and lib.cuStreamSynchronize(None) == 0
    assert at(pinned, 4) == bytes([i + 7]) * 4
for i in range(4):  # page-locked writes, synchronous then posted, each read back into pageable memory
    ctypes.memmove(pinned, bytes([i + 1]) * 4, 4)
    copied = lib.cuMemcpyHtoD(device, pinned, 4) if i < 2 else lib.cuMemcpyHtoDAsync(device, pinned, 4, None)
    back = ctypes.create_string_buffer(4)
    assert copied == 0 and lib.cuMemcpyDtoH(back, device, 4) == 0 and back.raw == bytes([i + 1]) * 4
for _ in range(3):
    assert lib.cuCtxSynchronize() == 0
"""


def _relayed_rows(text: str) -> dict[str, tuple[int, int]]:
    """The relaying host's rows: "(relayed NAME)" -> (its compiled pump's records, its Python's)."""
    rows = {}
    for line in text.splitlines():
        if line.startswith("(relayed "):
            label, right = line.split("|")
            compiled, _compiled_us, _driver_us, python, _us = right.split()
            rows[label.strip()] = (int(compiled), int(python))
    return rows


def test_a_relayed_sessions_account_says_what_the_relaying_host_served(library: Path, start: Callable[..., Rig],
                                                                       tmp_path: Path) -> None:
    """A relayed session's table adds the relaying host's rows (record.STATS_RELAYED): by the guest's record, how
    many its compiled pump forwarded and how many its Python did. The pump serves a synchronous page-locked read of
    a few bytes itself (relay_pump.c, LANDS_IN_POOL), so all five land there where the pump builds, and a posted
    one, and a small page-locked write, synchronous or posted (SENT_FROM_POOL); the GPU host saw each as the plain
    copy. The capsule path prints the same rows."""
    relayed = start(relayed=True)
    env = native_child_env(library, relayed.path) | {"ORION_STATS": str(tmp_path / "relayed-%p.txt")}
    done = subprocess.run([sys.executable, "-c", POOL_PRELUDE + RELAYED_CALLS, str(library), "", "0"], env=env,
                          capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    (written,) = tmp_path.glob("relayed-*.txt")
    text = written.read_text()
    _summary, rows = _table(text)
    ours = _relayed_rows(text)
    compiled, python = 6, 9
    assert int(rows["cuMemcpyDtoH"][compiled]) + int(rows["cuMemcpyDtoH"][python]) == 5 + 4  # the GPU host's
    assert int(rows["cuMemcpyDtoHAsync"][compiled]) + int(rows["cuMemcpyDtoHAsync"][python]) == 3
    pumped = compiled_pump.PROGRAM.load() is not None
    assert ours["(relayed cuMemcpyDtoH page-locked)"] == ((5, 0) if pumped else (0, 5))
    assert ours["(relayed cuMemcpyDtoHAsync page-locked)"] == ((3, 0) if pumped else (0, 3))
    assert ours["(relayed cuMemcpyHtoD page-locked)"] == ((2, 0) if pumped else (0, 2))
    assert ours["(relayed cuMemcpyHtoDAsync page-locked)"] == ((2, 0) if pumped else (0, 2))
    assert sum(ours["(relayed cuCtxSynchronize)"]) == 3
    assert ours["(relayed cuCtxSynchronize)"][0] == (3 if pumped else 0)
    assert "(relayed STATS)" not in ours  # the question is not counted
    text, _env = _run_capsule(relayed, tmp_path)
    assert sum(_relayed_rows(text)["(relayed cuCtxSynchronize)"]) == 3
