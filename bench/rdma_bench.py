#!/usr/bin/env python3
"""Relay connections over RDMA (Soft-RoCE in the test guest), each figure against its baseline from the same boot.

The CI machine's kernel has no RDMA, so this boots the test guest (tests/guest/vm.py, TCG, 2 vCPUs) with rxe0 on
its loopback and runs tests/guest/rdma_guest.py bench there:
- raw pyverbs between two processes on rxe0: a 32-byte SEND/RECV ping-pong, and an RDMA WRITE stream (4 MiB
  writes, 4 in flight);
- the relay's RDMA transport (host_agent/relay/rdma_stream.py) between two processes: a 32-byte record's round trip and
  a one-way stream of 16 MiB records;
- a session relayed between two real orionds (enable_rdma on both) over RDMA, then over TCP (the GPU host's
  device missing), and local (the GPU host's own region): a synchronous call's round trip and 12 MiB copies,
  stand-in driver; the link also drops under a relayed session (its calls must fail) and comes back.
Printed: each figure and the issue's ratios (transport bulk / raw WRITE stream, aim >= 0.8; record RTT / raw
SEND/RECV RTT; relayed / local). Everything runs under TCG: absolute figures say little, ratios more.
Results: each session's copy there and back is compared with the bytes it sent by the guest's script (its
`copy=ok|WRONG`, a copy before the timed ones); a relayed/local ratio is printed only when both sessions' copies
came back right (bench/verify.py), otherwise a WRONG RESULT line, and the exit status is 1. The transport's own
rows (record round trip, one-way bulk) are not checked: tests/guest/rdma_guest.py's bench does not compare their
bytes, and their lines say so.

Run: python3 bench/rdma_bench.py   (root; the guest image from tests/guest/build-image.sh)
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.verify import Checks  # noqa: E402
from tests.guest.vm import image_ready, run_guest  # noqa: E402


def _numbers(line: str | None) -> dict[str, float]:
    return {k: float(v) for k, v in re.findall(r"(\w+)=([0-9.]+)", line or "")}


def _copy(line: str | None) -> str | None:
    """A relayed-session line's verdict on its copy there and back: "ok", "WRONG", or None (not said)."""
    found = re.search(r"\bcopy=(\w+)", line or "")
    return found.group(1) if found else None


def main() -> int:
    if not image_ready():
        print("rdma_bench: the guest image is not built: run bash tests/guest/build-image.sh", file=sys.stderr)
        return 2
    result = run_guest("tests/guest/rdma_guest.py", ["bench"], timeout=600, memory_mb=1024, cpus=2)
    for line in result.lines("RDMA-"):
        print(line)
    raw, stream = _numbers(result.line("RDMA-RAW")), _numbers(result.line("RDMA-STREAM"))
    relayed = {case: _numbers(result.line(f"RDMA-RELAY {case} ")) for case in ("rdma", "fallback", "local")}
    copies = {case: _copy(result.line(f"RDMA-RELAY {case} ")) for case in ("rdma", "fallback", "local")}
    if result.rc != 0 or not raw or not stream or not all(relayed.values()):
        print(f"rdma_bench: the guest run failed (rc {result.rc})\n{result.serial[-4000:]}", file=sys.stderr)
        return 1
    print(f"transport record RTT / raw SEND/RECV RTT: {stream['rtt_us'] / raw['rtt_us']:.2f} (bytes not checked)")
    bulk = stream["bulk_MBps"] / raw["write_MBps"]
    print(f"transport bulk / raw RDMA WRITE stream: {bulk:.2f} (aim >= 0.8: {'met' if bulk >= 0.8 else 'not met'}; "
          "bytes not checked)")
    checks = Checks()
    local = relayed["local"]
    local_right = checks.same("the local session's copy", "ok", copies["local"], "the bytes it sent")
    for case in ("rdma", "fallback"):
        got, over = relayed[case], "rdma" if case == "rdma" else "tcp"
        if not (checks.same(f"the session's copy relayed over {over}", "ok", copies[case], "the bytes it sent")
                and local_right):
            print(f"relayed over {over}: WRONG (a copy came back different: no ratio)")
            continue
        print(f"relayed over {over}: sync RTT {got['rtt_us'] / local['rtt_us']:.1f}x "
              f"local, copies {got['copy_MBps'] / local['copy_MBps']:.2f}x local, "
              f"{got['copy_MBps'] / raw['write_MBps']:.2f}x the raw WRITE stream")
    return checks.exit_status()


if __name__ == "__main__":
    sys.exit(main())
