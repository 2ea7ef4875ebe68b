"""PoolCache: a copy of the pool (hosts, GPUs, claims, allocation leases) in memory, fed by one etcd watch.

Why: reading the whole pool from etcd was one of an allocation's round trips, and the largest. The cache lets
a claim be planned without that read, and a release find the allocation's lease without a get.

Why it cannot hand out a vGPU twice: it is only ever used to *plan*. The claim transaction (pool.py) still
insists that the host and GPU records are the ones the plan saw and that no claim on the touched GPUs changed
after the view's revision; a view that is behind only makes that transaction fail, and the retry reads etcd
itself. A plan that finds no room is checked against a fresh read too, since a view
that is behind may still hold claims already released.

Why the view it gives is exact at its revision: the cache first starts watching the key root, then reads it
at revision R, then applies the watched changes after R; it then holds the state at R plus every later
revision in order (etcd never splits a revision between watch responses). It is used only while that holds:
not until the read is done, and not from the moment the watch breaks (etcd restarted or unreachable, history
compacted under a watch that fell behind, watch cancelled); ``view`` and ``allocation`` then answer None and
the caller reads etcd. The cache then watches and reads anew (after 0.1 s, doubling to 1 s while that fails).
It never answers anything by itself: every caller's answer still rests on a round trip to etcd (the claim, the
revoke, the keep-alive), so an unreachable etcd is a 503 as before.

Read-your-writes: a controller that just claimed or released must not plan its next claim on a view that
lacks that write (it would lose the race to itself). ``wrote`` records the revision; ``view`` waits for the
watch to deliver it (briefly; a watch that stays behind for 2 s is restarted, as one that silently stopped).
"""
from __future__ import annotations

import logging
import threading
import time

from controller.errors import EtcdRefused, EtcdUnavailable
from controller.keys import Keys
from controller.model import Allocation, PoolView
from controller.pool_records import PoolRecords
from controller.store import Change, EtcdStore, WatchLost, WatchStream

log = logging.getLogger(__name__)

OWN_WRITE_WAIT_S = 0.05  # how long a claim waits for the watch to bring this controller's last write
STALL_S = 2.0  # a watch that has not delivered our own write after this long is restarted
RETRY_MIN_S, RETRY_MAX_S = 0.1, 1.0


