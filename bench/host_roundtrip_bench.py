#!/usr/bin/env python3
"""Host round-trip benchmark: the session worker's Python path next to its compiled hot path, in one run. Not a test.

Two parts, both printing medians / percentiles and ratios, no thresholds:

* in-process breakdown (on unless `--no-breakdown`): one session's host side over a real region in this
  process — a client Endpoint queues a record, the worker's stages run one by one: `Endpoint.receive`,
  `CudaExecutor.handle` (behind session_loop's `answer_record`), `Endpoint.send`; then the same record served by the
  compiled path (`HotPath.serve`), which does all three. The driver is tests.fake_driver.FakeDriver with its
  cuCtxSynchronize and cuStreamQuery replaced by null functions and cuMemcpyHtoD/DtoH by ones that only move the
  bytes to and from the fake's device memory (Python ones for the Python path, C ones for the compiled one), so
  the figures are the host's own cost, without the driver's and without cuda-python's wrapper.
* round trips through the real ring: a C client (guest_runtime/native/orion_wire.c, timing with clock_gettime:
  no Python on the client side) against a real RegionServer + session worker process, once with the worker's
  Python path (ORION_HOT_PATH=0) and once with the compiled path; NOP, cuCtxSynchronize, cuStreamQuery(0), and
  4-byte cuMemcpyHtoD and cuMemcpyDtoH into a 64-byte allocation.
  `--driver null` (default, any machine): the fake driver with null functions as above. `--driver real` (a GPU
  host): cuda.bindings.driver; the client retains device 0's primary context and makes it current first.
  The copies are checked (bench/verify.py): each run writes its own 4-byte value (never zero) and every timed read
  must deliver it (the C client compares each reply, untimed, and reports the first wrong one); with `--driver
  real`, the native program's reads too. The copy rows print a ratio only for right bytes; otherwise a WRONG
  RESULT line, and the exit status is 1. The other records carry no data.

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

from bench.native_wire_bench import TIMING_C, c_output  # noqa: E402
from bench.verify import Checks  # noqa: E402
from guest_runtime.native.build import SOURCE_DIR, build_driver, find_compiler, wire_sources, write_region_header  # noqa: E402
from host_agent.daemon.region_server import RegionServer  # noqa: E402
from host_agent.handler import Session  # noqa: E402
from host_agent.session import hot_path  # noqa: E402
from host_agent.session.executor import CudaExecutor, ExecutorOptions  # noqa: E402
from host_agent.session_loop import ServerOptions  # noqa: E402
from host_agent.session_loop import answer_record as _answer
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
COPY_ROWS = ("htod-4B", "dtoh-4B")  # the rows that move data: checked (the others carry none)
LIBRARY_COPY_ROWS = (*COPY_ROWS, "pinned-dtoh-4B")  # the driver-API client's (a write is checked by the reads)

NULL_FUNCTIONS = r"""
#include <stddef.h>
#include <string.h>
/* The fake driver's device memory (its allocations' bytearrays, told by orion_null_track): a copy moves its bytes
 * to or from there, so that what it delivers can be checked; anything else does nothing. */
#define SPANS 256
static struct { unsigned long long base, size; unsigned char *bytes; } spans[SPANS];
static int span_count;
void orion_null_track(unsigned long long base, unsigned long long size, unsigned char *bytes) {
    if (span_count < SPANS) {
        spans[span_count].base = base;
        spans[span_count].size = size;
        spans[span_count++].bytes = bytes;
    }
}
static unsigned char *device_at(unsigned long long address, size_t n) {
    for (int i = span_count - 1; i >= 0; i--)
        if (address >= spans[i].base && address + n <= spans[i].base + spans[i].size)
            return spans[i].bytes + (address - spans[i].base);
    return NULL;
}
int orion_null0(void) { return 0; }
int orion_null1(void *handle) { (void)handle; return 0; }
int orion_null_htod(unsigned long long dst, const void *src, size_t n) {
    unsigned char *at = device_at(dst, n);
    if (at == NULL) return 1;  /* CUDA_ERROR_INVALID_VALUE */
    memcpy(at, src, n);
    return 0;
}
int orion_null_dtoh(void *dst, unsigned long long src, size_t n) {
    unsigned char *at = device_at(src, n);
    if (at == NULL) return 1;
    memcpy(dst, at, n);
    return 0;
}
"""

CLIENT = TIMING_C + r"""
/* argv: PATH N OP_INIT OP_RETAIN OP_SETCURRENT OP_SYNC OP_QUERY OP_ALLOC OP_HTOD OP_DTOH VALUE
 * The 4-byte copies write VALUE (little-endian) and read it back: "bytes dtoh-4B HEX" says what the reads got. */
