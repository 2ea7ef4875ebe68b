"""Carving GPUs into vGPUs and packing requests, through GpuPool on a real etcd (no HTTP).

Each case registers made-up hosts under its own key root, asks for vGPUs, and checks where they landed and
what the pool then says is free, including why a request that cannot be met is refused.
"""
from __future__ import annotations

import pytest

from controller.errors import NotFound, Unsatisfiable, WrongHost
from controller.model import Allocation
from controller.pool import GpuPool, GpuSpec

pytestmark = pytest.mark.functional

V100 = 16160  # MiB, what a "16 GB" V100 reports


def gpus(n: int, memory: int = V100, vgpu_count: int | None = None) -> list[GpuSpec]:
    return [GpuSpec(i, f"GPU-{i:04d}-{memory}", "Tesla V100-PCIE-16GB", memory, vgpu_count) for i in range(n)]


def on_gpus(alloc: Allocation) -> list[int]:
    return sorted({v.gpu for v in alloc.vgpus})


def test_each_gpu_is_carved_into_vgpu_count_vgpus(pool: GpuPool) -> None:
    pool.register_host("h1", "10.0.0.1", 9960, 4, gpus(2))
    pool.register_host("h2", "10.0.0.2", 9960, 4, [GpuSpec(0, "GPU-x", "A100", 40960, 8)])
    view = pool.view()
    assert view.vgpus_total == 2 * 4 + 8
    assert view.vgpus_free == view.vgpus_total
    assert [g.gpu.vgpu_count for g in view.host("h2").gpus] == [8]  # type: ignore[union-attr]


def test_two_7500_mib_vgpus_share_one_16gb_card(pool: GpuPool) -> None:
    pool.register_host("h1", "10.0.0.1", 9960, 4, gpus(2))
    alloc = pool.allocate(2, 7500)
    assert len(alloc.vgpus) == 2 and on_gpus(alloc) == [0]
    assert [v.vgpu for v in alloc.vgpus] == [0, 1]
    assert {v.memory_mib for v in alloc.vgpus} == {7500}


def test_two_15500_mib_vgpus_take_two_cards(pool: GpuPool) -> None:
    pool.register_host("h1", "10.0.0.1", 9960, 4, gpus(2))
    alloc = pool.allocate(2, 15500)
    assert on_gpus(alloc) == [0, 1]
    assert len({v.uuid for v in alloc.vgpus}) == 2


