#!/usr/bin/env python3
"""Wire benchmark: ring round trip, staged bulk throughput against memcpy, idle cost. Not a test.

Everything is measured in one run, with baselines taken in the same run:
* round trip: a client process and a real session worker process exchanging NOP records (p50/p99), next to
  the floor of two Python processes ping-ponging one shared word;
* bulk: payloads streamed through the staging arena to the host (the worker copies each chunk into a
  destination buffer, as a host-to-device copy would) and back (the worker copies from a source buffer into
  the chunks, as a device-to-host copy would, and the client copies them out), as a ratio to one plain
  memcpy of the same bytes between two buffers of this process. The results are checked (bench/verify.py): every
  timed transfer's status, and after the timed transfers, the worker's destination (its digest, asked for after
  the timing) and the client's buffer, both cleared before the first transfer, must hold the bytes the memcpy
  baseline's destination holds, a non-periodic pattern; a ratio is printed only for right bytes (otherwise a WRONG
  RESULT line, and the exit status is 1);
* idle: CPU used by a session worker whose client is attached but silent, in % of one core.
The round trips carry no data (NOP records): nothing to check.

Run: `.venv/bin/python bench/wire_bench.py` (or `make bench`).
"""
from __future__ import annotations

import argparse
import mmap
import multiprocessing
import os
import platform
import signal
import statistics
import sys
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.verify import Checks, digest, pattern  # noqa: E402
from host_agent.daemon.region_server import serve  # noqa: E402
from host_agent.handler import Reply, Session  # noqa: E402
from host_agent.session_loop import ServerOptions  # noqa: E402
from ivshmem import ClientChannel, Op, Region, Streamed, layout  # noqa: E402
from ivshmem.channel import BufferCursor, Ctrl, HostChannel, Sink  # noqa: E402
from ivshmem.codec import Schema  # noqa: E402

MIB = 1 << 20
TO_HOST, FROM_HOST, TAKE_DIGEST = 0x80, 0x81, 0x82
FROM_HOST_REQUEST = Schema("bench from-host", ("length", "u64"))
DIGEST_REQUEST = Schema("bench digest", ("length", "u64"))
_MP = multiprocessing.get_context("fork")


class CopyHandler:
    """Moves bytes as the CUDA executor's copies will: chunk -> destination, source -> chunk; and, untimed, tells
    the digest of what a transfer to the host left in the destination, clearing it for the next one."""

    def __init__(self, session: Session) -> None:
        self.source = bytearray(pattern(256 * MIB))
        self.destination = bytearray(len(self.source))
        self.destination[:] = self.source  # its pages touched before any timing

    def sink_for(self, opcode: int, length: int) -> Sink | None:
        return BufferCursor(self.destination).sink if opcode == TO_HOST else None

    def handle(self, record):  # type: ignore[no-untyped-def]
        if record.opcode == Op.NOP:
            return Reply(0)
        if record.opcode == TO_HOST:
            return Reply(0)
        if record.opcode == FROM_HOST:
            (length,) = FROM_HOST_REQUEST.decode(record.payload)
            return Reply(0, Streamed(length, BufferCursor(self.source).fill))
        if record.opcode == TAKE_DIGEST:
            (length,) = DIGEST_REQUEST.decode(record.payload)
            taken = digest(memoryview(self.destination)[:length])
            self.destination[:length] = bytes(length)
            return Reply(0, taken.encode())
        return Reply(-2)


def _serve(path: str) -> None:
    serve(path, CopyHandler, ServerOptions(channels=4))


def floor_round_trip(n: int) -> list[int]:
    """Two Python processes ping-ponging one shared word: the least a Python round trip can cost here."""
    mm = mmap.mmap(-1, 4096)
    words = memoryview(mm).cast("I")
    pid = os.fork()
    if pid == 0:
        for i in range(1, n + 1):
            while words[0] != i:
                pass
            words[16] = i
        os._exit(0)
    out = []
    clock = time.perf_counter_ns
    for i in range(1, n + 1):
        start = clock()
        words[0] = i
        while words[16] != i:
            pass
        out.append(clock() - start)
    os.waitpid(pid, 0)
    return sorted(out)


def pct(values: list[int], q: float) -> float:
    return values[min(len(values) - 1, int(len(values) * q))] / 1e3