int main(int argc, char **argv) {
    if (argc != 12) return 2;
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
    unsigned long long copy[3] = { device, 4, strtoull(argv[11], NULL, 0) };
    const void *req[5] = { &stream, &stream, &stream, copy, copy };
    size_t lens[5] = { 0, 0, 8, 20, 16 };
    seen_t read_back = { "", 0 };
    for (int k = 0; k < 5; k++) {
        size_t len = lens[k];
        for (int i = 0; i < n / 10; i++) orion_call(ch, ops[k], req[k], len, &status, rep, sizeof rep, &got);
        for (int i = 0; i < n; i++) {
            memset(rep, 0, 4);  /* (untimed) a read that delivered nothing shows */
            got = 0;
            long long t = ns();
            if (orion_call(ch, ops[k], req[k], len, &status, rep, sizeof rep, &got) || status) {
                fprintf(stderr, "%s: %s (status %d)\n", names[k], orion_error(ch), status);
                return 1;
            }
            v[i] = ns() - t;
            if (k == 4) see_reply(&read_back, rep, got, &copy[2], 4, i == n - 1);
        }
        qsort(v, n, sizeof *v, cmp);
        printf("%s %lld %lld\n", names[k], v[n / 2], v[(int)(n * 0.99)]);
    }
    print_bytes("dtoh-4B", read_back.value);
    orion_close(ch);
    return 0;
}
"""


DRIVER_CLIENT = TIMING_C + r"""
#include <dlfcn.h>
/* argv: LIBRARY N VALUE LAUNCH. The same calls through a CUDA driver library's own API: the machine's libcuda.so.1
 * (native) or the native guest driver (ORION_SHM names the region), so that the two differ only in the library. */
