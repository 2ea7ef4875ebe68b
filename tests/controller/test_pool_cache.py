"""The watch-fed pool cache (controller/pool_cache.py) against a real etcd: it follows other controllers, a
stale copy never hands a vGPU out twice, and a copy that stops following etcd is not used until it has read
etcd again.

Each "controller" here is a GpuPool with a connection of its own, in this process. A cache that lags is made
by a subclass that drops what the watch delivers (etcd and its watch are real; only the copy stays behind).
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pyetcd
import pytest

from controller.errors import EtcdUnavailable, NotFound, Unsatisfiable
from controller.keys import Keys
from controller.model import Allocation, PoolView
from controller.pool import GpuPool, GpuSpec
from controller.pool_cache import PoolCache
from controller.pool_records import PoolRecords
from controller.store import Change, EtcdStore, WatchLost, WatchStream
from tests.controller.rig import EtcdServer, wait_until

pytestmark = pytest.mark.functional

Pools = Callable[..., GpuPool]


class LaggingCache(PoolCache):
    """Follows the watch but never applies it: its view stays at the revision it last read."""

    def _apply(self, records: PoolRecords, changes: list[Change]) -> None:
        pass


class CompactedCache(PoolCache):
    """Its first watch starts before etcd's compacted history, as a watch that fell that far behind: etcd
    ends it with a compaction."""

    opened = 0

    def _open_watch(self) -> WatchStream:
        self.opened += 1
        if self.opened > 1:
            return super()._open_watch()
        compact(self.store.url)
        return self.store.watch(self.keys.root, 1)


def compact(url: str) -> int:
    """Compact etcd's history up to a revision made now (two writes elsewhere, so there is one to lose)."""
    host, port = url.removeprefix("http://").split(":")
    raw = pyetcd.client(host, int(port))
    try:
        raw.put("/elsewhere/bump", "x")
        revision = int(raw.put("/elsewhere/bump", "y").header.revision)
        raw.compact(revision, physical=True)
        return revision
    finally:
        raw.close()


def make_pools(url: str, key_root: str) -> Iterator[Pools]:
    stores: list[EtcdStore] = []

    def make(cache: type[PoolCache] | None = None, salt: str = "", timeout_s: float = 5.0) -> GpuPool:
        store = EtcdStore(url, timeout_s)
        stores.append(store)
        pool = GpuPool(store, Keys(key_root), lease_ttl_s=60, host_ttl_s=600, tiebreak_salt=salt)
        if cache is not None:
            pool.cache.close()
            pool.cache = cache(store, pool.keys)
        return pool

    yield make
    for store in stores:
        store.close()


@pytest.fixture
def pools(etcd: EtcdServer, key_root: str) -> Iterator[Pools]:
    yield from make_pools(etcd.url, key_root)


@pytest.fixture
def private_pools(private_etcd: EtcdServer, key_root: str) -> Iterator[Pools]:
    yield from make_pools(private_etcd.url, key_root)


def register(pool: GpuPool, host: str, gpus: int, vgpu_count: int = 4) -> None:
    pool.register_host(host, host, 9960, vgpu_count,
                       [GpuSpec(i, f"GPU-{host}-{i}", "V100", 16160) for i in range(gpus)])


def synced_view(pool: GpuPool) -> PoolView:
    pool.cache.start()
    wait_until("the cache to follow etcd", lambda: pool.cache.view() is not None)
    view = pool.cache.view()
    assert view is not None
    return view


def same_pool(a: PoolView, b: PoolView) -> bool:
    return (a.hosts, a.host_mod, a.gpu_mod) == (b.hosts, b.host_mod, b.gpu_mod)


def slots(allocs: list[Allocation]) -> list[tuple[str, int, int]]:
    return [(a.host, v.gpu, v.vgpu) for a in allocs for v in a.vgpus]


def used(view: PoolView) -> set[tuple[str, int, int]]:
    return {(h.host.name, g.gpu.index, s) for h in view.hosts for g in h.gpus for s in g.used_slots}


def fill(pool: GpuPool) -> list[Allocation]:
    """Allocate single vGPUs until the pool says it is exhausted."""
    got = []
    while True:
        try:
            got.append(pool.allocate(1, 1000))
        except Unsatisfiable as exc:
            assert exc.code == "pool_exhausted", exc
            return got


def test_the_cache_follows_another_controllers_claims_and_releases(pools: Pools) -> None:
    a, b = pools(), pools()
    register(a, "h1", 2)
    synced_view(a)
    theirs = b.allocate(3, 2000)
    wait_until("a's cache to see b's claims", lambda: slots([theirs]) == sorted(used(a.cache.view() or a.view())))
    cached = a.cache.view()
    assert cached is not None and same_pool(cached, a.view())

    mine = fill(a)
    assert len(mine) == 8 - 3 and not set(slots(mine)) & set(slots([theirs]))
    assert b.release(theirs.id).id == theirs.id
    wait_until("a's cache to see b's release", lambda: len(used(a.cache.view() or a.view())) == 5)
    with pytest.raises(NotFound):
        a.release(theirs.id)
    for alloc in mine:
        assert a.keepalive(alloc.id) > 0
        a.release(alloc.id)
    assert used(a.view()) == set()


