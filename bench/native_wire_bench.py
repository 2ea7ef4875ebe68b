#!/usr/bin/env python3
"""Native wire benchmark: host-local round trips through the C client (guest_runtime/native/orion_wire.c) next to
the Python ClientChannel, against the same served region, in one run. Not a test.

* C client: a small C program (embedded below, built with the system compiler together with orion_wire.c)
  claims a channel, says HELLO and times each ECHO / NOP call with clock_gettime: no Python on the client side;
* C client through ctypes: the same library called from Python (what a ctypes user would pay);
* Python client: ClientChannel.call;
* floor: two C processes ping-ponging one shared word (what any host-local round trip costs on this machine);
* C host: the C client against a minimal C host in the harness (accept, echo) on a region formatted here, with
  no agent process: the wire alone, what a native host dispatch could reach.

Every other row's host is the Python agent (RegionServer + DiagnosticsHandler) in its own process, so the
Python/C ratio shows what the client side alone saves; issue 13's aim (host-local p50 <= 1 us) needs both.

Bulk throughput (staged records): ECHO, DRAIN and FILL of 1, 16 and 64 MiB through the C client (orion_callv via
ctypes, the request sent from one buffer, the reply written into one preallocated buffer; ctypes adds about a
microsecond per call, nothing per byte) next to the Python client (ClientChannel.call, a staged reply handed to a
BufferCursor over a preallocated buffer: the same one copy per side). The host is the same Python agent, so the
ratio is what the client side's chunk copies and waits cost; no thresholds.
Run: `.venv/bin/python bench/native_wire_bench.py` (`--bulk-only` skips the round trips).
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from guest_runtime.native.build import SOURCE_DIR, BuildError, find_compiler  # noqa: E402
from guest_runtime.native.ctypes_client import NativeChannel, load  # noqa: E402
from host_agent.diagnostics import DiagnosticsHandler  # noqa: E402
from host_agent.region_server import ServerOptions, serve  # noqa: E402
from ivshmem import BufferCursor, ClientChannel, Op, Region, layout  # noqa: E402
from ivshmem.layout import Geometry  # noqa: E402
from ivshmem.record import FILL_REQUEST  # noqa: E402

MIB = 1 << 20
_MP = multiprocessing.get_context("fork")

# What every C client of the benches starts with: the wire client's header, a monotonic clock in ns, and the
# comparison that sorts samples for their percentiles (bench/host_roundtrip_bench.py's client too).
TIMING_C = r"""
#define _GNU_SOURCE
#include "orion_wire.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static long long ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}
static int cmp(const void *a, const void *b) {
    long long x = *(const long long *)a, y = *(const long long *)b;
    return (x > y) - (x < y);
}
"""

HARNESS = TIMING_C + r"""
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#include <fcntl.h>
#include <signal.h>

static void report(const char *what, long long *v, int n) {
    qsort(v, n, sizeof *v, cmp);
    printf("%s %lld %lld\n", what, v[n / 2], v[(int)(n * 0.99)]);
}

/* A minimal native host for channel 0 of a region Python formatted (argv: "wire" PATH N CHANNEL_OFFSET OFF_REQ
 * OFF_CPL SLOT ENTRIES): accept the claim, then echo every request until the parent is gone. */
static pid_t parent, host_pid;

static void native_host(unsigned char *ch, unsigned req, unsigned cpl, unsigned slot, unsigned entries) {
    unsigned *ctrl = (unsigned *)ch, gen;
    while (!(__atomic_load_n(&ctrl[1], __ATOMIC_ACQUIRE) && (gen = __atomic_load_n(&ctrl[0], __ATOMIC_ACQUIRE))
             && gen != __atomic_load_n(&ctrl[16], __ATOMIC_ACQUIRE))) {}
    unsigned *rq_head = (unsigned *)(ch + req), *rq_tail = (unsigned *)(ch + req + 64);
    unsigned *cp_head = (unsigned *)(ch + cpl), *cp_tail = (unsigned *)(ch + cpl + 64);
    __atomic_store_n(rq_head, 0, __ATOMIC_RELEASE);
    __atomic_store_n(cp_tail, 0, __ATOMIC_RELEASE);
    __atomic_store_n(&ctrl[17], 1, __ATOMIC_RELEASE);  /* HOST_STATUS SERVING */
    __atomic_store_n(&ctrl[16], gen, __ATOMIC_RELEASE);  /* HOST_GEN */
    unsigned head = 0, tail = 0;
    unsigned long long beat = 0, spins = 0;
    for (;;) {
        if (__atomic_load_n(rq_tail, __ATOMIC_ACQUIRE) == head) {
            if (++spins % 100000 == 0) {
                __atomic_store_n((unsigned long long *)&ctrl[20], ++beat, __ATOMIC_RELEASE);  /* HOST_HEARTBEAT */
                if (getppid() != parent) _exit(0);
            }
            continue;
        }
        unsigned char *in = ch + req + 128 + (size_t)(head & (entries - 1)) * slot;
        while (tail - __atomic_load_n(cp_head, __ATOMIC_ACQUIRE) >= entries) {}
        unsigned char *out = ch + cpl + 128 + (size_t)(tail & (entries - 1)) * slot;
        unsigned length, flags;
        memcpy(&flags, in + 12, 4);
        memcpy(&length, in + 16, 4);
        if (!(flags & 1)) {
            memcpy(out, in, 32 + length);
            memset(out + 28, 0, 4);
            unsigned opcode;
            memcpy(&opcode, in + 8, 4);
            if (opcode == 1) {  /* HELLO: session 1, agent "" */
                unsigned long long session = 1;
                length = 12;
                memcpy(out + 16, &length, 4);
                memcpy(out + 32, &session, 8);
                memset(out + 40, 0, 4);
            }
            __atomic_store_n(cp_tail, ++tail, __ATOMIC_RELEASE);
        }
        __atomic_store_n(rq_head, ++head, __ATOMIC_RELEASE);
    }
}