typedef int (*fn)();
static fn get(void *lib, const char *name) {
    fn f = (fn)dlsym(lib, name);
    if (f == NULL) { fprintf(stderr, "the library has no %s\n", name); exit(1); }
    return f;
}
#define CHECK(call) do { int rc_ = (call); if (rc_) { fprintf(stderr, "%s: %d\n", #call, rc_); return 1; } } while (0)
static const char PTX[] = ".version 7.0\n.target sm_50\n.address_size 64\n.visible .entry empty()\n{\n ret;\n}\n";
int main(int argc, char **argv) {
    if (argc != 5) return 2;
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) { fprintf(stderr, "%s\n", dlerror()); return 1; }
    int n = atoi(argv[2]);
    unsigned value = (unsigned)strtoul(argv[3], NULL, 0), back = 0;
    int device;
    void *context, *module = NULL, *function = NULL;
    unsigned long long memory;
    unsigned char *pinned;
    CHECK(get(lib, "cuInit")(0));
    CHECK(get(lib, "cuDeviceGet")(&device, 0));
    CHECK(get(lib, "cuDevicePrimaryCtxRetain")(&context, device));
    CHECK(get(lib, "cuCtxSetCurrent")(context));
    CHECK(get(lib, "cuMemAlloc_v2")(&memory, (size_t)64));
    CHECK(get(lib, "cuMemAllocHost_v2")((void **)&pinned, (size_t)4096));
    fn sync = get(lib, "cuCtxSynchronize"), query = get(lib, "cuStreamQuery"), htod = get(lib, "cuMemcpyHtoD_v2"),
       dtoh = get(lib, "cuMemcpyDtoH_v2"), launch = get(lib, "cuLaunchKernel");
    /* LAUNCH 1: an empty kernel from PTX, launched and waited for (a real driver: the fake's launches are Python's) */
    int launches = atoi(argv[4]) && !get(lib, "cuModuleLoadData")(&module, PTX)
                   && !get(lib, "cuModuleGetFunction")(&function, module, "empty");
    long long *v = calloc(n, sizeof *v);
    seen_t read_back = { "", 0 }, pinned_back = { "", 0 };
    const char *names[6] = { "cuCtxSynchronize", "cuStreamQuery", "htod-4B", "dtoh-4B", "pinned-dtoh-4B",
                             "launch+sync" };
    for (int k = 0; k < (launches ? 6 : 5); k++) {
        for (int i = -n / 10; i < n; i++) {
            back = 0;
            memset(pinned, 0, 4);
            long long t = ns();
            int rc = k == 0 ? sync() : k == 1 ? query((void *)0) : k == 2 ? htod(memory, &value, (size_t)4)
                     : k == 3 ? dtoh(&back, memory, (size_t)4) : k == 4 ? dtoh(pinned, memory, (size_t)4)
                     : (launch(function, 1, 1, 1, 1, 1, 1, 0, (void *)0, (void *)0, (void *)0) || sync());
            long long took = ns() - t;
            if (rc) { fprintf(stderr, "%s: %d\n", names[k], rc); return 1; }
            if (i >= 0) v[i] = took;
            if (k == 3 && i >= 0) see_reply(&read_back, &back, 4, &value, 4, i == n - 1);
            if (k == 4 && i >= 0) see_reply(&pinned_back, pinned, 4, &value, 4, i == n - 1);
        }
        qsort(v, n, sizeof *v, cmp);
        printf("%s %lld %lld\n", names[k], v[n / 2], v[(int)(n * 0.99)]);
    }
    print_bytes("dtoh-4B", read_back.value);
    print_bytes("pinned-dtoh-4B", pinned_back.value);
    return 0;
}
"""


def build(directory: Path) -> tuple[Path, Path]:
    """(the C client, the library of null driver functions), built with the system compiler; the driver-API
    client (`driver_client`) and the native guest driver (`libcuda.so.1`) beside them."""
    compiler = find_compiler()
    if compiler is None:
        raise SystemExit("no C compiler: this benchmark needs one (and the compiled path does too)")
    (directory / "client.c").write_text(CLIENT)
    (directory / "null.c").write_text(NULL_FUNCTIONS)
    write_region_header(directory)  # orion_wire.c includes the generated orion_region.h
    flags = ["-std=c11", "-O2", "-Wall", "-Wextra", f"-I{SOURCE_DIR}", f"-I{directory}"]
    subprocess.run([*compiler, *flags, "-o", str(directory / "client"), str(directory / "client.c"),
                    *wire_sources(), "-lpthread"], check=True)
    subprocess.run([*compiler, *flags, "-fPIC", "-shared", "-o", str(directory / "null.so"),
                    str(directory / "null.c")], check=True)
    (directory / "driver_client.c").write_text(DRIVER_CLIENT)
    subprocess.run([*compiler, *flags, "-o", str(directory / "driver_client"), str(directory / "driver_client.c"),
                    "-ldl"], check=True)
    build_driver(directory / "guest" / "libcuda.so.1")
    return directory / "client", directory / "null.so"


def driver_round_trips(directory: Path, null_library: Path, driver: str, forwarded: bool, n: int,
                       value: int) -> tuple[dict[str, tuple[float, float]], dict[str, str]]:
    """The driver-API client's rows (name: p50, p99 in us) and what its reads delivered: through the native guest
    driver against a worker with the compiled path (`forwarded`), or through the machine's own libcuda.so.1."""
    client = [str(directory / "driver_client")]
    if not forwarded:
        done = subprocess.run([*client, "libcuda.so.1", str(n), str(value), "1"], capture_output=True, text=True,
                              timeout=600, check=False)
    else:
        with served_region(32 * MIB, _serve, (driver, True, str(null_library))) as path:
            env = {k: v for k, v in os.environ.items() if not k.startswith("ORION_")} | {"ORION_SHM": path}
            done = subprocess.run([*client, str(directory / "guest" / "libcuda.so.1"), str(n), str(value),
                                   str(int(driver == "real"))],
                                  capture_output=True, text=True, timeout=600, check=False, env=env)
    if done.returncode:
        raise SystemExit(f"the driver-API client failed ({'forwarded' if forwarded else 'native'}): "
                         f"{done.stderr.strip()[-500:]}")
    return c_output(done.stdout)


