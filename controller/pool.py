"""GpuPool: the vGPU pool's operations as etcd transactions — register, heartbeat, claim, keep alive, release.

Why claims cannot both succeed: a claim is one transaction that creates the claim keys of the chosen vGPU
slots (create-if-absent: version == 0), the allocation record, and a per-host index entry, all under the
allocation's own lease, and only if, for every GPU it touches, no claim key under that GPU was created or
changed since the revision the placement was computed from (a range comparison on mod revisions), and the
host and GPU records are the ones that were read. Two controllers that planned from the same state therefore
cannot both commit on a shared GPU: the second transaction fails, re-reads, re-plans. That also guards the
GPU's memory, which slot keys alone would not.

Why one session per allocation: an allocation id is the only thing a relayed session shows for its grant, so a
second session naming a live id (a replay) must not share it, nor outlive it: ``confirm`` binds the allocation to
exactly one session (host, session id, relaying member) in the same compare-and-swap that marks it confirmed, and
a confirm for any other session is refused; its GPU host releases it when that session ends (docs/security.md).
Allocation ids are 128 random bits: knowing one is what lets a guest keep alive, read and release its grant.

Why leases: a host's records live under the host's lease (heartbeats refresh it; a silent host's GPUs vanish
from the pool when it expires). Each allocation has its own lease (default TTL 10 s): release revokes it,
a client that vanishes stops refreshing it, and either way etcd deletes the claims. Once a host's oriond has
confirmed an allocation (Orion's ``PUT /service/confirm``), the host's heartbeats keep it alive too, since
Orion's own clients never send keep-alives.

Within one controller, the read-plan-commit step runs under a lock: local requests would otherwise race for
the same best slot and mostly lose; the lock is only an optimisation, correctness comes from the transaction.

Why a cache: the plan is made on the watch-fed copy of the pool (pool_cache.py) when it is following etcd, so a
claim needs no read round trip, and a release or keep-alive takes the allocation's lease from it instead of a
get. A plan from the copy that loses its transaction, or finds no room, is made again from a fresh read; the
endpoints that report the pool (``view``, ``allocations``, ``get_allocation``) always read etcd.

Why limits: etcd refuses a transaction whose compare or success list is longer than its ``--max-txn-ops``
(128 by default). A claim of N vGPUs on G GPUs compares 2 + 2G + N keys (host record, allocation id; per GPU its
record and its claims range; per slot its key) and writes N + 2 (the slots, the allocation, its ``placed``
entry). G can be N (one vGPU per GPU), so a claim fits whatever its placement when 3N + 2 <= max-txn-ops: 42
vGPUs for etcd's default. A claim must stay one transaction, so that is the per-allocation limit, refused as
a bad request past it. A registration needs no such atomicity: past the limit its deletes and puts are
written in several transactions, the host record last.
"""
from __future__ import annotations

import json
import logging
import random
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TypeVar, cast

from pyetcd.utils import prefix_range_end

from controller.binding import check_binding, check_release
from controller.errors import BadRequest, Contention, NotFound, Unsatisfiable, WrongHost
from controller.keys import Keys
from controller.model import Allocation, Claim, Gpu, Host, PoolView, VgpuGrant, dumps
from controller.packing import Placement, place
from controller.pool_cache import PoolCache
from controller.pool_records import PoolRecords
from controller.store import Entry, EtcdStore, PendingLease

log = logging.getLogger(__name__)

DEFAULT_LEASE_TTL_S = 10
DEFAULT_HOST_TTL_S = 10
CLAIM_ATTEMPTS = 64
CLAIM_DEADLINE_S = 5.0
PARSE_CACHE_ENTRIES = 100_000
ETCD_DEFAULT_MAX_TXN_OPS = 128  # etcd's --max-txn-ops unless its operator raised it (3.4 and 3.5)
MIN_TXN_OPS = 5  # one vGPU on one GPU: 2 + 2 + 1 comparisons
MAX_VGPUS = 1024  # whatever etcd allows: keeps one claim (slots and allocation record) far below etcd's 1.5 MiB
REGISTRATION_CHUNK_OPS = 1000  # GPU records of up to ~0.7 KiB: a chunk stays below etcd's 1.5 MiB request limit

T = TypeVar("T")