int main(int argc, char **argv) {
    if (argc != 3 && argc != 9) return 2;
    int n = atoi(argv[2]);
    long long *v = calloc(n, sizeof *v);
    if (argc == 9) {
        int fd = open(argv[1], O_RDWR);
        off_t size = lseek(fd, 0, SEEK_END);
        unsigned char *map = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        parent = getpid();
        pid_t pid = host_pid = fork();
        if (pid == 0) {
            native_host(map + atoll(argv[3]), atoi(argv[4]), atoi(argv[5]), atoi(argv[6]), atoi(argv[7]));
            _exit(0);
        }
        (void)argv[8];
    }
    if (strcmp(argv[1], "floor") == 0) {  /* two processes, one shared word each way */
        volatile unsigned *w = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        pid_t pid = fork();
        if (pid == 0) {
            for (unsigned i = 1; i <= (unsigned)n; i++) {
                while (__atomic_load_n(&w[0], __ATOMIC_ACQUIRE) != i) {}
                __atomic_store_n(&w[16], i, __ATOMIC_RELEASE);
            }
            _exit(0);
        }
        for (unsigned i = 1; i <= (unsigned)n; i++) {
            long long t = ns();
            __atomic_store_n(&w[0], i, __ATOMIC_RELEASE);
            while (__atomic_load_n(&w[16], __ATOMIC_ACQUIRE) != i) {}
            v[i - 1] = ns() - t;
        }
        waitpid(pid, NULL, 0);
        report("floor", v, n);
        return 0;
    }
    char err[1024];
    orion_channel *ch;
    if (orion_open(argv[1], &ch, err, sizeof err)) { fprintf(stderr, "%s\n", err); return 1; }
    if (orion_hello(ch, "", NULL)) { fprintf(stderr, "%s\n", orion_error(ch)); return 1; }
    char req[64] = "12345678", rep[65536];
    int32_t status; size_t got;
    for (int pass = 0; pass < 2; pass++) {
        unsigned op = pass ? ORION_OP_NOP : ORION_OP_ECHO;
        size_t len = pass ? 0 : 8;
        for (int i = 0; i < n / 10; i++) orion_call(ch, op, req, len, &status, rep, sizeof rep, &got);  /* warm */
        for (int i = 0; i < n; i++) {
            long long t = ns();
            if (orion_call(ch, op, req, len, &status, rep, sizeof rep, &got)) {
                fprintf(stderr, "%s\n", orion_error(ch));
                return 1;
            }
            v[i] = ns() - t;
        }
        report(pass ? "nop" : "echo", v, n);
    }
    orion_close(ch);
    if (host_pid > 0) {
        kill(host_pid, SIGKILL);
        waitpid(host_pid, NULL, 0);
    }
    return 0;
}
"""
# argv[8] of the "wire" mode is only a marker that the native host runs (its child exits with the parent).


def build_harness(directory: Path) -> tuple[Path, Path]:
    """(harness executable, shared library), both built with the system compiler."""
    compiler = find_compiler()
    if compiler is None:
        raise BuildError("no C compiler found (set CC, or install gcc) to build the native benchmark")
    source = directory / "harness.c"
    source.write_text(HARNESS)
    exe, lib = directory / "harness", directory / "liborion_wire.so"
    flags = ["-std=c11", "-O2", "-Wall", "-Wextra", f"-I{SOURCE_DIR}"]
    subprocess.run([*compiler, *flags, "-o", str(exe), str(source), str(SOURCE_DIR / "orion_wire.c"), "-lpthread"],
                   check=True)
    subprocess.run([*compiler, *flags, "-fPIC", "-shared", "-o", str(lib), str(SOURCE_DIR / "orion_wire.c"),
                    "-lpthread"], check=True)
    return exe, lib


def percentiles(values: list[int]) -> tuple[float, float]:
    values = sorted(values)
    return values[len(values) // 2] / 1e3, values[min(len(values) - 1, int(len(values) * 0.99))] / 1e3


def timed(call: object, n: int) -> tuple[float, float]:
    clock, out = time.perf_counter_ns, []
    for _ in range(n // 10):
        call()  # type: ignore[operator]
    for _ in range(n):
        start = clock()
        call()  # type: ignore[operator]
        out.append(clock() - start)
    return percentiles(out)


def harness_rows(exe: Path, *args: str) -> dict[str, tuple[float, float]]:
    done = subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=600, check=False)
    if done.returncode:
        raise SystemExit(f"native harness failed: {done.stderr.strip()}")
    rows = {}
    for line in done.stdout.splitlines():
        name, p50, p99 = line.split()
        rows[name] = (int(p50) / 1e3, int(p99) / 1e3)
    return rows


def native_host_rows(exe: Path, n: int) -> dict[str, tuple[float, float]]:
    """The C client against the harness's own minimal C host on a region formatted here: the wire alone."""
    path = f"/dev/shm/orion-bench-{uuid.uuid4().hex[:8]}"
    with open(path, "wb") as f:
        f.truncate(32 * MIB)
    try:
        with Region.open(path) as region:
            g = Geometry.build(region.size, name="native-host-bench")
            region.format(g)
            region.set_agent(pid=os.getpid(), state=layout.AGENT_SERVING, beat=True)
        return harness_rows(exe, path, str(n), str(g.channel_base(0)), str(g.off_req_ring), str(g.off_cpl_ring),
                            str(g.slot_size), str(g.ring_entries), "native-host")
    finally:
        os.unlink(path)