def test_a_claim_planned_on_a_stale_view_loses_and_is_retried_on_a_fresh_read(pools: Pools) -> None:
    a, b = pools(LaggingCache, salt="same"), pools(salt="same")
    register(b, "h1", 1, vgpu_count=2)
    synced_view(a)
    theirs = b.allocate(1, 1000)  # a's copy never learns of it, and a plans exactly as b did

    mine = a.allocate(1, 1000)
    assert a.conflicts == 1
    assert set(slots([mine])) | set(slots([theirs])) == {("h1", 0, 0), ("h1", 0, 1)}
    with pytest.raises(Unsatisfiable) as full:
        a.allocate(1, 1000)
    assert full.value.code == "pool_exhausted"


def test_a_stale_view_that_finds_no_room_is_checked_against_etcd(pools: Pools) -> None:
    a, b = pools(LaggingCache), pools()
    register(b, "h1", 1, vgpu_count=1)
    theirs = b.allocate(1, 1000)
    assert used(synced_view(a)) == {("h1", 0, 0)}  # a's copy will keep saying the pool is full
    b.release(theirs.id)

    mine = a.allocate(1, 1000)
    assert slots([mine]) == [("h1", 0, 0)] and a.conflicts == 0
    with pytest.raises(NotFound):
        a.release(theirs.id)  # still in a's copy; etcd says it is gone


def test_a_cache_that_stays_behind_its_own_writes_is_restarted(pools: Pools) -> None:
    a = pools(LaggingCache)
    register(a, "h1", 1)
    synced_view(a)
    first = a.allocate(1, 1000)
    assert a.cache.view() is None  # behind a's own claim: not used
    second = a.allocate(1, 1000)
    assert slots([first]) != slots([second])
    # asking for a view is what notices the stall (after 2 s) and restarts the watch, which reads etcd again
    wait_until("the lagging cache to be read again", lambda: a.cache.view() is not None and a.cache.syncs >= 2)
    cached = a.cache.view()
    assert cached is not None and used(cached) == set(slots([first, second]))


def test_a_compacted_watch_is_not_used_and_the_cache_reads_etcd_again(private_pools: Pools) -> None:
    a = private_pools(CompactedCache)
    register(a, "h1", 2)
    before = a.allocate(2, 4000)  # planned on a fresh read: the cache is not in use yet
    assert isinstance(a.cache, CompactedCache)
    wait_until("the cache to watch etcd again after the compaction", lambda: a.cache.opened >= 2)
    view = synced_view(a)
    assert same_pool(view, a.view())
    after = fill(a)
    assert len(after) == 8 - 2 and not set(slots(after)) & set(slots([before]))


def test_after_etcd_restarts_the_cache_reads_it_again_and_no_vgpu_is_handed_out_twice(
        private_etcd: EtcdServer, private_pools: Pools) -> None:
    a, b = private_pools(timeout_s=1.0), private_pools(timeout_s=1.0)
    register(a, "h1", 2)
    held = a.allocate(2, 4000)
    synced_view(a)

    private_etcd.kill()
    wait_until("the cache to stop being used", lambda: not a.cache.synced)
    assert a.cache.view() is None
    with pytest.raises(EtcdUnavailable):
        a.allocate(1, 1000)
    with pytest.raises(EtcdUnavailable):
        a.release(held.id)

    private_etcd.start()  # same data, same ports
    theirs = b.allocate(2, 1000)  # made while a's cache may still be reconnecting
    view = synced_view(a)
    assert a.cache.syncs == 2
    wait_until("a's cache to hold b's claim", lambda: set(slots([theirs])) <= used(a.cache.view() or a.view()))
    assert same_pool(a.cache.view() or view, a.view())
    mine = fill(a)
    everything = slots([held, theirs, *mine])
    assert len(everything) == len(set(everything)) == 8
    a.release(held.id)
    assert used(a.view()) == set(slots([theirs, *mine]))


def test_a_watch_yields_whole_revisions_and_says_when_etcd_ends_it(private_etcd: EtcdServer, key_root: str,
                                                                    tmp_path: Path) -> None:
    store = EtcdStore(private_etcd.url, 5.0)
    try:
        first, _ = store.read_prefixes([key_root])
        t = store.txn
        ok, revision = store.transaction([], [t.put(f"{key_root}a", "1"), t.put(f"{key_root}b", "2")])
        assert ok and revision > first
        store.transaction([], [t.delete(f"{key_root}a")])
        store.put("/elsewhere/x", "not watched")
        stream = store.watch(key_root, first + 1)
        batches = iter(stream)
        seen: list[Change] = []
        while len(seen) < 3:
            seen += next(batches)
        assert [(c.entry.key, c.entry.value, c.deleted) for c in seen] == [
            (f"{key_root}a", b"1", False), (f"{key_root}b", b"2", False), (f"{key_root}a", b"", True)]
        assert seen[0].entry.mod_revision == seen[1].entry.mod_revision == revision
        stream.close()
        assert list(batches) == []

        compact(private_etcd.url)
        with pytest.raises(WatchLost, match="compacted"):
            for _ in store.watch(key_root, first + 1):
                pass
    finally:
        store.close()