def null_executor(session: Session, null_library: Path) -> CudaExecutor:
    """A CudaExecutor over the fake driver whose cuCtxSynchronize and cuStreamQuery do nothing and whose
    cuMemcpyHtoD/DtoH only move their bytes to and from the fake's device memory (one memcpy, no checks of their
    own): in Python for the Python path, in C for the compiled one (the same work for both). The copies move
    bytes so that what they deliver can be checked."""
    fake = FakeDriver(devices=1)
    fake.cuInit(0)
    nothing, invalid = (0,), (1,)  # CUDA_SUCCESS, CUDA_ERROR_INVALID_VALUE
    library = ctypes.CDLL(str(null_library))
    allocate, span, tracked = fake.cuMemAlloc, fake._span, []

    def cu_mem_alloc(size: int) -> tuple[Any, ...]:
        result = allocate(size)
        if int(result[0]) == 0:  # the C copies get the allocation's bytes too (kept: they outlive any free)
            memory = fake.memory[int(result[1])]
            tracked.append((ctypes.c_ubyte * len(memory)).from_buffer(memory))
            library.orion_null_track(ctypes.c_ulonglong(int(result[1])), ctypes.c_ulonglong(len(memory)),
                                     tracked[-1])
        return result

    def htod(dst: int, src: Any, size: int) -> tuple[int]:
        found = span(dst, size)
        if found is None:
            return invalid
        memory, at = found
        memory[at:at + size] = ctypes.string_at(src, size) if isinstance(src, int) else memoryview(src)[:size]
        return nothing

    def dtoh(dst: Any, src: int, size: int) -> tuple[int]:
        found = span(src, size)
        if found is None:
            return invalid
        memory, at = found
        if isinstance(dst, int):
            ctypes.memmove(dst, bytes(memory[at:at + size]), size)
        else:
            memoryview(dst).cast("B")[:size] = memoryview(memory)[at:at + size]
        return nothing
    fake.cuCtxSynchronize = lambda: nothing  # type: ignore[method-assign]
    fake.cuStreamQuery = lambda stream: nothing  # type: ignore[method-assign]
    fake.cuMemAlloc = cu_mem_alloc  # type: ignore[method-assign]
    fake.cuMemcpyHtoD = htod  # type: ignore[method-assign,assignment]
    fake.cuMemcpyDtoH = dtoh  # type: ignore[method-assign,assignment]
    executor = CudaExecutor(session, driver=fake)
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
    for name in ("host_agent.daemon.region_server", "host_agent.session.executor"):  # which path served: nothing else
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


def copy_value(i: int) -> int:
    """The 4 bytes the small copies of run `i` write and read back: never zero, different in every run (a read
    of device memory that an earlier run left holds another value)."""
    return (0x9E3779B9 * (i + 1)) & 0xFFFFFFFF


def copy_bytes(value: int) -> str:
    """What a 4-byte read of `value` must deliver, as the C client reports it (hex)."""
    return value.to_bytes(4, "little").hex()


def round_trips(client: Path, null_library: Path, driver: str, compiled: bool,
                n: int, value: int) -> tuple[dict[str, tuple[float, float]], dict[str, str]]:
    """The C client's rows (name: p50, p99 in us) and what its reads delivered (c_output), its copies writing
    `value`."""
    with served_region(32 * MIB, _serve, (driver, compiled, str(null_library))) as path:
        opcodes = [str(OPCODES[name]) for name in ("cuInit", "cuDevicePrimaryCtxRetain", "cuCtxSetCurrent",
                                                   "cuCtxSynchronize", "cuStreamQuery", "cuMemAlloc", "cuMemcpyHtoD",
                                                   "cuMemcpyDtoH")]
        done = subprocess.run([str(client), path, str(n), *opcodes, str(value)], capture_output=True, text=True,
                              timeout=600, check=False)
        if done.returncode:
            raise SystemExit(f"the C client failed: {done.stderr.strip()}")
        return c_output(done.stdout)


NATIVE = r"""
import json, statistics, sys, time
from cuda.bindings import driver
n = int(sys.argv[1])
driver.cuInit(0)
err, dev = driver.cuDeviceGet(0)
err, ctx = driver.cuDevicePrimaryCtxRetain(dev)
driver.cuCtxSetCurrent(ctx)
err, device = driver.cuMemAlloc(64)
host, back = bytearray(int(sys.argv[2]).to_bytes(4, "little")), bytearray(4)  # back: what the reads deliver
calls = {"cuCtxSynchronize": lambda: driver.cuCtxSynchronize(), "cuStreamQuery": lambda: driver.cuStreamQuery(0),
         "htod-4B": lambda: driver.cuMemcpyHtoD(device, host, 4),
         "dtoh-4B": lambda: driver.cuMemcpyDtoH(back, device, 4)}
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
print(json.dumps({"p50": out, "dtoh-4B": back.hex()}))
"""


