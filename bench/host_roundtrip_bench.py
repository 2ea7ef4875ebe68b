#!/usr/bin/env python3
"""Host round-trip benchmark: the session worker's Python path next to its compiled hot path, in one run. Not a test.

Two parts, both printing medians / percentiles and ratios, no thresholds:

* in-process breakdown (on unless `--no-breakdown`): one session's host side over a real region in this
  process — a client Endpoint queues a record, the worker's stages run one by one: `Endpoint.receive`,
  `CudaExecutor.handle` (behind region_server's `_answer`), `Endpoint.send`; then the same record served by the
  compiled path (`HotPath.serve`), which does all three. The driver is tests.fake_driver.FakeDriver with its
  cuCtxSynchronize, cuStreamQuery and cuMemcpyHtoD/DtoH replaced by null functions (Python ones for the Python
  path, C ones for the compiled one), so the figures are the host's own cost, without the driver and without
  cuda-python's wrapper (the copies move no bytes).
* round trips through the real ring: a C client (guest_runtime/native/orion_wire.c, timing with clock_gettime:
  no Python on the client side) against a real RegionServer + session worker process, once with the worker's
  Python path (ORION_HOT_PATH=0) and once with the compiled path; NOP, cuCtxSynchronize, cuStreamQuery(0), and
  4-byte cuMemcpyHtoD and cuMemcpyDtoH into a 64-byte allocation.
  `--driver null` (default, any machine): the fake driver with null functions as above. `--driver real` (a GPU
  host): cuda.bindings.driver; the client retains device 0's primary context and makes it current first.

Run: `.venv/bin/python bench/host_roundtrip_bench.py [--driver real] [-n 50000]`.
"""
from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import multiprocessing
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.native_wire_bench import TIMING_C  # noqa: E402
from guest_runtime.native.build import SOURCE_DIR, find_compiler  # noqa: E402
from host_agent import hot_path  # noqa: E402
from host_agent.executor import CudaExecutor, ExecutorOptions  # noqa: E402
from host_agent.handler import Session  # noqa: E402
from host_agent.region_server import RegionServer, ServerOptions, _answer  # noqa: E402
from host_agent.stop import StopRequest  # noqa: E402
from ivshmem import layout  # noqa: E402
from ivshmem.channel import Endpoint  # noqa: E402
from ivshmem.driver_api import BY_OPCODE  # noqa: E402
from ivshmem.layout import Geometry  # noqa: E402
from ivshmem.record import Op  # noqa: E402
from ivshmem.region import Region  # noqa: E402
from tests.fake_driver import FakeDriver  # noqa: E402

MIB = 1 << 20
_MP = multiprocessing.get_context("fork")
OPCODES = {call.name: call.opcode for call in BY_OPCODE.values()}

NULL_FUNCTIONS = r"""
#include <stddef.h>
int orion_null0(void) { return 0; }
int orion_null1(void *handle) { (void)handle; return 0; }
int orion_null_htod(unsigned long long dst, const void *src, size_t n) { (void)dst; (void)src; (void)n; return 0; }
int orion_null_dtoh(void *dst, unsigned long long src, size_t n) { (void)dst; (void)src; (void)n; return 0; }
"""

