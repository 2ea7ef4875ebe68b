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

Results are checked (bench/verify.py), after the timing: each ECHO round trip's reply against its request (the
harness compares every reply in C), and each bulk row's last reply, landing where that client's reply buffer was
cleared before the timed calls, against what it must be (the request for ECHO, the request's length and CRC for
DRAIN, the agent's pattern for FILL). A ratio is printed only for right results; otherwise a WRONG RESULT line,
and the exit status is 1. NOP carries no data.

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
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple, cast

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.verify import Checks, digest, first_wrong  # noqa: E402
from guest_runtime.native.build import SOURCE_DIR, BuildError, find_compiler, wire_sources, write_region_header  # noqa: E402
from guest_runtime.native.ctypes_client import NativeChannel, load  # noqa: E402
from host_agent.daemon.region_server import serve  # noqa: E402
from host_agent.diagnostics import DiagnosticsHandler  # noqa: E402
from host_agent.session_loop import ServerOptions  # noqa: E402
from ivshmem import BufferCursor, ClientChannel, Op, Region, layout  # noqa: E402
from ivshmem.layout import Geometry  # noqa: E402
from ivshmem.record import DRAIN_REPLY, FILL_REQUEST, Record, fill_pattern  # noqa: E402

MIB = 1 << 20
_MP = multiprocessing.get_context("fork")

# What every C client of the benches starts with: the wire client's header, a monotonic clock in ns, the
# comparison that sorts samples for their percentiles (bench/host_roundtrip_bench.py's client too), and the line
# that tells the benchmark what a call delivered, for its result check (c_output reads both kinds of line).
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
/* Some bytes as a short string: in hex up to 16 of them, else "fnv" and their 64-bit FNV-1a. */
static inline void describe_bytes(char out[40], const void *data, size_t n) {
    const unsigned char *p = data;
    if (n <= 16) {
        out[0] = 0;
        for (size_t i = 0; i < n; i++) sprintf(out + 2 * i, "%02x", p[i]);
        return;
    }
    unsigned long long h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ULL;
    sprintf(out, "fnv%016llx", h);
}
/* What the calls of a row delivered: the first reply that was not what it must be, else the last. */
typedef struct { char value[40]; int wrong; } seen_t;
static inline void see_reply(seen_t *seen, const void *got, size_t n, const void *want, size_t want_n, int last) {
    if (seen->wrong) return;
    seen->wrong = n != want_n || memcmp(got, want, want_n) != 0;
    if (seen->wrong || last) describe_bytes(seen->value, got, n);
}
/* The line the benchmark reads (c_output): "bytes WHAT VALUE". */
static inline void print_bytes(const char *what, const char *value) { printf("bytes %s %s\n", what, value); }
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
 * OFF_CPL SLOT ENTRIES): accept the claim, then echo every request until the parent is gone. Protocol 3: it watches
 * each request slot's publish mark and publishes a reply by its tail, then its mark (docs/wire-protocol.md, "Ring"). */
static inline unsigned mark(unsigned tail) { return 0x80000000u | (tail & 0x7FFFFFFFu); }
static pid_t parent, host_pid;