def memcpy_seconds(source: bytes, repeats: int) -> tuple[float, str]:
    """The median time of one memcpy of `source` into a buffer of this process, and the digest of what that
    buffer holds then (the baseline's result, which every staged transfer of the same bytes must match)."""
    dst = bytearray(len(source))
    s, d = memoryview(source), memoryview(dst)
    d[:] = s  # fault the pages in first
    best = []
    for _ in range(repeats):
        start = time.perf_counter()
        d[:] = s
        best.append(time.perf_counter() - start)
    return statistics.median(best), digest(dst)


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--round-trips", type=int, default=50000)
    parser.add_argument("--sizes", default="1,8,64,256", help="bulk sizes in MiB")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--region-mib", type=int, default=128)
    parser.add_argument("--idle-seconds", type=float, default=5.0)
    args = parser.parse_args()
    checks = Checks()

    path = f"/dev/shm/orion-bench-{uuid.uuid4().hex[:8]}"
    with open(path, "wb") as f:
        f.truncate(args.region_mib * MIB)
    server = _MP.Process(target=_serve, args=(path,))
    server.start()
    try:
        deadline = time.monotonic() + 10
        region = Region.open(path)
        while region.agent_words()[2] != layout.AGENT_SERVING or region.geometry is None:
            if time.monotonic() > deadline:
                raise SystemExit("the region server did not start")
            time.sleep(0.05)
        g = region.geometry
        print(f"# wire benchmark — {platform.node()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
              f"{time.strftime('%Y-%m-%d %H:%M')}")
        print(f"# region {args.region_mib} MiB, {g.channel_count} channels, {g.ring_entries} slots of "
              f"{g.slot_size} B, staging {g.chunk_count} x {g.chunk_size // 1024} KiB per direction")
        with ClientChannel.claim(region) as channel:
            for _ in range(2000):
                channel.call(Op.NOP)
            clock = time.perf_counter_ns
            lat = []
            for _ in range(args.round_trips):
                sent = clock()
                channel.call(Op.NOP)
                lat.append(clock() - sent)
            lat.sort()
            floor = floor_round_trip(args.round_trips)
            p50 = pct(lat, 0.5)
            print("\n## round trip (NOP record and its completion, two host processes)")
            print(f"ring round trip      p50 {p50:6.2f} us   p99 {pct(lat, 0.99):6.2f} us   (aim: p50 <= 5 us)")
            print(f"shared-word floor    p50 {pct(floor, 0.5):6.2f} us   p99 {pct(floor, 0.99):6.2f} us   "
                  f"ratio ring/floor {p50 / pct(floor, 0.5):.1f}x")

            print("\n## bulk through the staging arena vs one memcpy of the same bytes (aim: >= 0.8x)")
            print(f"{'size':>8} {'memcpy GB/s':>12} {'to host GB/s':>13} {'ratio':>6} "
                  f"{'from host GB/s':>15} {'ratio':>6}")
            for size_mib in (int(s) for s in args.sizes.split(",")):
                size = size_mib * MIB
                source = pattern(size)  # the same bytes the worker sends back
                mem, expected = memcpy_seconds(source, args.repeats)
                # buffers sized to the transfer and touched first, like the memcpy baseline's
                landing = bytearray(size)  # zeros: the transfers back must write every byte
                payload = memoryview(source)
                cursor = BufferCursor(landing)
                to_host, from_host = [], []
                failed_to = failed_from = ""  # the first failed status of a timed transfer
                channel.call(TAKE_DIGEST, DIGEST_REQUEST.encode(size))  # clears the worker's destination
                for _ in range(args.repeats + 1):
                    start = time.perf_counter()
                    reply = channel.call(TO_HOST, payload)
                    to_host.append(time.perf_counter() - start)
                    failed_to = failed_to or ("" if reply.ok else f"status {reply.status}")
                    cursor.position = 0
                    start = time.perf_counter()
                    reply = channel.call(FROM_HOST, FROM_HOST_REQUEST.encode(size), sink=cursor.sink)
                    from_host.append(time.perf_counter() - start)
                    short = "" if cursor.position == size else f"{cursor.position} of {size} bytes"
                    failed_from = failed_from or ("" if reply.ok else f"status {reply.status}") or short
                t_to, t_from = statistics.median(to_host[1:]), statistics.median(from_host[1:])
                # after the timing: what the transfers left where they wrote (both cleared before the first)
                got_to = failed_to or bytes(channel.call(TAKE_DIGEST, DIGEST_REQUEST.encode(size)).payload).decode()
                got_from = failed_from or digest(landing)
                to_ratio = checks.ratio(f"bulk to host {size_mib} MiB", mem, t_to, expected, got_to, "memcpy")
                from_ratio = checks.ratio(f"bulk from host {size_mib} MiB", mem, t_from, expected, got_from, "memcpy")
                print(f"{size_mib:>5} MiB {size / mem / 1e9:12.2f} {size / t_to / 1e9:13.2f} {to_ratio:>6} "
                      f"{size / t_from / 1e9:15.2f} {from_ratio:>6}")
                del payload, cursor

            worker = HostChannel(region, channel.index).ctrl[Ctrl.HOST_WORKER]
            supervisor = server.pid or 0
            time.sleep(0.5)  # let the worker's back-off reach its longest sleep
            before = cpu_seconds(worker), cpu_seconds(supervisor)
            start = time.monotonic()
            time.sleep(args.idle_seconds)
            elapsed = time.monotonic() - start
            worker_pct = (cpu_seconds(worker) - before[0]) / elapsed * 100
            supervisor_pct = (cpu_seconds(supervisor) - before[1]) / elapsed * 100
            print("\n## idle channel (client attached, silent)")
            print(f"session worker CPU   {worker_pct:.2f} % of one core over {args.idle_seconds:g} s   (aim: < 5 %)")
            print(f"supervisor CPU       {supervisor_pct:.2f} % of one core (scans every channel each 50 ms)")
        region.close()
    finally:
        if server.pid:
            os.kill(server.pid, signal.SIGINT)
        server.join(10)
        os.unlink(path)
    return checks.exit_status()


if __name__ == "__main__":
    sys.exit(main())
