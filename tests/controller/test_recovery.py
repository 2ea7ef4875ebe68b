"""Controller restarts and etcd outages: no allocation is lost, and no wrong answer is given meanwhile.

* A controller killed with SIGKILL and started again finds every allocation where it was (state is only in
  etcd), keeps them alive, releases them, and never hands their vGPUs out again.
* An etcd killed while a client is allocating and releasing: every request then fails with a 503 that names
  etcd (none succeeds, none returns a number), the metrics say etcd is down, and once etcd is back the pool
  is exactly what was granted before, plus nothing: whatever was half-done expires with its lease.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from ivshmem.shared.controller_client import ControllerClient, ControllerClientError
from tests.controller.rig import ControllerProcess, EtcdServer, call, member_client, wait_until

pytestmark = pytest.mark.functional

BOUND_S = 30.0



def used_slots(client: ControllerClient) -> set[tuple[str, int, int]]:
    pool = client.pool()
    return {(h["host"], g["index"], s) for h in pool["hosts"] for g in h["gpus"] for s in g["vgpus_used"]}


def slots_of(allocs: list[dict[str, Any]]) -> set[tuple[str, int, int]]:
    return {(a["host"], v["gpu"], v["vgpu"]) for a in allocs for v in a["vgpus"]}


def register(client: ControllerClient, host: str, gpus: int) -> None:
    client.register_host(host, [{"uuid": f"GPU-{host}-{i}", "name": "V100", "memory_mib": 16160}
                                for i in range(gpus)], ttl_s=600)


def test_controller_restart_loses_no_allocation(controllers: Callable[..., ControllerProcess]) -> None:
    ctl = controllers()
    client = member_client(ctl.address, "h1")  # h1's oriond: it registers h1 and may list every allocation
    register(client, "h1", 2)
    held = [client.allocate(2, 4000, ttl_s=60), client.allocate(1, 15000, ttl_s=60), client.allocate(1, ttl_s=60)]
    before = (sorted(client.allocations(), key=lambda a: a["id"]), used_slots(client))
    client.close()

    ctl.kill()
    ctl.start()  # same port, same etcd, a new process
    client = member_client(ctl.address, "h1")
    assert (sorted(client.allocations(), key=lambda a: a["id"]), used_slots(client)) == before
    for alloc in held:
        assert client.keepalive(alloc["id"]) > 0
    fresh = client.allocate(1, 2000, ttl_s=60)
    assert not slots_of([fresh]) & slots_of(held)
    client.release(held[0]["id"])
    assert used_slots(client) == slots_of([fresh, *held[1:]])


def test_etcd_stopped_mid_run_gives_errors_and_no_wrong_state(
        private_etcd: EtcdServer, controllers: Callable[..., ControllerProcess]) -> None:
    ctl = controllers(etcd_url=private_etcd.url, extra=["--etcd-timeout", "1"])
    client = member_client(ctl.address, "h1")
    register(client, "h1", 4)
    kept = [client.allocate(2, 4000, ttl_s=600), client.allocate(1, 8000, ttl_s=600)]
    outcomes: list[tuple[str, str]] = []
    stop = threading.Event()

    def churn() -> None:  # a client allocating and releasing short-lived vGPUs throughout
        c = ControllerClient(ctl.address, timeout_s=10)
        while not stop.is_set():
            try:
                alloc = c.allocate(1, 1000, ttl_s=2)
                outcomes.append(("granted", alloc["id"]))
                c.release(alloc["id"])
                outcomes.append(("released", alloc["id"]))
            except ControllerClientError as exc:
                outcomes.append((exc.code, exc.reason))
            time.sleep(0.01)

    worker = threading.Thread(target=churn, daemon=True)
    worker.start()
    try:
        wait_until("a few allocations before the outage", lambda: sum(k == "granted" for k, _ in outcomes) >= 5)
        private_etcd.kill()
        wait_until("errors during the outage", lambda: sum(k == "etcd_unavailable" for k, _ in outcomes) >= 5)

        # while etcd is down: every kind of request fails with a 503 naming etcd, and no number is made up
        for method, path in [("POST", "/api/v1/allocations"), ("GET", "/api/v1/pool"),
                             ("GET", "/devices?res=nvidia_cuda"), ("GET", "/service?nvidia_vgpu=1"),
                             ("DELETE", f"/api/v1/allocations/{kept[0]['id']}"),
                             ("POST", f"/api/v1/allocations/{kept[0]['id']}/keepalive"),
                             ("POST", "/api/v1/hosts/h1/heartbeat"), ("GET", "/api/v1/health")]:
            status, body = call(ctl, method, path, '{"vgpus": 1}' if method == "POST" else None, member="h1")
            assert status == 503 and f"etcd at {private_etcd.url} is unreachable" in body, (method, path, body)
        metrics = call(ctl, "GET", "/metrics")[1]
        assert "orion_controller_etcd_up 0.0" in metrics and "orion_controller_vgpus_total{" not in metrics
    finally:
        stop.set()
        worker.join(30)
    granted_during = [i for k, i in outcomes if k == "granted"]
    assert {k for k, _ in outcomes} <= {"granted", "released", "etcd_unavailable"}, outcomes[-5:]
    assert all("etcd" in reason for k, reason in outcomes if k == "etcd_unavailable")

    private_etcd.start()  # same data, same ports
    wait_until("the controller to reach etcd again", lambda: call(ctl, "GET", "/api/v1/health")[0] == 200)
    assert ctl.proc is not None and ctl.proc.poll() is None
    # whatever the churn left half-done (granted or released without an answer) expires with its 2 s lease;
    # what was granted before the outage and kept alive is all that remains
    wait_until("only the kept allocations to remain",
               lambda: {a["id"] for a in client.allocations()} == {a["id"] for a in kept})
    assert used_slots(client) == slots_of(kept)
    assert client.pool()["vgpus_free"] == 16 - 3
    assert sorted(client.allocations(), key=lambda a: a["id"]) == sorted(kept, key=lambda a: a["id"])
    assert not set(granted_during) & {a["id"] for a in kept}
    after = client.allocate(4, 4000, ttl_s=60)
    assert not slots_of([after]) & slots_of(kept)
    for alloc in kept:
        assert client.keepalive(alloc["id"]) > 0