def test_without_memory_a_vgpu_gets_the_gpus_share(pool: GpuPool) -> None:
    pool.register_host("h1", "10.0.0.1", 9960, 4, gpus(1))
    alloc = pool.allocate(4, None)
    assert [v.memory_mib for v in alloc.vgpus] == [V100 // 4] * 4
    with pytest.raises(Unsatisfiable) as exc:
        pool.allocate(1, None)
    assert exc.value.code == "pool_exhausted"


def test_memory_not_slots_can_be_the_limit(pool: GpuPool) -> None:
    pool.register_host("h1", "10.0.0.1", 9960, 8, gpus(2))
    first = pool.allocate(3, 5000)  # 15000 of 16160 MiB: GPU 0 is now full by memory, with 5 slots left
    assert on_gpus(first) == [0]
    second = pool.allocate(1, 5000)
    assert on_gpus(second) == [1]
    small = pool.allocate(1, 1000)  # fits in GPU 0's last 1160 MiB: best fit
    assert on_gpus(small) == [0]


def test_single_vgpus_fill_a_busy_gpu_before_an_idle_one(pool: GpuPool) -> None:
    pool.register_host("h1", "10.0.0.1", 9960, 4, gpus(2))
    placed = [on_gpus(pool.allocate(1, 4000)) for _ in range(5)]
    assert placed == [[0], [0], [0], [0], [1]]
    big = pool.allocate(1, 12000)  # GPU 1 still has room for it because GPU 0 was filled first
    assert on_gpus(big) == [1]


def test_fewest_gpus_even_when_a_busier_gpu_has_room(pool: GpuPool) -> None:
    pool.register_host("h1", "10.0.0.1", 9960, 4, gpus(2))
    pool.allocate(1, 4000)  # GPU 0 has 3 slots left, GPU 1 four
    alloc = pool.allocate(4, 4000)
    assert on_gpus(alloc) == [1]


def test_a_request_is_served_by_one_host(pool: GpuPool) -> None:
    pool.register_host("h1", "10.0.0.1", 9960, 4, gpus(1))
    pool.register_host("h2", "10.0.0.2", 9960, 4, gpus(1))
    with pytest.raises(Unsatisfiable) as exc:
        pool.allocate(5, 1000)
    assert exc.value.code == "too_many_vgpus"
    assert "one host" in exc.value.message and "most: 4" in exc.value.message
    alloc = pool.allocate(4, 1000)
    assert len({v.uuid for v in alloc.vgpus}) == 1


def test_a_busier_host_is_filled_before_an_idle_one(pool: GpuPool) -> None:
    pool.register_host("a", "10.0.0.1", 9960, 4, gpus(1))
    pool.register_host("b", "10.0.0.2", 9960, 4, gpus(1))
    first = pool.allocate(1, 1000)
    assert first.host == "a"
    assert [pool.allocate(1, 1000).host for _ in range(3)] == ["a", "a", "a"]
    assert pool.allocate(1, 1000).host == "b"


def test_unsatisfiable_requests_say_why(pool: GpuPool) -> None:
    with pytest.raises(Unsatisfiable) as exc:
        pool.allocate(1, 1000)
    assert exc.value.code == "no_hosts" and "oriond" in exc.value.message
    pool.register_host("h1", "10.0.0.1", 9960, 4, gpus(2))
    with pytest.raises(Unsatisfiable) as exc:
        pool.allocate(1, 20000)
    assert exc.value.code == "memory_too_large" and "16160" in exc.value.message
    with pytest.raises(Unsatisfiable) as exc:
        pool.allocate(3, 15500)
    assert exc.value.code == "too_many_vgpus"
    held = pool.allocate(2, 15500)
    with pytest.raises(Unsatisfiable) as exc:
        pool.allocate(1, 15500)
    assert exc.value.code == "pool_exhausted" and "release" in exc.value.message
    pool.release(held.id)
    assert on_gpus(pool.allocate(1, 15500)) == [0]


def test_release_frees_and_a_second_release_is_not_found(pool: GpuPool) -> None:
    pool.register_host("h1", "10.0.0.1", 9960, 4, gpus(1))
    alloc = pool.allocate(4, 4000)
    assert pool.view().vgpus_free == 0
    pool.release(alloc.id)
    assert pool.view().vgpus_free == 4
    with pytest.raises(NotFound):
        pool.release(alloc.id)
    assert pool.allocations() == []


def test_reregistration_replaces_gpus_and_keeps_claims(pool: GpuPool) -> None:
    pool.register_host("h1", "10.0.0.1", 9960, 4, gpus(2))
    alloc = pool.allocate(2, 8000)
    pool.register_host("h1", "10.0.0.1", 9960, 4, gpus(1))
    view = pool.view()
    host = view.host("h1")
    assert host is not None and [g.gpu.index for g in host.gpus] == [0]
    assert host.gpus[0].used_slots == {v.vgpu for v in alloc.vgpus}
    assert pool.get_allocation(alloc.id) == alloc


def test_orion_device_info_adds_gpus_under_the_host_lease(pool: GpuPool) -> None:
    pool.register_host("10.0.0.7", "10.0.0.7", 9960, 4, ())
    pool.add_gpu("10.0.0.7", GpuSpec(0, "GPU-36945fda", "GeForce RTX 2080 Ti", 11019), port=9970)
    view = pool.view()
    assert view.vgpus_total == 4
    assert view.host("10.0.0.7").host.port == 9970  # type: ignore[union-attr]
    with pytest.raises(NotFound):
        pool.add_gpu("10.9.9.9", GpuSpec(0, "GPU-y", "x", 1000))


def test_a_controllers_tiebreak_salt_changes_only_exact_ties(pool: GpuPool) -> None:
    pool.register_host("a", "10.0.0.1", 9960, 4, gpus(4))
    pool.register_host("b", "10.0.0.2", 9960, 4, gpus(4))
    salted = [GpuPool(pool.store, pool.keys, tiebreak_salt=salt) for salt in ("one", "two")]
    first = salted[0].allocate(1, 1000)  # an empty pool: any GPU of any host is as good
    second = salted[1].allocate(1, 1000)  # not a tie any more: the busier GPU comes first, whatever the salt
    assert (second.host, on_gpus(second)) == (first.host, on_gpus(first))
    big = salted[1].allocate(4, 15000)  # fewest GPUs still rules: four idle GPUs of the other host
    assert big.host != first.host


def test_a_request_for_a_named_host_is_served_there_or_says_why(pool: GpuPool) -> None:
    pool.register_host("a", "10.0.0.1", 9960, 4, gpus(1))
    pool.register_host("b", "10.0.0.2", 9960, 4, gpus(1))
    pool.allocate(1, 1000)  # "a" is now the busier host: an unconstrained request would go there too
    assert pool.allocate(1, 1000, host="b").host == "b"
    with pytest.raises(Unsatisfiable) as exc:
        pool.allocate(1, 1000, host="c")
    assert exc.value.code == "host_unknown" and "host c" in exc.value.message
    with pytest.raises(Unsatisfiable) as exc:
        pool.allocate(2, 15500, host="b")  # host "a" could not either, but the answer is about "b"
    assert exc.value.code == "too_many_vgpus" and "host b" in exc.value.message


def test_confirm_by_another_host_is_refused_and_changes_nothing(pool: GpuPool) -> None:
    pool.register_host("a", "10.0.0.1", 9960, 4, gpus(1))
    alloc = pool.allocate(1, 1000)
    with pytest.raises(WrongHost) as exc:
        pool.confirm(alloc.id, host="b")
    assert "granted on host a, not b" in exc.value.message
    assert pool.get_allocation(alloc.id).confirmed is False
    assert pool.confirm(alloc.id, host="a").confirmed is True
