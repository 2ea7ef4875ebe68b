"""Leases: a killed client's vGPUs come back, a silent host leaves the pool, keep-alives and heartbeats hold.

The controllers here run with 2 s leases (``--lease-ttl 2 --host-ttl 2``; 2 s is etcd's minimum), so the
waits for expiry are short; each wait is bounded and asserts what etcd says afterwards, not how long it took.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from ivshmem.shared.controller_client import ControllerClient, ControllerClientError
from tests.controller.rig import ControllerProcess, call, member_client, wait_until
from tests.processes import stop_process

pytestmark = pytest.mark.functional

SHORT = ["--lease-ttl", "2", "--host-ttl", "2"]
EXPIRY_BOUND_S = 20.0  # a 2 s lease is gone well within this (etcd checks expiry every 500 ms)
CLIENT_SCRIPT = Path(__file__).with_name("lease_client.py")



def gone(client: ControllerClient, alloc_id: str) -> bool:
    try:
        client.allocation(alloc_id)
    except ControllerClientError as exc:
        assert exc.status == 404, exc.reason
        return True
    return False


def register(client: ControllerClient, host: str, ttl_s: int | None = 600) -> None:
    """Register `host` with two V100s at `client`'s controller, as member `host` (its oriond) does."""
    gpus = [{"uuid": f"GPU-{host}-{i}", "name": "V100", "memory_mib": 16160} for i in range(2)]
    member_client(client.address, host).register_host(host, gpus, ttl_s=ttl_s)


def test_a_killed_client_gets_its_vgpus_reclaimed_after_its_lease(
        controllers: Callable[..., ControllerProcess]) -> None:
    ctl = controllers(extra=SHORT)
    client = ControllerClient(ctl.address)
    register(client, "h1")
    proc = subprocess.Popen([sys.executable, str(CLIENT_SCRIPT), ctl.address, "3", "4000", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        assert line, proc.stderr.read() if proc.stderr else ""
        alloc = json.loads(line)
        assert client.pool()["vgpus_free"] == 5
        # kept alive by the client across several lease lifetimes
        time.sleep(2 * alloc["ttl_s"])
        assert proc.poll() is None and client.allocation(alloc["id"])["id"] == alloc["id"]
        proc.kill()  # no release: only the lease can give the vGPUs back
        proc.wait(10)
        wait_until("the killed client's allocation to expire", lambda: gone(client, alloc["id"]))
        assert client.pool()["vgpus_free"] == 8
        assert client.allocation_count() == 0
    finally:
        stop_process(proc, 5)


def test_explicit_release_frees_at_once_and_keepalive_after_expiry_is_404(
        controllers: Callable[..., ControllerProcess]) -> None:
    ctl = controllers(extra=SHORT)
    client = ControllerClient(ctl.address)
    register(client, "h1")
    held = client.allocate(2, 8000)
    client.release(held["id"])
    assert client.pool()["vgpus_free"] == 8  # no wait: release revoked the lease
    lapsed = client.allocate(1, 1000)
    wait_until("an allocation nobody keeps alive to expire", lambda: gone(client, lapsed["id"]))
    with pytest.raises(ControllerClientError) as exc:
        client.keepalive(lapsed["id"])
    assert exc.value.status == 404 and "does not exist" in exc.value.reason


def test_a_host_that_stops_heartbeating_leaves_the_pool(controllers: Callable[..., ControllerProcess]) -> None:
    ctl = controllers(extra=SHORT)
    client = ControllerClient(ctl.address)
    register(client, "steady", ttl_s=None)
    register(client, "silent", ttl_s=None)
    assert client.pool()["vgpus_total"] == 16
    stop_after = time.monotonic() + 2 * 2
    steady, silent = member_client(ctl.address, "steady"), member_client(ctl.address, "silent")
    while time.monotonic() < stop_after:  # both beat for a while, then only "steady" does
        steady.heartbeat("steady")
        silent.heartbeat("silent")
        time.sleep(0.5)
    assert client.pool()["vgpus_total"] == 16

    def silent_left() -> bool:
        steady.heartbeat("steady")
        return [h["host"] for h in client.pool()["hosts"]] == ["steady"]

    wait_until("the silent host to leave the pool", silent_left)
    assert call(ctl, "GET", "/devices?res=nvidia_cuda")[1] == "nvidia_cuda=8"
    with pytest.raises(ControllerClientError) as exc:
        silent.heartbeat("silent")
    assert exc.value.status == 404 and "register it again" in exc.value.reason
    assert client.allocate(8, 1000)["host"] == "steady"
    with pytest.raises(ControllerClientError) as exc:
        client.allocate(1, 1000)  # the silent host's 8 idle vGPUs are not in the pool any more
    assert exc.value.code == "pool_exhausted"


def test_orion_confirmed_allocation_is_kept_alive_by_its_hosts_heartbeat(
        controllers: Callable[..., ControllerProcess]) -> None:
    """Orion's clients never send keep-alives: once oriond confirms, its heartbeats hold the allocation."""
    ctl = controllers(extra=SHORT)
    client = ControllerClient(ctl.address)
    oriond = "10.1.1.1"  # the member that signs oriond's calls
    assert call(ctl, "POST", "/heartbeat/10.1.1.1?res=nvidia_cuda&status=on", member=oriond)[0] == 200
    info = {"device_ip": "10.1.1.1", "device_id": "GPU-c0", "device_index": 0, "memory": 16160, "vdevice_num": 4}
    assert call(ctl, "POST", "/device/info", json.dumps(info), member=oriond)[0] == 200
    confirmed = call(ctl, "GET", "/service?nvidia_vgpu=1&memory=4000")[1].split(",")[0]
    unconfirmed = call(ctl, "GET", "/service?nvidia_vgpu=1&memory=4000")[1].split(",")[0]
    assert call(ctl, "PUT", f"/service/confirm/{confirmed}", member=oriond)[0] == 200

    def beat_and_check() -> bool:
        assert call(ctl, "POST", "/heartbeat/10.1.1.1?res=nvidia_cuda&status=continue", member=oriond)[0] == 200
        return gone(client, unconfirmed)

    wait_until("the unconfirmed allocation to expire", beat_and_check)
    for _ in range(2 * 2 * 4):  # two lease lifetimes of heartbeats every 0.25 s
        assert call(ctl, "POST", "/heartbeat/10.1.1.1?res=nvidia_cuda&status=continue", member=oriond)[0] == 200
        time.sleep(0.25)
    assert client.allocation(confirmed)["confirmed"] is True
    assert call(ctl, "GET", "/devices?res=nvidia_cuda&used=true")[1] == "nvidia_cuda=3"
