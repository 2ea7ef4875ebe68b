"""PoolRecords: the pool's etcd records (hosts, GPUs, claims, allocation leases) parsed, and the PoolView they
make at one revision.

Why one class for both ways of reading the pool: a fresh range read (GpuPool.view) and the watch-fed cache
(pool_cache.py) must derive exactly the same view from the same keys, or a claim planned on one would differ
from a claim planned on the other. Each host's usage is derived once and kept until a record of that host
changes, because a claim touches one host and re-deriving all of them for every request was the cache's main
cost. Nothing here talks to etcd.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from typing import Protocol, TypeVar

from controller.keys import Keys
from controller.model import Gpu, GpuUsage, Host, HostUsage, PoolView
from controller.store import Entry

T = TypeVar("T")


class Parser(Protocol):
    """How a record's value is parsed: ``parse(entry)``, or a memo of it (GpuPool keeps one per key and
    mod revision for its fresh reads)."""

    def __call__(self, entry: Entry, parse: Callable[[Entry], T]) -> T: ...


def parse_now(entry: Entry, parse: Callable[[Entry], T]) -> T:
    return parse(entry)


def _host(entry: Entry) -> Host:
    return Host.from_json(entry.value)


def _gpu(entry: Entry) -> Gpu:
    return Gpu.from_json(entry.value)


def _claim_memory(entry: Entry) -> int:
    return int(json.loads(entry.value)["memory_mib"])


class PoolRecords:
    """Mutable records under one key root; ``put``/``delete`` apply one key, ``view`` derives the PoolView.
    Not thread-safe: the owner serialises access."""

    def __init__(self, keys: Keys, parser: Parser = parse_now) -> None:
        self.keys = keys
        self._parser = parser
        self._hosts: dict[str, tuple[Host, int]] = {}  # name -> (record, mod revision)
        self._gpus: dict[str, dict[int, tuple[Gpu, int]]] = {}  # host -> index -> (record, mod revision)
        self._claims: dict[tuple[str, int], dict[int, int]] = {}  # (host, gpu) -> slot -> memory_mib
        self._allocations: dict[str, tuple[int, bytes]] = {}  # id -> (lease, value)
        self._usage: dict[str, HostUsage] = {}  # derived; dropped when a record of the host changes
        self._mods: tuple[dict[str, int], dict[tuple[str, int], int]] | None = None  # derived likewise
        self._hosts_view: tuple[HostUsage, ...] | None = None

    def put(self, entry: Entry) -> None:
        k, key = self.keys, entry.key
        if key.startswith(k.claims_prefix):
            host, gpu, slot = k.parse_claim(key)
            self._claims.setdefault((host, gpu), {})[slot] = self._parser(entry, _claim_memory)
            self._changed(host, mods=False)
        elif key.startswith(k.gpus_prefix):
            host, index = k.parse_gpu(key)
            self._gpus.setdefault(host, {})[index] = (self._parser(entry, _gpu), entry.mod_revision)
            self._changed(host, mods=True)
        elif key.startswith(k.hosts_prefix):
            host = key[len(k.hosts_prefix):]
            self._hosts[host] = (self._parser(entry, _host), entry.mod_revision)
            self._changed(host, mods=True)
        elif key.startswith(k.allocations_prefix):
            self._allocations[key[len(k.allocations_prefix):]] = (entry.lease, entry.value)

    def delete(self, key: str) -> None:
        k = self.keys
        if key.startswith(k.claims_prefix):
            host, gpu, slot = k.parse_claim(key)
            slots = self._claims.get((host, gpu), {})
            slots.pop(slot, None)
            if not slots:
                self._claims.pop((host, gpu), None)
            self._changed(host, mods=False)
        elif key.startswith(k.gpus_prefix):
            host, index = k.parse_gpu(key)
            gpus = self._gpus.get(host, {})
            gpus.pop(index, None)
            if not gpus:
                self._gpus.pop(host, None)
            self._changed(host, mods=True)
        elif key.startswith(k.hosts_prefix):
            host = key[len(k.hosts_prefix):]
            self._hosts.pop(host, None)
            self._changed(host, mods=True)
        elif key.startswith(k.allocations_prefix):
            self._allocations.pop(key[len(k.allocations_prefix):], None)

    def _changed(self, host: str, mods: bool) -> None:
        self._usage.pop(host, None)
        self._hosts_view = None
        if mods:
            self._mods = None

    def allocation(self, alloc_id: str) -> tuple[int, bytes] | None:
        """An allocation's (lease, stored value), if it is among the records."""
        return self._allocations.get(alloc_id)

    def view(self, revision: int) -> PoolView:
        """The pool these records make, stamped with ``revision`` (the caller's word for when they were read)."""
        if self._hosts_view is None:
            self._hosts_view = tuple(self._host_usage(name) for name in sorted(self._hosts))
        if self._mods is None:
            gpu_mod = {(host, index): mod for host in self._hosts
                       for index, (_, mod) in self._gpus.get(host, {}).items()}
            self._mods = ({name: mod for name, (_, mod) in self._hosts.items()}, gpu_mod)
        return PoolView(revision, self._hosts_view, *self._mods)

    def _host_usage(self, name: str) -> HostUsage:
        usage = self._usage.get(name)
        if usage is None:
            gpus = sorted((g for g, _ in self._gpus.get(name, {}).values()), key=lambda g: g.index)
            usage = self._usage[name] = HostUsage(self._hosts[name][0], tuple(
                GpuUsage(g, frozenset(s for s in claims if s < g.vgpu_count), sum(claims.values()))
                for g in gpus for claims in (self._claims.get((name, g.index), {}),)))
        return usage