BULK_OPS = ("ECHO", "DRAIN", "FILL")
BULK_BYTES = 512 * MIB  # per row and client, at least 5 calls: enough calls that the median is steady
BULK_WARMUP = 3  # calls per client before timing: the first ones fault in the agent's and the reply's pages


def native_bulk(channel: NativeChannel, op: str, payload: bytes, reply: bytearray) -> Callable[[], object]:
    """One bulk call through the C client: the request from `payload`, the reply into `reply`, where they lie."""
    size = len(payload)
    if op == "ECHO":
        return lambda: _expect(channel.callv(Op.ECHO, [payload], reply), size)
    if op == "DRAIN":
        small = bytearray(64)
        return lambda: _expect(channel.callv(Op.DRAIN, [payload], small), 12)
    request = FILL_REQUEST.encode(size, 1)
    return lambda: _expect(channel.callv(Op.FILL, [request], reply), size)


def _expect(result: tuple[int, int], length: int) -> None:
    if result != (0, length):
        raise SystemExit(f"native bulk call answered (status, length) {result}, expected (0, {length})")


def python_bulk(channel: ClientChannel, op: str, payload: bytes, reply: bytearray) -> Callable[[], object]:
    """The same call through ClientChannel, a staged reply landing in `reply` (one copy, as the C client does)."""
    size = len(payload)
    if op == "ECHO":
        return lambda: channel.call(Op.ECHO, payload, sink=BufferCursor(reply).sink)
    if op == "DRAIN":
        return lambda: channel.call(Op.DRAIN, payload)
    request = FILL_REQUEST.encode(size, 1)
    return lambda: channel.call(Op.FILL, request, sink=BufferCursor(reply).sink)