class PoolCache:
    """The watch-fed copy of one key root; a daemon thread keeps it. Safe to share between threads."""

    def __init__(self, store: EtcdStore, keys: Keys) -> None:
        self.store = store
        self.keys = keys
        self.syncs = 0  # times the cache was (re)built from a read and started following the watch
        self._cond = threading.Condition()
        self._records: PoolRecords | None = None  # None: not following etcd, do not use
        self._revision = 0  # every change up to this revision is in _records
        self._floor = 0  # the newest revision this controller wrote; views must include it
        self._floor_since = 0.0  # when the oldest write not yet delivered was made
        self._stream: WatchStream | None = None
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"pool-cache {keys.root}", daemon=True)
        self._start_lock = threading.Lock()
        self._started = False
        store.on_close(self.close)

    def start(self) -> None:
        """Start following etcd, if not yet started (the first claim does this: a pool that never claims, or
        a controller that fails to start, needs no watch)."""
        if self._started:
            return
        with self._start_lock:
            if not self._started and not self._stopped.is_set():
                self._started = True
                self._thread.start()

    @property
    def synced(self) -> bool:
        with self._cond:
            return self._records is not None

    # ------------------------------------------------------------------ for the pool's callers
    def view(self) -> PoolView | None:
        """The pool at the newest revision the watch delivered, including this controller's own last write;
        None if the cache is not following etcd or stays behind that write (then read etcd instead)."""
        with self._cond:
            records = self._current_locked()
            return records.view(self._revision) if records is not None else None

    def allocation(self, alloc_id: str) -> Allocation | None:
        """The allocation as the watch last saw it, or None (not there, or the cache is not usable). Its lease
        id never changes, so an entry that is already gone in etcd only costs the caller a NotFound later."""
        with self._cond:
            records = self._current_locked()
            found = records.allocation(alloc_id) if records is not None else None
        return Allocation.from_json(found[1]) if found is not None else None

    def _current_locked(self) -> PoolRecords | None:
        """The records, once they include this controller's last write (waiting briefly); None if the cache
        is not following etcd or stays behind."""
        if self._records is not None and self._revision < self._floor:
            self._cond.wait_for(self._caught_up, OWN_WRITE_WAIT_S)
            if self._records is not None and self._revision < self._floor:
                if time.monotonic() - self._floor_since > STALL_S:
                    log.warning("the pool watch has not delivered revision %d for %.0f s; restarting it",
                                self._floor, STALL_S)
                    self._drop_locked()
                return None
        return self._records

    def _caught_up(self) -> bool:
        return self._records is None or self._revision >= self._floor

    def wrote(self, revision: int) -> None:
        """This controller wrote at ``revision``: later views must include it."""
        with self._cond:
            if self._revision >= self._floor:
                self._floor_since = time.monotonic()
            self._floor = max(self._floor, revision)

    def close(self) -> None:
        """Stop following etcd and wait (bounded by the store's deadline) for the thread to end."""
        with self._start_lock:
            self._stopped.set()
        with self._cond:
            self._drop_locked()
        if self._thread.is_alive():
            self._thread.join(self.store.timeout_s + 1)

    # ------------------------------------------------------------------ the watch thread
    def _run(self) -> None:
        backoff = RETRY_MIN_S
        while not self._stopped.is_set() and not self.store.closed:
            try:
                if self._follow():
                    backoff = RETRY_MIN_S
            except (EtcdUnavailable, EtcdRefused, WatchLost) as exc:
                # said once per outage: the retries that follow would repeat it every second
                (log.warning if backoff == RETRY_MIN_S else log.debug)(
                    "pool cache of %s is not following etcd (%s); claims read etcd meanwhile", self.keys.root, exc)
            except Exception:  # noqa: BLE001 - a bug here must not end the thread; claims read etcd meanwhile
                if self.store.closed:
                    return
                log.exception("pool cache of %s failed; claims read etcd meanwhile", self.keys.root)
            with self._cond:
                self._drop_locked()
            self._stopped.wait(backoff)
            backoff = min(2 * backoff, RETRY_MAX_S)

    def _follow(self) -> bool:
        """Watch the root, read it, then apply the watch until it ends; True if the cache was in use.

        The watch is created before the read, so every change after the read's revision reaches it; the
        changes it brings that the read already has are skipped."""
        stream = self._open_watch()
        with self._cond:
            if self._stopped.is_set():
                stream.close()
                return False
            self._stream = stream
        batches = iter(stream)
        if next(batches, None) is None:  # the watch is created once etcd answers; None: closed meanwhile
            return False
        revision, records = self._load()
        with self._cond:
            if self._stream is not stream:
                return False
            self._records, self._revision = records, revision
            self.syncs += 1
        log.info("pool cache of %s follows etcd from revision %d", self.keys.root, revision)
        for changes in batches:
            with self._cond:
                if self._stream is not stream:
                    break
                news = [c for c in changes if c.entry.mod_revision > self._revision]
                if news:
                    self._apply(records, news)
                    self._cond.notify_all()
        return True

    def _open_watch(self) -> WatchStream:
        """A watch of the whole key root from the next revision on."""
        return self.store.watch(self.keys.root)

    def _load(self) -> tuple[int, PoolRecords]:
        k = self.keys
        revision, groups = self.store.read_prefixes(
            [k.hosts_prefix, k.gpus_prefix, k.claims_prefix, k.allocations_prefix])
        records = PoolRecords(k)
        for entries in groups:
            for entry in entries:
                records.put(entry)
        return revision, records

    def _apply(self, records: PoolRecords, changes: list[Change]) -> None:
        """Apply whole revisions (the lock is held): the records are then exactly the pool at the last one."""
        for change in changes:
            if change.deleted:
                records.delete(change.entry.key)
            else:
                records.put(change.entry)
        self._revision = changes[-1].entry.mod_revision

    def _drop_locked(self) -> None:
        """Stop using the cache and end its watch (the thread then reads again, unless stopped)."""
        self._records = None
        self._cond.notify_all()
        if self._stream is not None:
            self._stream.close()
            self._stream = None
