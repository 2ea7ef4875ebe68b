"""Two controller processes on one etcd, 500 concurrent requests: no vGPU is ever handed out twice.

The pool (8 hosts x 4 GPUs x 8 vGPUs, 16160 MiB each) is smaller than what 500 requests ask for, so the
controllers race for the last slots and for GPU memory as well; the requests alternate between the two
controllers. Afterwards every granted vGPU must be unique, no GPU may hold more memory than it has, and
what etcd holds must be exactly what was granted. Then everything is released concurrently and the pool
must be whole again.
"""
from __future__ import annotations

import random
import threading
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from ivshmem.shared.controller_client import ControllerClient, ControllerClientError
from tests.controller.rig import ControllerProcess, call, member_client

pytestmark = pytest.mark.functional

HOSTS, GPUS, VGPUS, MEMORY = 8, 4, 8, 16160
REQUESTS = 500
CLIENT_THREADS = 48


def test_500_concurrent_requests_on_two_controllers_hand_out_no_vgpu_twice(
        controllers: Callable[..., ControllerProcess]) -> None:
    a, b = controllers(), controllers()
    admin = member_client(a.address, "admin")  # a member: it may list every allocation
    for h in range(HOSTS):
        member_client(a.address, f"host-{h}").register_host(
            f"host-{h}", [{"uuid": f"GPU-{h}-{g}", "name": "V100", "memory_mib": MEMORY} for g in range(GPUS)],
            vgpu_count=VGPUS, ttl_s=600)
    rng = random.Random(5)
    asks = [(rng.choice([1, 1, 1, 2, 3]), rng.choice([1500, 2000, 4000, 7500])) for _ in range(REQUESTS)]
    local = threading.local()

    def request(i: int) -> tuple[str, Any]:
        clients = getattr(local, "clients", None)
        if clients is None:
            clients = local.clients = (ControllerClient(a.address, 30), ControllerClient(b.address, 30))
        try:
            return "granted", clients[i % 2].allocate(asks[i][0], asks[i][1], ttl_s=600)
        except ControllerClientError as exc:
            return exc.code, exc.reason

    with ThreadPoolExecutor(CLIENT_THREADS) as ex:
        results = list(ex.map(request, range(REQUESTS)))

    outcomes = Counter(kind for kind, _ in results)
    assert set(outcomes) <= {"granted", "pool_exhausted"}, [r for r in results if r[0] != "granted"][:5]
    granted = [alloc for kind, alloc in results if kind == "granted"]
    assert len(granted) > 50 and outcomes["pool_exhausted"] > 0, outcomes  # the pool really ran out

    slots = [(al["host"], v["gpu"], v["vgpu"]) for al in granted for v in al["vgpus"]]
    twice = [s for s, n in Counter(slots).items() if n > 1]
    assert not twice, f"handed out twice: {twice[:10]}"
    memory: Counter[tuple[str, int]] = Counter()
    for al in granted:
        assert len({v["uuid"] for v in al["vgpus"]}) <= len(al["vgpus"])
        for v in al["vgpus"]:
            memory[(al["host"], v["gpu"])] += v["memory_mib"]
    assert max(memory.values()) <= MEMORY
    for al, (_, ask_mem) in zip((r[1] for r in results), asks, strict=True):
        if isinstance(al, dict):
            assert {v["memory_mib"] for v in al["vgpus"]} == {ask_mem}

    # what etcd holds is exactly what was granted, seen through either controller
    pool = ControllerClient(b.address).pool()
    held = {(h["host"], g["index"], s) for h in pool["hosts"] for g in h["gpus"] for s in g["vgpus_used"]}
    assert held == set(slots)
    assert pool["vgpus_free"] == HOSTS * GPUS * VGPUS - len(slots)
    assert {al["id"] for al in admin.allocations()} == {al["id"] for al in granted}

    def release(i: int) -> None:
        ControllerClient((a, b)[i % 2].address, 30).release(granted[i]["id"])

    with ThreadPoolExecutor(CLIENT_THREADS) as ex:
        list(ex.map(release, range(len(granted))))
    pool = admin.pool()
    assert pool["vgpus_free"] == pool["vgpus_total"] == HOSTS * GPUS * VGPUS
    assert admin.allocations() == []
    print(f"outcomes {dict(outcomes)}; claim conflicts retried: {conflicts(a) + conflicts(b)}")


def conflicts(ctl: ControllerProcess) -> int:
    text = call(ctl, "GET", "/metrics")[1]
    return int(float(next(line.split()[1] for line in text.splitlines()
                          if line.startswith("orion_controller_claim_conflicts_total"))))
