#!/usr/bin/env python3
"""Relayed sessions without a GPU: where a synchronous relayed call's time goes, on any machine. Not a test.

The same C client (guest_runtime/native/orion_wire.c, timed with clock_gettime: no Python on the guest side) runs
against two host sides over the fake driver whose hot calls do nothing but move a copy's bytes (null_executor):
- local: a RegionServer whose session worker serves the region itself (compiled hot path where it builds);
- relayed: a RegionServer relaying every session (`[server-relay] remote_addr`) over TCP loopback to a relay
  listener whose workers run the same null executor: the relaying worker, the frames, the GPU host's worker.
The baseline, measured in the same run: a raw 32-byte TCP ping-pong between two Python processes and a 256 MiB
stream (bench/relay_bench.raw_baseline, the H100 benchmark's), and a ping-pong between two C threads' sockets
(what a round trip costs without Python). Printed: p50/p99 per call, relayed - local, that against the raw round
trips, and bulk copies (the stand-in driver's copies are one memcpy each: the figures are the wire's and the
relay's) against the raw stream.
The copies are checked (bench/verify.py): the stand-in driver keeps a copy's bytes (null_executor), each round
writes its own 4-byte value and its own bulk bytes, and every timed read must deliver what the writes wrote, the
relayed reads also what the local ones delivered (the C client compares each read, untimed, into a buffer cleared
before it). A copy row prints its ratios only for right bytes; otherwise a WRONG RESULT line, and the exit status is
1. The other calls carry no data.

Run: `.venv/bin/python bench/relay_local_bench.py [-n 20000] [--bulk-mib 64]`.
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.host_roundtrip_bench import build as build_null  # noqa: E402
from bench.host_roundtrip_bench import copy_bytes, copy_value, null_executor, served_region  # noqa: E402
from bench.native_wire_bench import TIMING_C, c_output  # noqa: E402
from bench.relay_bench import raw_baseline  # noqa: E402
from bench.verify import Checks  # noqa: E402
from guest_runtime.native.build import SOURCE_DIR, find_compiler, wire_sources, write_region_header  # noqa: E402
from host_agent.daemon.region_server import RegionServer  # noqa: E402
from host_agent.handler import Session  # noqa: E402
from host_agent.relay.route import RelayRoute  # noqa: E402
from host_agent.session.executor import CudaExecutor  # noqa: E402
from host_agent.session_loop import ServerOptions  # noqa: E402
from host_agent.stop import StopRequest  # noqa: E402
from ivshmem.driver_api import BY_OPCODE  # noqa: E402
from tests.cluster_key import key_file  # noqa: E402
from tests.fake_driver import FakeDriver  # noqa: E402
from tests.relay_peer import start_listener  # noqa: E402

MIB = 1 << 20
_MP = multiprocessing.get_context("fork")
OPCODES = {call.name: call.opcode for call in BY_OPCODE.values()}
CALLS = ("cuInit", "cuDevicePrimaryCtxRetain", "cuCtxSetCurrent", "cuCtxSynchronize", "cuStreamQuery", "cuMemAlloc",
         "cuMemcpyHtoD", "cuMemcpyDtoH")

# argv: PATH N BULK_BYTES then the opcodes of CALLS, then VALUE. Prints "name p50_ns p99_ns" per row, bulk rows as
# the median ns of one copy; any status but 0 is a failure (exit 1, the call named). The copies are checked: the
# 4-byte ones write VALUE and read it back, the bulk ones write a sequence drawn from VALUE and read it back into a
# buffer cleared before each read; "bytes dtoh-4B|bulk-dtoh V" is what the reads delivered (the first wrong one,
# else the last), "bytes bulk-source V" what the bulk writes sent (bench/native_wire_bench.py's TIMING_C).
CLIENT = TIMING_C + r"""
static int fail(orion_channel *ch, const char *what, int32_t status) {
    fprintf(stderr, "%s: %s (status %d)\n", what, orion_error(ch), status);
    return 1;
}
int main(int argc, char **argv) {
    if (argc != 13) return 2;
    int n = atoi(argv[2]);
    size_t bulk = strtoull(argv[3], NULL, 10);
    unsigned op[8];
    for (int i = 0; i < 8; i++) op[i] = (unsigned)atoi(argv[4 + i]);
    long long *v = calloc(n, sizeof *v);
    char err[1024], rep[4096];
    orion_channel *ch;
    int32_t status; size_t got;
    if (orion_open(argv[1], &ch, err, sizeof err)) { fprintf(stderr, "%s\n", err); return 1; }
    if (orion_hello(ch, "", NULL)) { fprintf(stderr, "%s\n", orion_error(ch)); return 1; }
    unsigned zero = 0;
    unsigned long long context = 0, stream = 0, device = 0, big = 0, size = 64;
    if (orion_call(ch, op[0], &zero, 4, &status, rep, sizeof rep, &got) || status) return fail(ch, "cuInit", status);
    if (orion_call(ch, op[1], &zero, 4, &status, &context, 8, &got) || status) return fail(ch, "retain", status);
    if (orion_call(ch, op[2], &context, 8, &status, rep, sizeof rep, &got) || status) return fail(ch, "set", status);
    if (orion_call(ch, op[5], &size, 8, &status, &device, 8, &got) || status) return fail(ch, "cuMemAlloc", status);
    if (orion_call(ch, op[5], &bulk, 8, &status, &big, 8, &got) || status) return fail(ch, "cuMemAlloc", status);
    unsigned long long value = strtoull(argv[12], NULL, 0);
    unsigned long long copy[3] = { device, 4, value };
    seen_t small = { "", 0 }, large = { "", 0 };
    struct { const char *name; unsigned opcode; const void *req; size_t len; } rows[5] = {
        { "nop", 3u, NULL, 0 }, { "cuCtxSynchronize", op[3], NULL, 0 }, { "cuStreamQuery", op[4], &stream, 8 },
        { "htod-4B", op[6], copy, 20 }, { "dtoh-4B", op[7], copy, 16 } };
    for (int k = 0; k < 5; k++) {
        for (int i = 0; i < n / 10; i++)
            orion_call(ch, rows[k].opcode, rows[k].req, rows[k].len, &status, rep, sizeof rep, &got);
        for (int i = 0; i < n; i++) {
            memset(rep, 0, 4);  /* (untimed) a read that delivered nothing shows */
            got = 0;
            long long t = ns();
            if (orion_call(ch, rows[k].opcode, rows[k].req, rows[k].len, &status, rep, sizeof rep, &got) || status)
                return fail(ch, rows[k].name, status);
            v[i] = ns() - t;
            if (k == 4) see_reply(&small, rep, got, &value, 4, i == n - 1);
        }
        qsort(v, n, sizeof *v, cmp);
        printf("%s %lld %lld\n", rows[k].name, v[n / 2], v[(int)(n * 0.99)]);
    }
    print_bytes("dtoh-4B", small.value);
    unsigned char *data = malloc(bulk), *back = malloc(bulk);
    unsigned long long x = value | 1;  /* xorshift64: never all zeros, not periodic */
    for (size_t i = 0; i < bulk; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        data[i] = (unsigned char)(x >> 32);
    }
    unsigned long long head[2] = { big, bulk };
    struct orion_piece htod[2] = { { head, 16 }, { data, bulk } };
    long long t[5];
    for (int i = 0; i < 5; i++) {
        long long s = ns();
        if (orion_callv(ch, op[6], htod, 2, &status, rep, sizeof rep, NULL, 0, &got) || status)
            return fail(ch, "bulk HtoD", status);
        t[i] = ns() - s;
    }
    qsort(t, 5, sizeof t[0], cmp);
    printf("bulk-htod %lld %lld\n", t[2], t[4]);
    for (int i = 0; i < 5; i++) {
        memset(back, 0, bulk);  /* (untimed) a read that delivered nothing shows */
        long long s = ns();
        if (orion_callv(ch, op[7], (struct orion_piece[]){ { head, 16 } }, 1, &status, back, bulk, NULL, 0, &got)
            || status || got != bulk)
            return fail(ch, "bulk DtoH", status);
        t[i] = ns() - s;
        see_reply(&large, back, got, data, bulk, i == 4);
    }
    qsort(t, 5, sizeof t[0], cmp);
    printf("bulk-dtoh %lld %lld\n", t[2], t[4]);
    char source[40];
    describe_bytes(source, data, bulk);
    print_bytes("bulk-source", source);
    print_bytes("bulk-dtoh", large.value);
    orion_close(ch);
    return 0;
}
"""

# Two threads, each with one end of a loopback TCP connection, ping-ponging 32 bytes: the round trip with no Python.
RAW_C = TIMING_C + r"""
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>
static int n;
static void *echo(void *arg) {
    int fd = *(int *)arg; char b[32];
    for (int i = 0; i < n; i++) { if (recv(fd, b, 32, MSG_WAITALL) != 32 || send(fd, b, 32, 0) != 32) break; }
    return NULL;
}
int main(int argc, char **argv) {
    n = atoi(argv[1]);
    int one = 1, l = socket(AF_INET, SOCK_STREAM, 0), c = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t len = sizeof a;
    bind(l, (struct sockaddr *)&a, sizeof a); listen(l, 1); getsockname(l, (struct sockaddr *)&a, &len);
    connect(c, (struct sockaddr *)&a, sizeof a);
    int s = accept(l, NULL, NULL);
    setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    pthread_t th; pthread_create(&th, NULL, echo, &s);
    long long *v = calloc(n, sizeof *v); char b[32] = {0};
    for (int i = 0; i < n; i++) {
        long long t = ns();
        if (send(c, b, 32, 0) != 32 || recv(c, b, 32, MSG_WAITALL) != 32) return 1;
        v[i] = ns() - t;
    }
    pthread_join(th, NULL);
    qsort(v, n, sizeof *v, cmp);
    printf("%lld %lld\n", v[n / 2], v[(int)(n * 0.99)]);
    return 0;
}
"""


def build(directory: Path) -> tuple[Path, Path, Path]:
    """(the C client, the raw C ping-pong, the null driver functions), built with the system compiler."""
    compiler = find_compiler()
    if compiler is None:
        raise SystemExit("no C compiler: this benchmark needs one")
    _client, null_library = build_null(directory)
    (directory / "relay_client.c").write_text(CLIENT)
    (directory / "raw.c").write_text(RAW_C)
    write_region_header(directory)  # orion_wire.c includes the generated orion_region.h
    flags = ["-std=gnu11", "-O2", f"-I{SOURCE_DIR}", f"-I{directory}"]
    subprocess.run([*compiler, *flags, "-o", str(directory / "relay_client"), str(directory / "relay_client.c"),
                    *wire_sources(), "-lpthread"], check=True)
    subprocess.run([*compiler, *flags, "-o", str(directory / "raw"), str(directory / "raw.c"), "-lpthread"],
                   check=True)
    return directory / "relay_client", directory / "raw", null_library


def _serve(path: str, null_library: str, relay_to: str) -> None:
    """A region server over the null executor: serving its sessions, or relaying them to `relay_to`."""
    stop = StopRequest().on_signals()
    options = ServerOptions(scan_interval=0.01)
    if relay_to:
        options.relay = RelayRoute(fixed=relay_to, key_file=key_file())  # the key start_listener's listener holds

        def factory(session: Session) -> CudaExecutor:  # the relaying side's own: HELLO and the pool only
            driver = FakeDriver(devices=1)
            driver.cuInit(0)
            return CudaExecutor(session, driver=driver)
    else:
        factory = lambda session: null_executor(session, Path(null_library))  # noqa: E731
    RegionServer(path, factory, options, stop).serve_forever()


def round_trips(client: Path, null_library: Path, n: int, bulk: int, relay_to: str,
                value: int) -> tuple[dict[str, tuple[float, float]], dict[str, str]]:
    """The C client's rows (name: p50, p99 in us) and what its copies delivered (c_output), writing `value`."""
    with served_region(64 * MIB, _serve, (str(null_library), relay_to)) as path:
        done = subprocess.run([str(client), path, str(n), str(bulk), *(str(OPCODES[c]) for c in CALLS), str(value)],
                              capture_output=True, text=True, timeout=600, check=False)
        if done.returncode:
            raise SystemExit(f"the C client failed ({'relayed' if relay_to else 'local'}): {done.stderr.strip()}")
        return c_output(done.stdout)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=20000, help="round trips per row")
    parser.add_argument("--bulk-mib", type=int, default=64, help="size of the bulk copies")
    parser.add_argument("--rounds", type=int, default=2, help="alternating local/relayed rounds")
    args = parser.parse_args()
    print(f"# relayed vs local, fake driver — {platform.node()}, {os.cpu_count()} CPUs, Python "
          f"{platform.python_version()}, {time.strftime('%Y-%m-%d %H:%M')}")
    bulk = args.bulk_mib * MIB
    with tempfile.TemporaryDirectory() as directory:
        client, raw_c, null_library = build(Path(directory))

        def gpu_host(session: Session) -> CudaExecutor:
            return null_executor(session, null_library)
        listener, port = start_listener(gpu_host)
        try:
            raw = raw_baseline()
            results: dict[str, list[dict[str, tuple[float, float]]]] = {"local": [], "relayed": []}
            delivered: dict[str, list[dict[str, str]]] = {"local": [], "relayed": []}
            for round_ in range(args.rounds):
                value = copy_value(round_)  # both sides the same bytes: the relayed reads must match the local ones
                for side, relay_to in (("local", ""), ("relayed", f"127.0.0.1:{port}")):
                    rows, got = round_trips(client, null_library, args.n, bulk, relay_to, value)
                    results[side].append(rows)
                    delivered[side].append(got | {"dtoh-4B expected": copy_bytes(value)})
            c_rtt = [int(x) / 1e3 for x in subprocess.run([str(raw_c), str(args.n)], capture_output=True, text=True,
                                                          check=True).stdout.split()]
        finally:
            listener.terminate()
            listener.join(10)
    rtt, stream = raw["round trip us"], raw["stream GB/s"]
    checks = Checks()
    right = {"dtoh-4B": True, "bulk-dtoh": True}  # per kind of copy: every run's reads delivered what they must
    for round_, (local_got, relayed_got) in enumerate(zip(delivered["local"], delivered["relayed"], strict=True), 1):
        for side, got in (("local", local_got), ("relayed", relayed_got)):
            right["dtoh-4B"] &= checks.same(f"4-byte copies, {side}, round {round_}", got["dtoh-4B expected"],
                                            got.get("dtoh-4B"), "what cuMemcpyHtoD wrote")
            right["bulk-dtoh"] &= checks.same(f"bulk copies, {side}, round {round_}", got.get("bulk-source"),
                                              got.get("bulk-dtoh"), "what cuMemcpyHtoD wrote")
        right["bulk-dtoh"] &= checks.same(f"bulk copies, relayed against local, round {round_}",
                                          local_got.get("bulk-dtoh"), relayed_got.get("bulk-dtoh"), "local")
    right["htod-4B"] = right["dtoh-4B"]  # a read delivers what the write left: both rows stand or fall together
    right["bulk-htod"] = right["bulk-dtoh"]
    if (os.cpu_count() or 1) < 6:
        print("# NOTE: fewer CPUs than the guest's, the pump's and the GPU host's spinning processes need: the relayed "
              "latencies below measure the scheduler's time slices, not the relay")
    print(f"# raw loopback: Python ping-pong {rtt:.2f} us, C ping-pong {c_rtt[0]:.2f} us (p99 {c_rtt[1]:.2f}), "
          f"Python stream {stream:.2f} GB/s")
    print(f"{'call':<18} {'local p50':>9} {'p99':>7} {'relayed p50':>11} {'p99':>8} {'rel-local':>9} "
          f"{'/ Py RTT':>8} {'/ C RTT':>8}")

    def p50(side: str, name: str) -> float:
        return statistics.median(r[name][0] for r in results[side])

    def p99(side: str, name: str) -> float:
        return max(r[name][1] for r in results[side])
    for name in results["local"][0]:
        if name.startswith("bulk"):
            continue
        local, relayed = p50("local", name), p50("relayed", name)
        extra = relayed - local
        ratios = f"{extra / rtt:8.2f} {extra / c_rtt[0]:8.2f}" if right.get(name, True) else \
             f"{'WRONG':>8} {'WRONG':>8}"
        print(f"{name:<18} {local:9.2f} {p99('local', name):7.2f} {relayed:11.2f} {p99('relayed', name):8.2f} "
              f"{extra:9.2f} {ratios}")
    print(f"(aim: rel-local <= 1 raw round trip, i.e. '/ Py RTT' <= 1)\n{'bulk ' + str(args.bulk_mib) + ' MiB':<18} "
          f"{'local GB/s':>10} {'relayed GB/s':>13} {'relayed / raw stream':>21}")
    for name in ("bulk-htod", "bulk-dtoh"):
        local, relayed = bulk / p50("local", name) / 1e3, bulk / p50("relayed", name) / 1e3
        ratio = f"{relayed / stream:21.2f}" if right[name] else f"{'WRONG':>21}"
        print(f"{name:<18} {local:10.2f} {relayed:13.2f} {ratio}")
    print("(aim: relayed / raw stream >= 0.8)")
    return checks.exit_status()


if __name__ == "__main__":
    sys.exit(main())