static void native_host(unsigned char *ch, unsigned req, unsigned cpl, unsigned slot, unsigned entries) {
    unsigned *ctrl = (unsigned *)ch, gen;
    while (!(__atomic_load_n(&ctrl[1], __ATOMIC_ACQUIRE) && (gen = __atomic_load_n(&ctrl[0], __ATOMIC_ACQUIRE))
             && gen != __atomic_load_n(&ctrl[16], __ATOMIC_ACQUIRE))) {}
    unsigned *rq_head = (unsigned *)(ch + req), *rq_tail = (unsigned *)(ch + req + 64);
    unsigned *cp_head = (unsigned *)(ch + cpl), *cp_tail = (unsigned *)(ch + cpl + 64);
    __atomic_store_n(rq_head, 0, __ATOMIC_RELEASE);
    for (unsigned k = 0; k < entries; k++)
        __atomic_store_n((unsigned *)(ch + cpl + 128 + (size_t)k * slot + 28), 0, __ATOMIC_RELEASE);
    __atomic_store_n(cp_tail, 0, __ATOMIC_RELEASE);
    __atomic_store_n(&ctrl[17], 1, __ATOMIC_RELEASE);  /* HOST_STATUS SERVING */
    __atomic_store_n(&ctrl[16], gen, __ATOMIC_RELEASE);  /* HOST_GEN */
    unsigned head = 0, tail = 0;
    unsigned long long beat = 0, spins = 0;
    (void)rq_tail;
    for (;;) {
        unsigned char *in = ch + req + 128 + (size_t)(head & (entries - 1)) * slot;
        if (__atomic_load_n((unsigned *)(in + 28), __ATOMIC_ACQUIRE) != mark(head + 1)) {
            if (++spins % 100000 == 0) {
                __atomic_store_n((unsigned long long *)&ctrl[20], ++beat, __ATOMIC_RELEASE);  /* HOST_HEARTBEAT */
                if (getppid() != parent) _exit(0);
            }
            continue;
        }
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
            __atomic_store_n((unsigned *)(out + 28), mark(tail), __ATOMIC_RELEASE);
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
    seen_t echoed = { "", 0 };
    int32_t status; size_t got;
    for (int pass = 0; pass < 2; pass++) {
        unsigned op = pass ? ORION_OP_NOP : ORION_OP_ECHO;
        size_t len = pass ? 0 : 8;
        for (int i = 0; i < n / 10; i++) orion_call(ch, op, req, len, &status, rep, sizeof rep, &got);  /* warm */
        for (int i = 0; i < n; i++) {
            memset(rep, 0, len);  /* (untimed) a reply that wrote nothing shows */
            got = 0;
            long long t = ns();
            if (orion_call(ch, op, req, len, &status, rep, sizeof rep, &got) || status) {
                fprintf(stderr, "%s (status %d)\n", orion_error(ch), status);
                return 1;
            }
            v[i] = ns() - t;
            if (!pass) see_reply(&echoed, rep, got, req, len, i == n - 1);
        }
        report(pass ? "nop" : "echo", v, n);
    }
    print_bytes("echo", echoed.value);  /* after the rows: the KVM guest's parser reads "echo ... | nop ..." */
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
    write_region_header(directory)  # orion_wire.c includes the generated orion_region.h
    flags = ["-std=c11", "-O2", "-Wall", "-Wextra", f"-I{SOURCE_DIR}", f"-I{directory}"]
    subprocess.run([*compiler, *flags, "-o", str(exe), str(source), *wire_sources(), "-lpthread"],
                   check=True)
    subprocess.run([*compiler, *flags, "-fPIC", "-shared", "-o", str(lib), *wire_sources(),
                    "-lpthread"], check=True)
    return exe, lib


def percentiles(values: list[int]) -> tuple[float, float]:
    values = sorted(values)
    return values[len(values) // 2] / 1e3, values[min(len(values) - 1, int(len(values) * 0.99))] / 1e3


def timed(call: Callable[[], object], n: int) -> tuple[float, float, list[object]]:
    """p50 and p99 (us) of n calls after n/10 untimed ones, and what each timed call returned."""
    clock, out, results = time.perf_counter_ns, [], []
    for _ in range(n // 10):
        call()
    for _ in range(n):
        start = clock()
        result = call()
        out.append(clock() - start)
        results.append(result)
    return (*percentiles(out), results)


ECHO_REQUEST = b"12345678"  # the round trips' ECHO request (the harness's too): its reply must be these bytes


def c_output(stdout: str) -> tuple[dict[str, tuple[float, float]], dict[str, str]]:
    """What a benchmark's C client printed: its rows "NAME P50_NS P99_NS" (as name: p50, p99 in us), and its
    "bytes WHAT VALUE" lines (TIMING_C's print_bytes: what a call delivered) as what: value."""
    rows, delivered = {}, {}
    for line in stdout.splitlines():
        fields = line.split()
        if not fields:
            continue
        if fields[0] == "bytes":
            delivered[fields[1]] = fields[2] if len(fields) > 2 else ""
        else:
            rows[fields[0]] = (int(fields[1]) / 1e3, int(fields[2]) / 1e3)
    return rows, delivered


def harness_rows(exe: Path, *args: str) -> tuple[dict[str, tuple[float, float]], str | None]:
    """The harness's rows (name: p50, p99 in us), and the hex of what its ECHO calls got back: the first reply
    that was not the request, else the last (None: no ECHO row, the floor)."""
    done = subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=600, check=False)
    if done.returncode:
        raise SystemExit(f"native harness failed: {done.stderr.strip()}")
    rows, delivered = c_output(done.stdout)
    return rows, delivered.get("echo")


def native_host_rows(exe: Path, n: int) -> tuple[dict[str, tuple[float, float]], str | None]:
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


def bulk_expected(op: str, payload: bytes) -> str:
    """The digest of what a bulk call must deliver: the request (ECHO), its length and CRC as the agent saw them
    (DRAIN), the agent's pattern (FILL, seed 1)."""
    size = len(payload)
    if op == "ECHO":
        return digest(payload)
    if op == "DRAIN":
        return digest(DRAIN_REPLY.encode(size, zlib.crc32(payload)))
    return digest(fill_pattern(1, size))


class Bulk(NamedTuple):
    """One client's bulk call: `call` makes it (timed), `result` is what the last one delivered (read after the
    timing), `clear` empties where it delivers (before the timing, so a call that delivers nothing shows)."""

    call: Callable[[], object]
    result: Callable[[], bytes | bytearray]
    clear: Callable[[], None]


def native_bulk(channel: NativeChannel, op: str, payload: bytes, reply: bytearray) -> Bulk:
    """One bulk call through the C client: the request from `payload`, the reply into `reply`, where they lie."""
    size = len(payload)
    if op == "DRAIN":
        small = bytearray(64)
        return Bulk(lambda: _expect(channel.callv(Op.DRAIN, [payload], small), 12), lambda: small[:12],
                    lambda: small.__setitem__(slice(None), bytes(64)))
    if op == "ECHO":
        call = lambda: _expect(channel.callv(Op.ECHO, [payload], reply), size)  # noqa: E731
    else:
        request = FILL_REQUEST.encode(size, 1)
        call = lambda: _expect(channel.callv(Op.FILL, [request], reply), size)  # noqa: E731
    return Bulk(call, lambda: reply, lambda: reply.__setitem__(slice(None), bytes(size)))


def _expect(result: tuple[int, int], length: int) -> None:
    if result != (0, length):
        raise SystemExit(f"native bulk call answered (status, length) {result}, expected (0, {length})")


def python_bulk(channel: ClientChannel, op: str, payload: bytes, reply: bytearray) -> Bulk:
    """The same call through ClientChannel, a staged reply landing in `reply` (one copy, as the C client does)."""
    size = len(payload)
    last = [b""]  # DRAIN's reply

    def answered(record: Record) -> None:
        if record.status:
            raise SystemExit(f"Python bulk {op} answered status {record.status}")
    if op == "DRAIN":
        def drain() -> None:
            record = channel.call(Op.DRAIN, payload)
            answered(record)
            last[0] = bytes(record.payload)
        return Bulk(drain, lambda: last[0], lambda: last.__setitem__(0, b""))
    if op == "ECHO":
        call = lambda: answered(channel.call(Op.ECHO, payload, sink=BufferCursor(reply).sink))  # noqa: E731
    else:
        request = FILL_REQUEST.encode(size, 1)
        call = lambda: answered(channel.call(Op.FILL, request, sink=BufferCursor(reply).sink))  # noqa: E731
    return Bulk(call, lambda: reply, lambda: reply.__setitem__(slice(None), bytes(size)))


def median_seconds(calls: list[Bulk], size: int) -> list[float]:
    """The median wall time of one call of each of `calls`, taken in turns (so a noisy moment on this machine
    hits them alike), over enough calls to move BULK_BYTES each, after BULK_WARMUP calls of each; where each
    delivers is cleared after the warm-up."""
    for bulk in calls:
        for _ in range(BULK_WARMUP):
            bulk.call()
        bulk.clear()
    times: list[list[float]] = [[] for _ in calls]
    for _ in range(max(5, BULK_BYTES // size)):
        for bulk, taken in zip(calls, times, strict=True):
            start = time.perf_counter()
            bulk.call()
            taken.append(time.perf_counter() - start)
    return [sorted(taken)[len(taken) // 2] for taken in times]


class BulkRow(NamedTuple):
    op: str
    size: int
    c: float  # seconds of one call, C client
    python: float  # ... Python client
    expected: str  # the digest of what the call must deliver
    c_got: str  # ... of what the C client's last timed call delivered
    python_got: str


def bulk_rows(path: str, lib_path: Path, sizes: list[int]) -> list[BulkRow]:
    """Per op and size, both clients' times and results: the two clients take turns on one served region."""
    rows = []
    with NativeChannel(load(lib_path), path) as native, Region.open(path) as region, \
            ClientChannel.claim(region) as python:
        native.hello()
        python.hello()
        for size in sizes:
            payload, c_reply, py_reply = os.urandom(size), bytearray(size), bytearray(size)
            for op in BULK_OPS:
                calls = [native_bulk(native, op, payload, c_reply), python_bulk(python, op, payload, py_reply)]
                c, py = median_seconds(calls, size)
                rows.append(BulkRow(op, size, c, py, bulk_expected(op, payload), *(digest(bulk.result())
                                                                                   for bulk in calls)))
    return rows


def print_bulk(rows: list[BulkRow], geometry: str, checks: Checks) -> None:
    print(f"## bulk throughput through the staging arenas, GB/s of payload (median call; {geometry}; host: the "
          "Python agent)")
    print(f"{'':16}{'C client':>12}{'Python client':>16}{'Python/C time':>16}")
    for row in rows:
        label = f"{row.op} {row.size // MIB} MiB"
        right = [checks.same(f"{label}, {client} client", row.expected, got, "what the call must deliver")
                 for client, got in (("C", row.c_got), ("Python", row.python_got))]
        ratio = f"{row.python / row.c:15.2f}x" if all(right) else f"{'WRONG':>16}"
        print(f"{label:16}{row.size / row.c / 1e9:12.2f}{row.size / row.python / 1e9:16.2f}{ratio}")


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
                native, native_echo = harness_rows(exe, path, str(n))
                floor = harness_rows(exe, "floor", str(n))[0]["floor"]
                wire_alone, alone_echo = native_host_rows(exe, n)
                lib = load(lib_path)
                with NativeChannel(lib, path) as channel:
                    channel.hello()
                    via_ctypes = {"echo": timed(lambda: channel.call(Op.ECHO, ECHO_REQUEST), n),
                                  "nop": timed(lambda: channel.call(Op.NOP), n)}
                with Region.open(path) as region, ClientChannel.claim(region) as py:
                    py.hello()
                    python = {"echo": timed(lambda: py.call(Op.ECHO, ECHO_REQUEST), n),
                              "nop": timed(lambda: py.call(Op.NOP), n)}
        finally:
            if server.pid:
                os.kill(server.pid, signal.SIGINT)
            server.join(10)
            os.unlink(path)
    checks = Checks()
    print_bulk(bulk, geometry, checks)
    if args.bulk_only:
        return checks.exit_status()
    print()
    print(f"## host-local round trip, {n} calls each, p50 / p99 in us (host: the Python agent)")
    want = ECHO_REQUEST.hex()  # each ECHO reply, as hex (or the failed status)
    ctypes_echo = first_wrong((reply.hex() if status == 0 else f"status {status}"
                               for status, reply in cast(list[tuple[int, bytes]], via_ctypes["echo"][2])), want)
    python_echo = first_wrong((bytes(r.payload).hex() if r.status == 0 else f"status {r.status}"
                               for r in cast(list[Record], python["echo"][2])), want)
    echo_right = all([checks.same(f"ECHO 8 B, {who}", want, got, "its request") for who, got in (
        ("C client", native_echo), ("C via ctypes", ctypes_echo), ("Python client", python_echo),
        ("C client with the minimal C host", alone_echo))])
    print(f"{'':22}{'C client':>18}{'C via ctypes':>18}{'Python client':>18}{'p50 Python/C':>14}")
    for name, label in (("echo", "ECHO 8 B"), ("nop", "NOP")):
        c, t, p = native[name], via_ctypes[name], python[name]
        ratio = f"{p[0] / c[0]:13.2f}x" if name == "nop" or echo_right else f"{'WRONG':>14}"
        print(f"{label:22}{c[0]:9.2f} /{c[1]:7.2f}{t[0]:9.2f} /{t[1]:7.2f}{p[0]:9.2f} /{p[1]:7.2f}{ratio}")
    print(f"{'floor (C word ping-pong)':22}{floor[0]:9.2f} /{floor[1]:7.2f}")
    for name, label in (("echo", "ECHO 8 B"), ("nop", "NOP")):
        w = wire_alone[name]
        print(f"{label + ', C host':22}{w[0]:9.2f} /{w[1]:7.2f}   (C client, minimal C host: the wire alone)")
    print("aim (issue 13): host-local round trip p50 <= 1 us")
    return checks.exit_status()


if __name__ == "__main__":
    sys.exit(main())