def native_p50(n: int, value: int) -> tuple[dict[str, float], str]:
    """The same calls made natively by a cuda-python program (its wrapper included), in a process of their own
    (CUDA must not be initialised in this one, which forks the agents): p50s, and what its reads delivered."""
    done = subprocess.run([sys.executable, "-c", NATIVE, str(n), str(value)], capture_output=True, text=True,
                          timeout=300, check=False)
    if done.returncode:
        print(f"  (native run failed: {done.stderr.strip()[-300:]})")
        return {}, ""
    result = json.loads(done.stdout)
    return {name: float(value) for name, value in result["p50"].items()}, result["dtoh-4B"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=50000, help="round trips per row")
    parser.add_argument("--driver", choices=("null", "real"), default="null")
    parser.add_argument("--no-breakdown", action="store_true")
    parser.add_argument("--rounds", type=int, default=2, help="alternating Python/compiled rounds")
    args = parser.parse_args()
    checks = Checks()
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
        copies_right = True  # every run's reads delivered what its writes wrote
        for round_ in range(args.rounds):
            for compiled in (False, True):
                value = copy_value(2 * round_ + compiled)
                rows, delivered = round_trips(client, null_library, args.driver, compiled, args.n, value)
                results[compiled].append(rows)
                copies_right &= checks.same(f"4-byte copies, {'compiled' if compiled else 'Python'} path, round "
                                            f"{round_ + 1}", copy_bytes(value), delivered.get("dtoh-4B"),
                                            "what cuMemcpyHtoD wrote")
        print(f"{'record':<18} {'Python p50':>10} {'p99':>7} {'compiled p50':>13} {'p99':>7} {'Python/compiled':>16}")
        for name in results[False][0]:
            python = [r[name] for r in results[False]]
            compiled_rows = [r[name] for r in results[True]]
            p50_py = statistics.median(p for p, _ in python)
            p50_c = statistics.median(p for p, _ in compiled_rows)
            right = copies_right or name not in COPY_ROWS
            print(f"{name:<18} {p50_py:10.2f} {max(q for _, q in python):7.2f} {p50_c:13.2f} "
                  f"{max(q for _, q in compiled_rows):7.2f} "
                  f"{f'{p50_py / p50_c:15.1f}x' if right else 'WRONG':>16}")
        print("  (p50: median over rounds; p99: the worst round's)")
        if args.driver == "real":
            value = copy_value(2 * args.rounds)
            native, native_read = native_p50(args.n, value)
            native_right = checks.same("4-byte copies, native", copy_bytes(value), native_read,
                                       "what cuMemcpyHtoD wrote")
            print("\n## against the same calls made natively (cuda-python, its wrapper included; p50, µs)")
            for name, native_us in native.items():
                in_c = statistics.median(r[name][0] for r in results[True])
                in_python = statistics.median(r[name][0] for r in results[False])
                if name in COPY_ROWS and not (copies_right and native_right):
                    print(f"{name:<18} native {native_us:6.2f}   compiled {in_c:6.2f} (WRONG)   "
                          f"Python {in_python:6.2f} (WRONG)")
                    continue
                print(f"{name:<18} native {native_us:6.2f}   compiled {in_c:6.2f} ({in_c / native_us:4.2f}x)   "
                      f"Python {in_python:6.2f} ({in_python / native_us:4.2f}x)")
        library_rows(Path(directory), null_library, args, checks)
    return checks.exit_status()


def library_rows(directory: Path, null_library: Path, args: argparse.Namespace, checks: Checks) -> None:
    """The same calls made by a C program through a driver library's API: the native guest driver (libcuda.so.1,
    the compiled path behind it), and with `--driver real` the machine's own driver, alternating. No Python wrapper
    on either side, so the ratio is the guest driver's and the wire's cost alone."""
    print("\n## through a driver library's API: C client, the native guest driver against the compiled path "
          "(p50 / p99, µs)")
    sides = (True, False) if args.driver == "real" else (True,)
    runs: dict[bool, list[dict[str, tuple[float, float]]]] = {side: [] for side in sides}
    right = True
    for round_ in range(args.rounds):
        for forwarded in sides:
            value = copy_value(100 + 2 * round_ + forwarded)
            rows, delivered = driver_round_trips(directory, null_library, args.driver, forwarded, args.n, value)
            runs[forwarded].append(rows)
            for row in ("dtoh-4B", "pinned-dtoh-4B"):
                right &= checks.same(f"{row} through the {'guest' if forwarded else 'native'} driver, round "
                                     f"{round_ + 1}", copy_bytes(value), delivered.get(row), "what cuMemcpyHtoD wrote")
    print(f"{'call':<18} {'guest p50':>9} {'p99':>7}" + (f" {'native p50':>10} {'p99':>7} {'guest/native':>13}"
                                                       if args.driver == "real" else ""))
    for name in runs[True][0]:
        p50 = statistics.median(r[name][0] for r in runs[True])
        line = f"{name:<18} {p50:9.2f} {max(r[name][1] for r in runs[True]):7.2f}"
        if args.driver == "real" and all(name in r for r in runs[False]):
            native = statistics.median(r[name][0] for r in runs[False])
            ratio = f"{p50 / native:12.2f}x" if right or name not in LIBRARY_COPY_ROWS else "WRONG"
            line += f" {native:10.2f} {max(r[name][1] for r in runs[False]):7.2f} {ratio:>13}"
        print(line)
    print("  (p50: median over rounds; p99: the worst round's)")


if __name__ == "__main__":
    sys.exit(main())
