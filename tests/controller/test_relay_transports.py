"""The relay connection's transport on a host without RDMA (this CI machine): two real orionds with enable_rdma on
both (a relay with [server-relay] remote_addr, a GPU host with its listener over the stand-in driver, the pair
tests/guest/rdma_guest.py also runs on Soft-RoCE) relay a session over TCP, and each log says why. The RDMA path
itself: tests/guest/test_guest_rdma.py.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from host_agent.rdma_stream import SYSFS
from tests.guest.rdma_guest import Hosts, session_check


@pytest.mark.skipif(SYSFS.is_dir(), reason="this machine has an RDMA device (the guest test covers it)")
def test_with_no_rdma_device_a_relayed_session_uses_tcp_and_both_ends_say_why(tmp_path: Path) -> None:
    hosts = Hosts(tmp_path / "hosts", "any")
    try:
        good, _rtt, _rate = session_check(hosts.relay_region, 1 << 20)
    finally:
        hosts.stop()
    relay, gpu = hosts.relay.log(), hosts.gpu_text()
    assert good, (relay, gpu)
    why = "enable_rdma is true, but this host has no RDMA device: relayed sessions use TCP"
    assert f"for relayed sessions; {why}" in relay and f"for relayed sessions; {why}" in gpu
    assert "over tcp: this host has no RDMA device" in relay, relay
    assert "Client supports TCP mode, then server also falls back to TCP mode." in gpu, gpu
    assert "relayed over tcp (the relay offered no RDMA)" in gpu, gpu
