"""The relay connection's transport on a host without RDMA (this CI machine): two real orionds with enable_rdma on
both (a relay with [server-relay] remote_addr, a GPU host with its listener over the stand-in driver, the pair
tests/guest/rdma_guest.py also runs on Soft-RoCE) relay a session over TCP, and each log says why. The RDMA path
itself: tests/guest/test_guest_rdma.py.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from host_agent.relay.rdma_stream import SYSFS
from tests.controller.rig import REPO
from tests.guest.rdma_guest import Hosts, session_check
from tests.processes import python_path


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


def test_orion_guest_probe_passes_behind_a_relay(tmp_path: Path) -> None:
    """`orion-guest probe` on a region whose oriond relays every session ([server-relay] remote_addr): the wire's
    diagnostics are answered by the relaying oriond, and its staged DRAIN (read whole there, since the opening may
    have to forward it) must count the bytes it got (it said `DRAIN saw different bytes` before)."""
    hosts = Hosts(tmp_path / "hosts", "any")
    try:
        done = subprocess.run([sys.executable, "-m", "guest_runtime.cli", "probe", "--region", str(hosts.relay_region)],
                              cwd=REPO, env={**os.environ, "PYTHONPATH": python_path()}, capture_output=True,
                              text=True, timeout=120)
    finally:
        hosts.stop()
    assert done.returncode == 0, done.stdout + done.stderr + hosts.relay.log()
    assert "MB/s" in done.stdout, done.stdout
