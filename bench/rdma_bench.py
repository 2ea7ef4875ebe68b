#!/usr/bin/env python3
"""Relay connections over RDMA (Soft-RoCE in the test guest), each figure against its baseline from the same boot.

The CI machine's kernel has no RDMA, so this boots the test guest (tests/guest/vm.py, TCG, 2 vCPUs) with rxe0 on
its loopback and runs tests/guest/rdma_guest.py bench there:
- raw pyverbs between two processes on rxe0: a 32-byte SEND/RECV ping-pong, and an RDMA WRITE stream (4 MiB
  writes, 4 in flight);
- the relay's RDMA transport (host_agent/rdma_stream.py) between two processes: a 32-byte record's round trip and
  a one-way stream of 16 MiB records;
- a session relayed between two real orionds (enable_rdma on both) over RDMA, then over TCP (the GPU host's
  device missing), and local (the GPU host's own region): a synchronous call's round trip and 12 MiB copies,
  stand-in driver; the link also drops under a relayed session (its calls must fail) and comes back.
Printed: each figure and the issue's ratios (transport bulk / raw WRITE stream, aim >= 0.8; record RTT / raw
SEND/RECV RTT; relayed / local). Everything runs under TCG: absolute figures say little, ratios more.

Run: python3 bench/rdma_bench.py   (root; the guest image from tests/guest/build-image.sh)
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.guest.vm import image_ready, run_guest  # noqa: E402


def _numbers(line: str | None) -> dict[str, float]:
    return {k: float(v) for k, v in re.findall(r"(\w+)=([0-9.]+)", line or "")}


def main() -> int:
    if not image_ready():
        print("rdma_bench: the guest image is not built: run bash tests/guest/build-image.sh", file=sys.stderr)
        return 2
    result = run_guest("tests/guest/rdma_guest.py", ["bench"], timeout=600, memory_mb=1024, cpus=2)
    for line in result.lines("RDMA-"):
        print(line)
    raw, stream = _numbers(result.line("RDMA-RAW")), _numbers(result.line("RDMA-STREAM"))
    relayed = {case: _numbers(result.line(f"RDMA-RELAY {case} ")) for case in ("rdma", "fallback", "local")}
    if result.rc != 0 or not raw or not stream or not all(relayed.values()):
        print(f"rdma_bench: the guest run failed (rc {result.rc})\n{result.serial[-4000:]}", file=sys.stderr)
        return 1
    print(f"transport record RTT / raw SEND/RECV RTT: {stream['rtt_us'] / raw['rtt_us']:.2f}")
    bulk = stream["bulk_MBps"] / raw["write_MBps"]
    print(f"transport bulk / raw RDMA WRITE stream: {bulk:.2f} (aim >= 0.8: {'met' if bulk >= 0.8 else 'not met'})")
    local = relayed["local"]
    for case in ("rdma", "fallback"):
        got = relayed[case]
        print(f"relayed over {'rdma' if case == 'rdma' else 'tcp'}: sync RTT {got['rtt_us'] / local['rtt_us']:.1f}x "
              f"local, copies {got['copy_MBps'] / local['copy_MBps']:.2f}x local, "
              f"{got['copy_MBps'] / raw['write_MBps']:.2f}x the raw WRITE stream")
    return 0


if __name__ == "__main__":
    sys.exit(main())