def max_vgpus_per_claim(max_txn_ops: int) -> int:
    """The most vGPUs one claim transaction holds whatever its placement: 2 + 2G + N comparisons with G <= N
    GPUs must stay within ``max_txn_ops`` (see the module doc)."""
    return min(MAX_VGPUS, (max_txn_ops - 2) // 3)


@dataclass(frozen=True)
class GpuSpec:
    """A GPU as a host reports it; ``vgpu_count`` None means the host's default."""

    index: int
    uuid: str
    name: str
    memory_mib: int
    vgpu_count: int | None = None


class GpuPool:
    """The pool in etcd. Any number of these may share one etcd: what one holds besides its connection is the
    watch-fed cache, which is only ever a hint (see the module doc). Closing the store ends the cache too."""

    def __init__(self, store: EtcdStore, keys: Keys, lease_ttl_s: int = DEFAULT_LEASE_TTL_S,
                 host_ttl_s: int = DEFAULT_HOST_TTL_S, tiebreak_salt: str = "",
                 max_txn_ops: int = ETCD_DEFAULT_MAX_TXN_OPS) -> None:
        if max_txn_ops < MIN_TXN_OPS:
            raise ValueError(f"max_txn_ops {max_txn_ops}: a claim of one vGPU needs {MIN_TXN_OPS} operations")
        self.store = store
        self.max_txn_ops = max_txn_ops  # etcd's --max-txn-ops, as the operator told us
        self.max_vgpus = max_vgpus_per_claim(max_txn_ops)
        self.tiebreak_salt = tiebreak_salt  # packing.py: how this controller breaks exact ties
        self.keys = keys
        self.lease_ttl_s = lease_ttl_s
        self.host_ttl_s = host_ttl_s
        self._claim_lock = threading.Lock()
        self._parse_memo: dict[tuple[str, int], object] = {}
        self.cache = PoolCache(store, keys)
        self.conflicts = 0  # claim transactions that lost a race (telemetry for /metrics; not state)

    # ------------------------------------------------------------------ reading
    def view(self) -> PoolView:
        """Hosts, GPUs and claims at one revision, read from etcd now."""
        k = self.keys
        revision, groups = self.store.read_prefixes([k.hosts_prefix, k.gpus_prefix, k.claims_prefix])
        records = PoolRecords(k, self._parsed)
        for entries in groups:
            for entry in entries:
                records.put(entry)
        return records.view(revision)

    def _parsed(self, entry: Entry, parse: Callable[[Entry], T]) -> T:
        """Parse a record once per (key, mod revision): a key at one revision never changes, and re-parsing
        every GPU and claim on every fresh read was most of its CPU time."""
        memo_key = (entry.key, entry.mod_revision)
        hit = self._parse_memo.get(memo_key)
        if hit is None:
            if len(self._parse_memo) > PARSE_CACHE_ENTRIES:
                self._parse_memo.clear()
            hit = self._parse_memo[memo_key] = parse(entry)
        return cast(T, hit)

    def allocations(self) -> list[Allocation]:
        _, (entries,) = self.store.read_prefixes([self.keys.allocations_prefix])
        return [Allocation.from_json(e.value) for e in entries]

    def get_allocation(self, alloc_id: str) -> Allocation:
        """The allocation as etcd has it now; NotFound if it is gone."""
        entry = self.store.get(self.keys.allocation(alloc_id))
        if entry is None:
            raise NotFound(f"allocation {alloc_id} does not exist: it was released, its lease expired, or the id "
                           f"is wrong")
        return Allocation.from_json(entry.value)

    def get_host(self, name: str) -> Host:
        entry = self.store.get(self.keys.host(name))
        if entry is None:
            raise NotFound(f"host {name} is not registered (never registered, or its heartbeat lease expired); "
                           f"register it again")
        return Host.from_json(entry.value)

    # ------------------------------------------------------------------ hosts
    def register_host(self, name: str, address: str, port: int, vgpu_count: int, gpus: Sequence[GpuSpec],
                      ttl_s: int | None = None) -> Host:
        """(Re-)register a host with exactly these GPUs, under a fresh lease; claims on it are kept.

        One transaction while the deletes of GPUs it no longer has and the puts fit etcd's limit; beyond it,
        several, the host record in the last: until then the pool may show part of the new list, which is
        harmless (a claim planned on it compares the records it used)."""
        k, t = self.keys, self.store.txn
        old = self.store.get(k.host(name))
        _, (old_gpus,) = self.store.read_prefixes([k.host_gpus_prefix(name)])
        lease, granted = self.store.grant(ttl_s or self.host_ttl_s)
        host = Host(name, address, port, vgpu_count, lease, time.time())
        new_keys = {k.gpu(name, g.index) for g in gpus}
        ops = [t.delete(e.key) for e in old_gpus if e.key not in new_keys]
        ops += [t.put(k.gpu(name, g.index), self._gpu(name, g, vgpu_count).to_json(), lease=lease) for g in gpus]
        ops.append(t.put(k.host(name), host.to_json(), lease=lease))
        chunk = min(self.max_txn_ops, REGISTRATION_CHUNK_OPS)
        for start in range(0, len(ops), chunk):
            self.store.transaction([], ops[start:start + chunk])
        if old is not None and old.lease and old.lease != lease:
            self.store.revoke(old.lease)
        if old is None:
            log.info("Adding new host for NVidia GPU : %s", name)
        for g in gpus:
            log.info("Adding new NVidia GPU to host %s (%s; %s)", name, g.uuid, g.name)
        log.info("Host %s registered with %d GPUs under lease %x (TTL %d s) in %d transaction(s)", name, len(gpus),
                 lease, granted, -(-len(ops) // chunk))
        return host

    def add_gpu(self, host_name: str, gpu: GpuSpec, port: int | None = None) -> Gpu:
        """Add or replace one GPU of a registered host (Orion's ``POST /device/info``), under the host's lease."""
        k, t = self.keys, self.store.txn
        for _ in range(CLAIM_ATTEMPTS):
            entry = self.store.get(k.host(host_name))
            if entry is None:
                raise NotFound(f"host {host_name} is not registered: send POST /heartbeat/{host_name}"
                               f"?res=nvidia_cuda&status=on first")
            host = Host.from_json(entry.value)
            record = self._gpu(host_name, gpu, host.vgpu_count)
            ops = [t.put(k.gpu(host_name, gpu.index), record.to_json(), lease=host.lease)]
            if port is not None and port != host.port:
                moved = Host(host.name, host.address, port, host.vgpu_count, host.lease, host.registered_at)
                ops.append(t.put(k.host(host_name), moved.to_json(), lease=host.lease))
            ok, _ = self.store.transaction([t.mod(k.host(host_name)) == entry.mod_revision], ops)
            if ok:
                log.info("Adding new NVidia GPU to host %s (%s; %s)", host_name, gpu.uuid, gpu.name)
                return record
        raise Contention(f"host {host_name} was re-registered repeatedly while adding GPU {gpu.index}; retry")

    def heartbeat(self, name: str) -> int:
        """Refresh a host's lease, and the leases of allocations its oriond has confirmed; the host's TTL."""
        host = self.get_host(name)
        ttl = self.store.refresh(host.lease)
        if ttl <= 0:
            raise NotFound(f"host {name}'s lease has expired; register it again (status=on)")
        _, (placed,) = self.store.read_prefixes([self.keys.host_placed_prefix(name)])
        for e in placed:
            mark = json.loads(e.value)
            if mark.get("confirmed"):
                self.store.refresh(int(mark["lease"]))
        return ttl

    def deregister(self, name: str) -> None:
        """Take a host out of the pool now (its GPUs go; allocations on it stay until released or expired)."""
        host = self.get_host(name)
        self.store.revoke(host.lease)
        log.info("Host %s unregistered", name)

    @staticmethod
    def _gpu(host: str, g: GpuSpec, default_vgpu_count: int) -> Gpu:
        return Gpu(host, g.index, g.uuid, g.name, g.memory_mib, g.vgpu_count or default_vgpu_count)

    # ------------------------------------------------------------------ allocations
    def allocate(self, count: int, memory_mib: int | None, ttl_s: int | None = None, client: str = "",
                 group_id: str = "", host: str = "", origin: str = "") -> Allocation:
        """Claim ``count`` vGPUs of ``memory_mib`` (None: each GPU's default) on one host (``host`` if named),
        under a new lease. ``origin``: the host whose oriond serves the asking guest, when it asks for vGPUs of any
        host (it relays the session); the allocation records it, else ``host`` (see Allocation).

        Raises BadRequest past ``max_vgpus``, Unsatisfiable (why the pool cannot), EtcdUnavailable, or
        Contention after bounded retries.
        """
        if not 1 <= count <= self.max_vgpus:
            raise BadRequest(f"{count} vGPUs in one allocation: the most is {self.max_vgpus}, since its claim is one "
                             f"etcd transaction of at most {self.max_txn_ops} operations; ask for fewer")
        self.cache.start()
        pending = self.store.grant_started(ttl_s or self.lease_ttl_s)
        try:
            alloc = self._claim(count, memory_mib, pending, client, group_id, host, origin or host)
        except BaseException:
            self._revoke_quietly(pending)
            raise
        log.info("Return formated resource : %s", alloc.orion_resource())
        return alloc

    def _claim(self, count: int, memory_mib: int | None, pending: PendingLease, client: str,
               group_id: str, host: str, origin: str) -> Allocation:
        deadline = time.monotonic() + CLAIM_DEADLINE_S
        alloc_id = secrets.token_hex(16)  # 128 random bits: the id is the guest's only proof that the grant is its
        fresh = False  # plan on the cache until it proves stale; from then on on fresh reads
        for attempt in range(CLAIM_ATTEMPTS):
            with self._claim_lock:
                cached = None if fresh else self.cache.view()
                fresh = cached is None
                view = cached if cached is not None else self.view()
                try:
                    placement = place(view, count, memory_mib, self.tiebreak_salt, host)
                except Unsatisfiable:
                    if fresh:
                        raise
                    fresh = True  # the cache may lack releases: only a fresh read may say no
                    continue
                lease, ttl = pending.result()
                alloc = replace(self._allocation(alloc_id, placement, lease, ttl, client, group_id), origin=origin)
                committed = self._commit(view, placement, alloc)
                if committed:
                    self.cache.wrote(committed)
                    return alloc
                self.conflicts += 1
                fresh = True
                log.debug("claim on %s lost a race (attempt %d); re-reading", placement.host.host.name, attempt + 1)
            if time.monotonic() > deadline:
                break
            time.sleep(random.uniform(0, 0.001 * (attempt + 1)))
        raise Contention(f"could not claim {count} vGPUs: other controllers changed the same GPUs on each of our "
                         f"attempts; retry the request")

    @staticmethod
    def _allocation(alloc_id: str, p: Placement, lease: int, ttl: int, client: str, group_id: str) -> Allocation:
        h = p.host.host
        grants = tuple(VgpuGrant(s.gpu.gpu.index, s.vgpu, s.gpu.gpu.uuid, s.memory_mib) for s in p.slots)
        return Allocation(alloc_id, h.name, h.address, h.port, grants, lease, ttl, time.time(), client, group_id)

    def _commit(self, view: PoolView, p: Placement, alloc: Allocation) -> int:
        """Make the placement one transaction: the revision it committed at, or 0 if the view was stale."""
        k, t = self.keys, self.store.txn
        host = alloc.host
        gpus = sorted({s.gpu.gpu.index for s in p.slots})
        compare = [t.mod(k.host(host)) == view.host_mod[host], t.version(k.allocation(alloc.id)) == 0]
        for g in gpus:
            prefix = k.gpu_claims_prefix(host, g)
            compare.append(t.mod(k.gpu(host, g)) == view.gpu_mod[(host, g)])
            compare.append(t.mod(prefix, range_end=prefix_range_end(prefix.encode())) < view.revision + 1)
        claims = [Claim(host, s.gpu.gpu.index, s.vgpu, alloc.id, s.memory_mib) for s in p.slots]
        compare += [t.version(k.claim(c.host, c.gpu, c.vgpu)) == 0 for c in claims]
        success = [t.put(k.claim(c.host, c.gpu, c.vgpu), c.value_json(), lease=alloc.lease) for c in claims]
        success += [t.put(k.allocation(alloc.id), alloc.to_json(), lease=alloc.lease),
                    t.put(k.placed(host, alloc.id), dumps({"lease": alloc.lease, "confirmed": False}),
                          lease=alloc.lease)]
        ok, revision = self.store.transaction(compare, success)
        return revision if ok else 0

    def keepalive(self, alloc_id: str) -> int:
        """Refresh an allocation's lease once; its TTL. NotFound if it is gone (released or expired)."""
        alloc = self._known_allocation(alloc_id)
        ttl = self.store.refresh(alloc.lease)
        if ttl <= 0:
            raise NotFound(f"allocation {alloc_id}'s lease has expired; its vGPUs are back in the pool")
        return ttl

    def confirm(self, alloc_id: str, host: str = "", relay: str = "", transport: str = "", session: str = "",
                relay_member: str = "") -> Allocation:
        """Bind an allocation to the one session that takes it up on its host's oriond; from now on that host's
        heartbeats keep it alive.

        ``host`` is the confirming oriond's host (over HTTP: the member that signed; "" here means the
        allocation's own): WrongHost if the vGPUs are on another. ``session`` (an id unique on that host) and
        ``relay_member`` (the member that relayed the session there; "" for a local session) name the session:
        Forbidden if it is not a session of the host the allocation was asked from or for (``origin``),
        AlreadyBound if another session took the allocation up. The same session confirming again is accepted.
        ``relay`` ("IP:PORT" of the relaying oriond) and ``transport`` say how a relayed session reaches this
        host (docs/remote.md); they are kept in ``extra`` until a later confirm of the session says otherwise."""
        k, t = self.keys, self.store.txn
        for _ in range(CLAIM_ATTEMPTS):
            entry = self.store.get(k.allocation(alloc_id))
            if entry is None:
                raise NotFound(f"allocation {alloc_id} does not exist (released or expired); request a new one")
            alloc = Allocation.from_json(entry.value)
            if host and host != alloc.host:
                raise WrongHost(f"allocation {alloc_id} was granted on host {alloc.host}, not {host}; the client "
                                f"must reach {alloc.host}'s oriond, or ask for vGPUs on {host}")
            binding = {"host": alloc.host, "session": session, "relay_member": relay_member}
            check_binding(alloc, binding)
            extra = {key: value for key, value in alloc.extra.items() if key not in ("relay", "transport")}
            extra.update({key: value for key, value in (("relay", relay), ("transport", transport)) if value})
            confirmed = replace(alloc, confirmed=True, extra=extra, bound_to=binding)
            # compared on the record's mod revision: of two confirms for different sessions, one binds, the other
            # re-reads, finds the allocation bound and is refused
            ok, _ = self.store.transaction(
                [t.mod(k.allocation(alloc_id)) == entry.mod_revision],
                [t.put(k.allocation(alloc_id), confirmed.to_json(), lease=alloc.lease),
                 t.put(k.placed(alloc.host, alloc_id), dumps({"lease": alloc.lease, "confirmed": True}),
                       lease=alloc.lease)])
            if ok:
                self.store.refresh(alloc.lease)
                devices = ",".join(f"{alloc.address}/{v.gpu}/{v.vgpu}" for v in alloc.vgpus)
                log.info("Confirm allocation %s with device : %s%s", alloc_id, devices,
                         f" (relayed from {relay}{f' over {transport}' if transport else ''})" if relay else "")
                return confirmed
        raise Contention(f"allocation {alloc_id} kept changing while being confirmed; retry")

    def release(self, alloc_id: str, member: str = "", session: str = "") -> Allocation:
        """Give an allocation's vGPUs back now (revoking its lease deletes its claims in one step).

        Anyone holding the id may (a guest gives its own grant back). A release signed by ``member`` is a GPU
        host giving back the grant of a session that ended: Forbidden if the allocation is bound to a session of
        another host, WrongSession if ``session`` is not the bound one, so a session that was refused the grant
        cannot release it under the session that holds it."""
        if member:
            alloc = self.get_allocation(alloc_id)  # the binding as etcd has it now, not as the copy last saw it
            check_release(alloc, member, session)
        else:
            alloc = self._known_allocation(alloc_id)
        revision = self.store.revoke(alloc.lease)
        if not revision:
            raise NotFound(f"allocation {alloc_id} had already expired; its vGPUs are back in the pool")
        self.cache.wrote(revision)
        log.info("Release resource with allocation ID %s", alloc_id)
        return alloc

    def _known_allocation(self, alloc_id: str) -> Allocation:
        """The allocation from the cache, else from etcd: for its lease, which never changes. Whatever is done
        with the lease goes to etcd, which says NotFound if the cache still had an allocation that is gone."""
        self.cache.start()
        return self.cache.allocation(alloc_id) or self.get_allocation(alloc_id)

    def _revoke_quietly(self, pending: PendingLease) -> None:
        """Undo a lease we granted; if etcd is down it expires by itself, so a failure here is only logged."""
        try:
            self.store.revoke(pending.result()[0])
        except Exception as exc:  # noqa: BLE001 - best effort on an error path; the lease has a TTL anyway
            log.warning("could not revoke an unused lease (%s); it expires by itself", exc)


