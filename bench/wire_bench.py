#!/usr/bin/env python3
"""Wire benchmark: ring round trip, staged bulk throughput against memcpy, idle cost. Not a test.

Everything is measured in one run, with baselines taken in the same run:
* round trip: a client process and a real session worker process exchanging NOP records (p50/p99), next to
  the floor of two Python processes ping-ponging one shared word;
* bulk: payloads streamed through the staging arena to the host (the worker copies each chunk into a
  destination buffer, as a host-to-device copy would) and back (the worker copies from a source buffer into
  the chunks, as a device-to-host copy would, and the client copies them out), as a ratio to one plain
  memcpy of the same bytes between two buffers of this process;
* idle: CPU used by a session worker whose client is attached but silent, in % of one core.

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

from host_agent.handler import Reply, Session  # noqa: E402
from host_agent.region_server import ServerOptions, serve  # noqa: E402
from ivshmem import ClientChannel, Op, Region, Streamed, layout  # noqa: E402
from ivshmem.channel import BufferCursor, Ctrl, HostChannel, Sink  # noqa: E402
from ivshmem.codec import Schema  # noqa: E402
from ivshmem.record import fill_pattern  # noqa: E402

MIB = 1 << 20
TO_HOST, FROM_HOST = 0x80, 0x81
FROM_HOST_REQUEST = Schema("bench from-host", ("length", "u64"))
_MP = multiprocessing.get_context("fork")


class CopyHandler:
    """Moves bytes as the CUDA executor's copies will: chunk -> destination, source -> chunk."""

    def __init__(self, session: Session) -> None:
        self.source = bytearray(fill_pattern(1, MIB)) * 256
        self.destination = bytearray(self.source)  # a copy, so its pages are already touched

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


def memcpy_seconds(size: int, repeats: int) -> float:
    src = bytearray(os.urandom(MIB)) * (size // MIB)
    dst = bytearray(size)
    s, d = memoryview(src), memoryview(dst)
    d[:] = s  # fault the pages in first
    best = []
    for _ in range(repeats):
        start = time.perf_counter()
        d[:] = s
        best.append(time.perf_counter() - start)
    return statistics.median(best)


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
                start = clock()
                channel.call(Op.NOP)
                lat.append(clock() - start)
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
                mem = memcpy_seconds(size, args.repeats)
                # buffers sized to the transfer and touched first, like the memcpy baseline's
                source = bytearray(fill_pattern(1, MIB)) * size_mib  # the same bytes the worker sends back
                landing = bytearray(source)
                payload = memoryview(source)
                cursor = BufferCursor(landing)
                to_host, from_host = [], []
                for _ in range(args.repeats + 1):
                    start = time.perf_counter()
                    channel.call(TO_HOST, payload)
                    to_host.append(time.perf_counter() - start)
                    landing[:MIB] = bytes(MIB)
                    cursor.position = 0
                    start = time.perf_counter()
                    reply = channel.call(FROM_HOST, FROM_HOST_REQUEST.encode(size), sink=cursor.sink)
                    from_host.append(time.perf_counter() - start)
                    assert reply.ok and cursor.position == size and landing == source, "bytes changed on the way"
                t_to, t_from = statistics.median(to_host[1:]), statistics.median(from_host[1:])
                print(f"{size_mib:>5} MiB {size / mem / 1e9:12.2f} {size / t_to / 1e9:13.2f} {mem / t_to:6.2f} "
                      f"{size / t_from / 1e9:15.2f} {mem / t_from:6.2f}")
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
