"""`orion-guest probe`: prove, from wherever a client runs, that the region reaches a live host agent.

It claims a channel, checks that bytes survive both directions inline and staged, and measures the round
trip and the bulk rates. It is the first thing to run in a new guest or container, and what the guest
end-to-end test runs inside a real QEMU guest.
"""
from __future__ import annotations

import os
import time
import zlib
from dataclasses import dataclass

from ivshmem.channel import ClientChannel
from ivshmem.errors import WireError
from ivshmem.record import DRAIN_REPLY, FILL_REQUEST, Op, fill_pattern
from ivshmem.region import Region

MIB = 1 << 20


@dataclass
class ProbeResult:
    region: str
    kind: str
    channel: int
    agent: str
    session: int
    round_trips: int
    p50_us: float
    p99_us: float
    bulk_bytes: int
    to_host_mb_s: float
    from_host_mb_s: float


def _check(condition: bool, what: str) -> None:
    if not condition:
        raise WireError(f"probe failed: {what}")


def percentile(sorted_values: list[int], fraction: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(len(sorted_values) * fraction))] / 1e3


def run_probe(region: Region, round_trips: int = 2000, bulk_mib: int = 8) -> ProbeResult:
    with ClientChannel.claim(region) as channel:
        agent, session = channel.hello()
        small = os.urandom(200)
        _check(channel.call(Op.ECHO, small).payload == small, "inline ECHO came back different")
        staged = os.urandom(channel.geometry.chunk_size * 2 + 12345)
        _check(channel.call(Op.ECHO, staged).payload == staged, "staged ECHO came back different")

        latencies = []
        clock = time.perf_counter_ns
        for _ in range(round_trips):
            start = clock()
            channel.call(Op.NOP)
            latencies.append(clock() - start)
        latencies.sort()

        size = bulk_mib * MIB
        data = os.urandom(size)
        start = clock()
        reply = channel.call(Op.DRAIN, data)
        to_host = size / ((clock() - start) / 1e9) / 1e6
        _check(DRAIN_REPLY.decode(reply.payload) == (size, zlib.crc32(data)), "DRAIN saw different bytes")
        start = clock()
        reply = channel.call(Op.FILL, FILL_REQUEST.encode(size, 7))
        from_host = size / ((clock() - start) / 1e9) / 1e6
        _check(reply.payload == fill_pattern(7, size), "FILL delivered different bytes")
        return ProbeResult(region.where, region.kind, channel.index, agent, session, round_trips,
                           percentile(latencies, 0.50), percentile(latencies, 0.99), size, to_host, from_host)
