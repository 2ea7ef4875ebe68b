"""etcd's transaction limit (``--max-txn-ops``, 128 by default) against the controller's transactions, on a real
etcd: the largest allocation in its worst placement fits one transaction, one vGPU more is a 400 with the reason
in both APIs (never etcd's 500), large registrations are split, and a raised limit is used when the operator
says so (``--etcd-max-txn-ops``). docs/controller.md, *Limits*, states the numbers pinned here.
"""
from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable

import pytest

from controller.errors import BadRequest, EtcdRefused
from controller.keys import Keys
from controller.pool import ETCD_DEFAULT_MAX_TXN_OPS, GpuPool, GpuSpec
from controller.store import EtcdStore
from tests.controller.rig import REPO, ControllerProcess, EtcdServer, call, free_port, member_client

pytestmark = pytest.mark.functional

DEFAULT_MAX_VGPUS = 42  # (128 - 2) // 3: docs/controller.md says so
WIDE = ["--max-gpus-per-host", "10000"]  # past the default 64 GPUs per host: these tests build wide hosts
CLI_TIMEOUT_S = 60


def single_slot_gpus(n: int, first: int = 0) -> list[GpuSpec]:
    """GPUs carved into one vGPU each: N vGPUs take N GPUs, the claim's longest transaction (2 + 3N)."""
    return [GpuSpec(i, f"GPU-{i:04d}", "Tesla V100-PCIE-16GB", 16160, 1) for i in range(first, first + n)]


def test_the_largest_allocation_fits_one_transaction_in_its_worst_placement(pool: GpuPool) -> None:
    assert pool.max_txn_ops == ETCD_DEFAULT_MAX_TXN_OPS == 128
    assert pool.max_vgpus == DEFAULT_MAX_VGPUS
    pool.register_host("wide", "10.0.0.9", 9960, 1, single_slot_gpus(DEFAULT_MAX_VGPUS + 8))
    alloc = pool.allocate(DEFAULT_MAX_VGPUS, None)  # 2 + 2*42 + 42 = 128 comparisons: exactly etcd's limit
    assert len({v.gpu for v in alloc.vgpus}) == DEFAULT_MAX_VGPUS
    assert pool.view().vgpus_free == 8
    with pytest.raises(BadRequest, match=f"the most is {DEFAULT_MAX_VGPUS}"):
        pool.allocate(DEFAULT_MAX_VGPUS + 1, None)
    assert pool.view().vgpus_free == 8  # nothing was claimed by the refused request


def test_over_the_limit_is_a_400_with_the_reason_in_both_apis(controllers: Callable[..., ControllerProcess]) -> None:
    ctl = controllers(extra=WIDE)
    client = member_client(ctl.address, "wide")
    client.register_host("wide", [{"uuid": f"GPU-{i}", "name": "V100", "memory_mib": 16160, "vgpu_count": 1}
                                  for i in range(250)])
    for count in (DEFAULT_MAX_VGPUS + 1, 200, 1024, 5000):
        status, text = call(ctl, "POST", "/api/v1/allocations", json.dumps({"vgpus": count}))
        assert status == 400, text
        answer = json.loads(text)
        assert answer["error"] == "bad_request"
        assert answer["reason"].startswith(f"vgpus must be an integer from 1 to {DEFAULT_MAX_VGPUS}, got {count} ")
        assert "most one allocation can hold" in answer["reason"] and "docs/controller.md" in answer["reason"]
        status, text = call(ctl, "GET", f"/service?nvidia_vgpu={count}")
        assert status == 400, text
        assert text.startswith(f"Error: nvidia_vgpu (ORION_VGPU) must be an integer from 1 to {DEFAULT_MAX_VGPUS}")
        assert text.count("\n") == 1
    status, text = call(ctl, "GET", f"/service?nvidia_vgpu={DEFAULT_MAX_VGPUS}")
    assert status == 200, text
    assert len(text.split(",")) == 1 + DEFAULT_MAX_VGPUS
    assert client.pool()["vgpus_free"] == 250 - DEFAULT_MAX_VGPUS
    assert 'orion_controller_errors_total{code="etcd_error"}' not in call(ctl, "GET", "/metrics")[1]


