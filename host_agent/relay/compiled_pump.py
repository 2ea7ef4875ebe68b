"""The relaying host's compiled pump (relay_pump.c): a relayed session's records between its ring and its TCP relay
connection, without the GIL, for relayed_session.Relay, which stays the reference for everything the pump hands back.

    python -m host_agent.relay.compiled_pump      build it now (setup.sh does), print where it is

Built and loaded by native_build.py; where it cannot be had (no compiler, ORION_HOT_PATH=0) or the connection is not
a socket compiled code may write (RDMA), the relay runs its two Python threads instead.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from ivshmem.channel import Endpoint

from ..native_build import NativeModule, ring_shape
from .frames import RecordStream

PROGRAM = NativeModule(Path(__file__).resolve().with_name("relay_pump.c"), "_orion_relay_pump",
                       "compiled relay pump", "relayed sessions are carried by two Python threads")
PUMP_RING, PUMP_SOCKET, PUMP_CHECK, PUMP_LOST = 0, 1, 2, 3  # why Pump.pump() returned (relay_pump.c)
# The forwarding table's codes for the page-locked copies of at most a completion slot served in C (relay_pump.c):
# a DtoH, synchronous or posted, sent as the plain DtoH, its bytes landing in the pool (LANDS_IN_POOL), and an HtoD,
# synchronous or posted, sent as the plain HtoD with the pool's bytes (SENT_FROM_POOL); the payload sizes that code
# reads, both directions alike (tests/unit/test_relay_session.py holds them to the call table)
LANDS_IN_POOL, SENT_FROM_POOL, PINNED_SIZE, PINNED_ASYNC_SIZE = 5, 6, 24, 32


def start(ring: Endpoint, frames: RecordStream, remote_generation: int) -> Any:
    """The compiled pump between a relayed session's ring and its relay connection, or None where it cannot be had
    (relayed_session.py then runs its Python threads)."""
    carried = frames.compiled_socket()
    module = PROGRAM.load() if carried is not None else None
    if module is None or carried is None:
        return None
    fd, lock = carried
    policy = ring.policy
    return module.Pump(ring.buf, ring_shape(ring.in_ring), ring_shape(ring.out_ring),
                       (ring.generation, remote_generation), fd, lock,
                       (policy.spin_s, policy.busy_spin_s, policy.min_sleep, policy.max_sleep, policy.check_every_s))


if __name__ == "__main__":
    sys.exit(PROGRAM.main())