def median_seconds(calls: list[Callable[[], object]], size: int) -> list[float]:
    """The median wall time of one call of each of `calls`, taken in turns (so a noisy moment on this machine
    hits them alike), over enough calls to move BULK_BYTES each, after BULK_WARMUP calls of each."""
    for call in calls:
        for _ in range(BULK_WARMUP):
            call()
    times: list[list[float]] = [[] for _ in calls]
    for _ in range(max(5, BULK_BYTES // size)):
        for call, taken in zip(calls, times, strict=True):
            start = time.perf_counter()
            call()
            taken.append(time.perf_counter() - start)
    return [sorted(taken)[len(taken) // 2] for taken in times]


def bulk_rows(path: str, lib_path: Path, sizes: list[int]) -> list[tuple[str, int, float, float]]:
    """(op, size, C seconds, Python seconds) per op and size: the two clients take turns on one served region."""
    rows = []
    with NativeChannel(load(lib_path), path) as native, Region.open(path) as region, \
            ClientChannel.claim(region) as python:
        native.hello()
        python.hello()
        for size in sizes:
            payload, reply = os.urandom(size), bytearray(size)
            for op in BULK_OPS:
                c, py = median_seconds([native_bulk(native, op, payload, reply),
                                        python_bulk(python, op, payload, reply)], size)
                rows.append((op, size, c, py))
    return rows


def print_bulk(rows: list[tuple[str, int, float, float]], geometry: str) -> None:
    print(f"## bulk throughput through the staging arenas, GB/s of payload (median call; {geometry}; host: the "
          "Python agent)")
    print(f"{'':16}{'C client':>12}{'Python client':>16}{'Python/C time':>16}")
    for op, size, c, py in rows:
        print(f"{op + f' {size // MIB} MiB':16}{size / c / 1e9:12.2f}{size / py / 1e9:16.2f}{py / c:15.2f}x")


def describe_geometry(path: str) -> str:
    with Region.open(path) as region:
        g = region.geometry
    return f"{g.chunk_count} chunks of {g.chunk_size // 1024} KiB per arena, {g.slot_size}-byte slots"


def _serve(path: str) -> None:
    serve(path, DiagnosticsHandler, ServerOptions(channels=4))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--round-trips", type=int, default=50000)
    parser.add_argument("--bulk-sizes", default="1,16,64", help="bulk sizes in MiB")
    parser.add_argument("--bulk-only", action="store_true", help="skip the round-trip rows")
    args = parser.parse_args()
    n = args.round_trips
    sizes = [int(mib) * MIB for mib in args.bulk_sizes.split(",") if mib]
    with tempfile.TemporaryDirectory() as tmp:
        try:
            exe, lib_path = build_harness(Path(tmp))
        except BuildError as exc:
            print(f"native_wire_bench: {exc}", file=sys.stderr)
            return 1
        path = f"/dev/shm/orion-bench-{uuid.uuid4().hex[:8]}"
        with open(path, "wb") as f:
            f.truncate(32 * MIB)
        server = _MP.Process(target=_serve, args=(path,))
        server.start()
        try:
            deadline = time.monotonic() + 10
            while True:
                with open(path, "rb") as f:
                    head = f.read(layout.HEADER_SIZE)
                if head[:8] == layout.MAGIC and int.from_bytes(head[layout.AGENT_STATE:layout.AGENT_STATE + 4],
                                                                "little") == layout.AGENT_SERVING:
                    break
                if time.monotonic() > deadline:
                    raise SystemExit("the region server did not start")
                time.sleep(0.05)
            geometry = describe_geometry(path)
            bulk = bulk_rows(path, lib_path, sizes)
            if not args.bulk_only:
                native = harness_rows(exe, path, str(n))
                floor = harness_rows(exe, "floor", str(n))["floor"]
                wire_alone = native_host_rows(exe, n)
                lib = load(lib_path)
                with NativeChannel(lib, path) as channel:
                    channel.hello()
                    via_ctypes = {"echo": timed(lambda: channel.call(Op.ECHO, b"12345678"), n),
                                  "nop": timed(lambda: channel.call(Op.NOP), n)}
                with Region.open(path) as region, ClientChannel.claim(region) as py:
                    py.hello()
                    python = {"echo": timed(lambda: py.call(Op.ECHO, b"12345678"), n),
                              "nop": timed(lambda: py.call(Op.NOP), n)}
        finally:
            if server.pid:
                os.kill(server.pid, signal.SIGINT)
            server.join(10)
            os.unlink(path)
    print_bulk(bulk, geometry)
    if args.bulk_only:
        return 0
    print()
    print(f"## host-local round trip, {n} calls each, p50 / p99 in us (host: the Python agent)")
    print(f"{'':22}{'C client':>18}{'C via ctypes':>18}{'Python client':>18}{'p50 Python/C':>14}")
    for name, label in (("echo", "ECHO 8 B"), ("nop", "NOP")):
        c, t, p = native[name], via_ctypes[name], python[name]
        print(f"{label:22}{c[0]:9.2f} /{c[1]:7.2f}{t[0]:9.2f} /{t[1]:7.2f}{p[0]:9.2f} /{p[1]:7.2f}"
              f"{p[0] / c[0]:13.2f}x")
    print(f"{'floor (C word ping-pong)':22}{floor[0]:9.2f} /{floor[1]:7.2f}")
    for name, label in (("echo", "ECHO 8 B"), ("nop", "NOP")):
        w = wire_alone[name]
        print(f"{label + ', C host':22}{w[0]:9.2f} /{w[1]:7.2f}   (C client, minimal C host: the wire alone)")
    print("aim (issue 13): host-local round trip p50 <= 1 us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