def test_a_registration_past_the_limit_is_split_and_replaces_the_list(pool: GpuPool) -> None:
    """300 GPUs, then 300 others (300 deletes and 300 puts), then none: each exactly the new list."""
    pool.register_host("big", "10.0.0.8", 9960, 4, single_slot_gpus(300))
    assert [g.gpu.index for g in pool.view().host("big").gpus] == list(range(300))  # type: ignore[union-attr]
    alloc = pool.allocate(3, None)
    pool.register_host("big", "10.0.0.8", 9960, 4, single_slot_gpus(300, first=1000))
    view = pool.view()
    assert [g.gpu.index for g in view.host("big").gpus] == list(range(1000, 1300))  # type: ignore[union-attr]
    assert pool.get_allocation(alloc.id).host == "big"  # claims stay across a re-registration
    pool.register_host("big", "10.0.0.8", 9960, 4, [])
    view = pool.view()
    assert view.host("big") is not None and view.vgpus_total == 0
    _, (gpus,) = pool.store.read_prefixes([pool.keys.gpus_prefix])
    assert gpus == []


def test_orions_registration_of_200_devices_and_a_fresh_start(controllers: Callable[..., ControllerProcess]) -> None:
    """Orion's oriond adds GPUs one by one; its status=on afterwards empties a list longer than one transaction."""
    ctl = controllers(extra=WIDE)
    oriond = "10.1.1.1"
    assert call(ctl, "POST", "/heartbeat/10.1.1.1?res=nvidia_cuda&status=on", member=oriond)[0] == 200
    for i in range(200):
        info = {"device_ip": "10.1.1.1", "device_id": f"GPU-{i}", "device_index": i, "memory": 16160}
        assert call(ctl, "POST", "/device/info", json.dumps(info), member=oriond)[0] == 200
    assert call(ctl, "GET", "/devices?res=nvidia_cuda") == (200, "nvidia_cuda=800")
    status, text = call(ctl, "POST", "/heartbeat/10.1.1.1?res=nvidia_cuda&status=on", member=oriond)
    assert (status, text) == (200, "OK")
    assert call(ctl, "GET", "/devices?res=nvidia_cuda") == (200, "nvidia_cuda=0")


def test_a_pool_past_grpcs_default_message_size_still_serves(controllers: Callable[..., ControllerProcess]) -> None:
    """Three registrations of 10,000 GPUs (each under the 1 MiB body limit) make a pool read of about 5 MB."""
    ctl = controllers(extra=WIDE)
    for h in range(3):
        gpus = [{"uuid": f"GPU-{h}-{i:05d}", "name": "NVIDIA H100 80GB HBM3", "memory_mib": 81559}
                for i in range(10_000)]
        status, text = call(ctl, "POST", "/api/v1/hosts", json.dumps({"host": f"big-{h}", "gpus": gpus}),
                            member=f"big-{h}")
        assert status == 201, text
    status, text = call(ctl, "GET", "/service?nvidia_vgpu=2")
    assert status == 200, text
    assert call(ctl, "GET", "/devices?res=nvidia_cuda") == (200, "nvidia_cuda=120000")


def test_a_raised_etcd_limit_is_used_when_the_controller_is_told(etcd_with: Callable[..., EtcdServer],
                                                                  key_root: str) -> None:
    roomy = etcd_with("--max-txn-ops", "400")
    store = EtcdStore(roomy.url, timeout_s=5.0)
    try:
        pool = GpuPool(store, Keys(key_root), lease_ttl_s=60, host_ttl_s=60, max_txn_ops=400)
        assert pool.max_vgpus == 132
        pool.register_host("wide", "10.0.0.7", 9960, 1, single_slot_gpus(140))
        assert len(pool.allocate(132, None).vgpus) == 132  # 398 comparisons in one transaction
    finally:
        store.close()


def test_a_controller_told_more_than_etcd_allows_says_so(etcd: EtcdServer, key_root: str) -> None:
    store = EtcdStore(etcd.url, timeout_s=5.0)
    try:
        pool = GpuPool(store, Keys(key_root), lease_ttl_s=60, host_ttl_s=60, max_txn_ops=400)
        pool.register_host("wide", "10.0.0.6", 9960, 1, single_slot_gpus(60))
        with pytest.raises(EtcdRefused, match="--etcd-max-txn-ops must not be more than etcd's --max-txn-ops"):
            pool.allocate(60, None)
    finally:
        store.close()


def test_the_flag_is_checked_at_start(etcd: EtcdServer) -> None:
    for value in ("4", "100001"):
        done = subprocess.run([sys.executable, "-m", "controller", "start", "--listen", f"127.0.0.1:{free_port()}",
                               "--etcd", etcd.url, "--etcd-max-txn-ops", value], cwd=REPO, capture_output=True,
                              text=True, timeout=CLI_TIMEOUT_S, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
        assert done.returncode == 2
        assert done.stderr == (f"orion-controller: --etcd-max-txn-ops {value}: use 5 to 100000, the value of etcd's "
                               f"--max-txn-ops (default 128)\n")
