"""A client process for the lease tests: allocate, print the allocation as one JSON line, keep it alive.

``python tests/controller/lease_client.py ADDRESS VGPUS MEMORY_MIB TTL_S`` — it refreshes the lease every
quarter TTL until it is killed; it never releases, so a SIGKILL leaves the allocation to its lease.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ivshmem.shared.controller_client import ControllerClient  # noqa: E402


def main() -> int:
    address, vgpus, memory, ttl = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    client = ControllerClient(address, timeout_s=10)
    alloc = client.allocate(vgpus, memory, ttl_s=ttl, client="lease_client")
    print(json.dumps(alloc), flush=True)
    while True:
        time.sleep(max(0.2, alloc["ttl_s"] / 4))
        client.keepalive(alloc["id"])


if __name__ == "__main__":
    sys.exit(main())