CLIENT = TIMING_C + r"""
/* argv: PATH N OP_INIT OP_RETAIN OP_SETCURRENT OP_SYNC OP_QUERY OP_ALLOC OP_HTOD OP_DTOH */
int main(int argc, char **argv) {
    if (argc != 11) return 2;
    int n = atoi(argv[2]);
    unsigned op_init = atoi(argv[3]), op_retain = atoi(argv[4]), op_set = atoi(argv[5]), op_alloc = atoi(argv[8]);
    unsigned ops[5] = { 3u /* NOP */, (unsigned)atoi(argv[6]), (unsigned)atoi(argv[7]), (unsigned)atoi(argv[9]),
                        (unsigned)atoi(argv[10]) };
    const char *names[5] = { "nop", "cuCtxSynchronize", "cuStreamQuery", "htod-4B", "dtoh-4B" };
    long long *v = calloc(n, sizeof *v);
    char err[1024], rep[4096];
    orion_channel *ch;
    int32_t status; size_t got;
    if (orion_open(argv[1], &ch, err, sizeof err)) { fprintf(stderr, "%s\n", err); return 1; }
    if (orion_hello(ch, "", NULL)) { fprintf(stderr, "%s\n", orion_error(ch)); return 1; }
    unsigned zero = 0;
    unsigned long long context = 0, stream = 0;
    orion_call(ch, op_init, &zero, 4, &status, rep, sizeof rep, &got);
    if (status) { fprintf(stderr, "cuInit: %d\n", status); return 1; }
    orion_call(ch, op_retain, &zero, 4, &status, &context, sizeof context, &got);
    if (status) { fprintf(stderr, "cuDevicePrimaryCtxRetain: %d\n", status); return 1; }
    orion_call(ch, op_set, &context, 8, &status, rep, sizeof rep, &got);
    if (status) { fprintf(stderr, "cuCtxSetCurrent: %d\n", status); return 1; }
    unsigned long long size = 64, device = 0;
    orion_call(ch, op_alloc, &size, 8, &status, &device, sizeof device, &got);
    if (status) { fprintf(stderr, "cuMemAlloc: %d\n", status); return 1; }
    /* each request: the stream (cuStreamQuery), or device, size[, the 4 bytes] (the copies) */
    unsigned long long copy[3] = { device, 4, 0x01020304 };
    const void *req[5] = { &stream, &stream, &stream, copy, copy };
    size_t lens[5] = { 0, 0, 8, 20, 16 };
    for (int k = 0; k < 5; k++) {
        size_t len = lens[k];
        for (int i = 0; i < n / 10; i++) orion_call(ch, ops[k], req[k], len, &status, rep, sizeof rep, &got);
        for (int i = 0; i < n; i++) {
            long long t = ns();
            if (orion_call(ch, ops[k], req[k], len, &status, rep, sizeof rep, &got) || status) {
                fprintf(stderr, "%s: %s (status %d)\n", names[k], orion_error(ch), status);
                return 1;
            }
            v[i] = ns() - t;
        }
        qsort(v, n, sizeof *v, cmp);
        printf("%s %lld %lld\n", names[k], v[n / 2], v[(int)(n * 0.99)]);
    }
    orion_close(ch);
    return 0;
}
"""


def build(directory: Path) -> tuple[Path, Path]:
    """(the C client, the library of null driver functions), built with the system compiler."""
    compiler = find_compiler()
    if compiler is None:
        raise SystemExit("no C compiler: this benchmark needs one (and the compiled path does too)")
    (directory / "client.c").write_text(CLIENT)
    (directory / "null.c").write_text(NULL_FUNCTIONS)
    flags = ["-std=c11", "-O2", "-Wall", "-Wextra", f"-I{SOURCE_DIR}"]
    subprocess.run([*compiler, *flags, "-o", str(directory / "client"), str(directory / "client.c"),
                    str(SOURCE_DIR / "orion_wire.c"), "-lpthread"], check=True)
    subprocess.run([*compiler, *flags, "-fPIC", "-shared", "-o", str(directory / "null.so"),
                    str(directory / "null.c")], check=True)
    return directory / "client", directory / "null.so"


def null_executor(session: Session, null_library: Path) -> CudaExecutor:
    """A CudaExecutor over the fake driver whose cuCtxSynchronize and cuStreamQuery do nothing: in Python for
    the Python path, in C for the compiled one (the same work for both: none)."""
    fake = FakeDriver(devices=1)
    fake.cuInit(0)
    nothing = (0,)
    fake.cuCtxSynchronize = lambda: nothing  # type: ignore[method-assign]
    fake.cuStreamQuery = lambda stream: nothing  # type: ignore[method-assign]
    fake.cuMemcpyHtoD = lambda dst, src, size: nothing  # type: ignore[method-assign]
    fake.cuMemcpyDtoH = lambda dst, src, size: nothing  # type: ignore[method-assign]
    executor = CudaExecutor(session, driver=fake)
    library = ctypes.CDLL(str(null_library))
    executor.hot_functions = {  # type: ignore[attr-defined]
        "cuCtxSynchronize": ctypes.cast(library.orion_null0, ctypes.c_void_p).value,
        "cuStreamQuery": ctypes.cast(library.orion_null1, ctypes.c_void_p).value,
        "cuMemcpyHtoD": ctypes.cast(library.orion_null_htod, ctypes.c_void_p).value,
        "cuMemcpyDtoH": ctypes.cast(library.orion_null_dtoh, ctypes.c_void_p).value}
    return executor


# --- in-process breakdown ------------------------------------------------------------------------------------------
def breakdown(null_library: Path, n: int) -> None:
    path = f"/dev/shm/orion-bench-{uuid.uuid4().hex[:8]}"
    with open(path, "wb") as f:
        f.truncate(16 * MIB)
    region = Region.open(path)
    closing: list[hot_path.HotPath | None] = []
    try:
        region.format(Geometry.build(region.size, 1, name="bench"))
        client, host = Endpoint(region, 0, "client"), Endpoint(region, 0, "host")
        for side in (client, host):
            side.reset_owned()
            side.resync()
            side.generation = 1
        executor = null_executor(Session(1, path, 0, 1), null_library)
        clock = time.perf_counter_ns
        print("\n## in-process, one record (medians, µs): the worker's stages, then the compiled path doing all three")
        print(f"{'record':<18} {'receive':>8} {'handle':>8} {'send':>8} {'Python sum':>11} {'compiled':>9} "
              f"{'ratio':>6}")
        hot = hot_path.attach(host, executor)
        closing.append(hot)
        records = (("NOP", int(Op.NOP), b""), ("cuCtxSynchronize", OPCODES["cuCtxSynchronize"], b""),
                   ("cuStreamQuery(0)", OPCODES["cuStreamQuery"], bytes(8)))
        for label, opcode, payload in records:
            stages: list[list[int]] = [[], [], []]
            for _ in range(n):
                client.send(1, opcode, 0, payload)
                a = clock()
                record = host.receive()
                b = clock()
                reply = _answer(record, 1, executor, executor.session)  # type: ignore[arg-type]
                c = clock()
                host.send(record.call_id, 0, 0, reply.payload, reply.status)  # type: ignore[union-attr]
                d = clock()
                client.receive()
                for stage, value in zip(stages, (b - a, c - b, d - c), strict=True):
                    stage.append(value)
            medians = [statistics.median(s) / 1e3 for s in stages]
            compiled = float("nan")
            if hot is not None:
                times: list[int] = []
                for i in range(n + n // 10):  # the first tenth warms up
                    if i == n // 10:
                        times.clear()
                    client.send(1, opcode, 0, payload)
                    a = clock()
                    hot.dispatcher.serve(False)  # serves the record, then finds the ring empty
                    times.append(clock() - a)
                    client.receive()
                host.in_ring.resync()  # C moved the indices the Python endpoint keeps private copies of
                host.out_ring.resync()
                compiled = statistics.median(times) / 1e3
            total = sum(medians)
            print(f"{label:<18} {medians[0]:8.2f} {medians[1]:8.2f} {medians[2]:8.2f} {total:11.2f} {compiled:9.2f} "
                  f"{total / compiled:5.1f}x")
    finally:
        for hot in closing:
            if hot is not None:
                hot.close()
        region.close()
        os.unlink(path)


# --- round trips through a real worker -----------------------------------------------------------------------------
def _serve(path: str, driver: str, compiled: bool, null_library: str) -> None:
    import logging
    os.environ["ORION_HOT_PATH"] = "1" if compiled else "0"
    hot_path.reset()  # the benchmark's own process loaded it before forking this one
    logging.basicConfig(level=logging.INFO, format="    [worker] %(message)s")
    for name in ("host_agent.region_server", "host_agent.executor"):  # which path served: nothing else
        logging.getLogger(name).addFilter(lambda r: "hot path" in r.getMessage() or r.levelno >= logging.WARNING)

    def factory(session: Session) -> CudaExecutor:
        if driver == "real":
            return CudaExecutor(session, ExecutorOptions())
        return null_executor(session, Path(null_library))
    stop = StopRequest().on_signals()
    RegionServer(path, factory, ServerOptions(scan_interval=0.01), stop).serve_forever()


@contextlib.contextmanager
def served_region(size: int, serve: Callable[..., None], args: tuple[Any, ...]) -> Iterator[str]:
    """A fresh /dev/shm region of `size` bytes served by `serve(path, *args)` in a child process, once it serves;
    the child stopped (SIGINT) and the file removed afterwards."""
    path = f"/dev/shm/orion-bench-{uuid.uuid4().hex[:8]}"
    with open(path, "wb") as f:
        f.truncate(size)
    server = _MP.Process(target=serve, args=(path, *args))
    server.start()
    try:
        region = Region.open(path)
        deadline = time.monotonic() + 20
        while region.agent_words()[2] != layout.AGENT_SERVING or region.geometry is None:
            if time.monotonic() > deadline:
                raise SystemExit("the region server did not start")
            time.sleep(0.02)
        region.close()
        yield path
    finally:
        if server.pid:
            os.kill(server.pid, signal.SIGINT)
        server.join(10)
        os.unlink(path)


def round_trips(client: Path, null_library: Path, driver: str, compiled: bool,
                n: int) -> dict[str, tuple[float, float]]:
    with served_region(32 * MIB, _serve, (driver, compiled, str(null_library))) as path:
        opcodes = [str(OPCODES[name]) for name in ("cuInit", "cuDevicePrimaryCtxRetain", "cuCtxSetCurrent",
                                                   "cuCtxSynchronize", "cuStreamQuery", "cuMemAlloc", "cuMemcpyHtoD",
                                                   "cuMemcpyDtoH")]
        done = subprocess.run([str(client), path, str(n), *opcodes], capture_output=True, text=True, timeout=600,
                              check=False)
        if done.returncode:
            raise SystemExit(f"the C client failed: {done.stderr.strip()}")
        rows = {}
        for line in done.stdout.splitlines():
            name, p50, p99 = line.split()
            rows[name] = (int(p50) / 1e3, int(p99) / 1e3)
        return rows


NATIVE = r"""
import json, statistics, sys, time
from cuda.bindings import driver
n = int(sys.argv[1])
driver.cuInit(0)
err, dev = driver.cuDeviceGet(0)
err, ctx = driver.cuDevicePrimaryCtxRetain(dev)
driver.cuCtxSetCurrent(ctx)
err, device = driver.cuMemAlloc(64)
host = bytearray(4)
calls = {"cuCtxSynchronize": lambda: driver.cuCtxSynchronize(), "cuStreamQuery": lambda: driver.cuStreamQuery(0),
         "htod-4B": lambda: driver.cuMemcpyHtoD(device, host, 4),
         "dtoh-4B": lambda: driver.cuMemcpyDtoH(host, device, 4)}
out = {}
for name, call in calls.items():
    for _ in range(n // 10):
        call()
    times = []
    for _ in range(n):
        start = time.perf_counter_ns()
        call()
        times.append(time.perf_counter_ns() - start)
    out[name] = statistics.median(times) / 1e3
print(json.dumps(out))
"""


def native_p50(n: int) -> dict[str, float]:
    """The same calls made natively by a cuda-python program (its wrapper included), in a process of their own:
    CUDA must not be initialised in this one, which forks the agents."""
    done = subprocess.run([sys.executable, "-c", NATIVE, str(n)], capture_output=True, text=True, timeout=300,
                          check=False)
    if done.returncode:
        print(f"  (native run failed: {done.stderr.strip()[-300:]})")
        return {}
    return {name: float(value) for name, value in json.loads(done.stdout).items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=50000, help="round trips per row")
    parser.add_argument("--driver", choices=("null", "real"), default="null")
    parser.add_argument("--no-breakdown", action="store_true")
    parser.add_argument("--rounds", type=int, default=2, help="alternating Python/compiled rounds")
    args = parser.parse_args()
    print(f"# host round trips — {platform.node()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
          f"{time.strftime('%Y-%m-%d %H:%M')}, driver: {args.driver}")
    if hot_path.load() is None:
        raise SystemExit("the compiled hot path cannot be built here (see the log line above)")
    with tempfile.TemporaryDirectory() as directory:
        client, null_library = build(Path(directory))
        if not args.no_breakdown:
            breakdown(null_library, min(args.n, 20000))
        print("\n## round trips through the ring: C client, real worker process (p50 / p99, µs)")
        results: dict[bool, list[dict[str, tuple[float, float]]]] = {False: [], True: []}
        for _ in range(args.rounds):
            for compiled in (False, True):
                results[compiled].append(round_trips(client, null_library, args.driver, compiled, args.n))
        print(f"{'record':<18} {'Python p50':>10} {'p99':>7} {'compiled p50':>13} {'p99':>7} {'Python/compiled':>16}")
        for name in results[False][0]:
            python = [r[name] for r in results[False]]
            compiled_rows = [r[name] for r in results[True]]
            p50_py = statistics.median(p for p, _ in python)
            p50_c = statistics.median(p for p, _ in compiled_rows)
            print(f"{name:<18} {p50_py:10.2f} {max(q for _, q in python):7.2f} {p50_c:13.2f} "
                  f"{max(q for _, q in compiled_rows):7.2f} {p50_py / p50_c:15.1f}x")
        print("  (p50: median over rounds; p99: the worst round's)")
        if args.driver == "real":
            native = native_p50(args.n)
            print("\n## against the same calls made natively (cuda-python, its wrapper included; p50, µs)")
            for name, value in native.items():
                in_c = statistics.median(r[name][0] for r in results[True])
                in_python = statistics.median(r[name][0] for r in results[False])
                print(f"{name:<18} native {value:6.2f}   compiled {in_c:6.2f} ({in_c / value:4.2f}x)   "
                      f"Python {in_python:6.2f} ({in_python / value:4.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
