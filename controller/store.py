"""The one connection to etcd: pyetcd (the maintained python-etcd3 fork) behind a few typed calls.

Why this module exists: every foreign error — pyetcd's exceptions, raw ``grpc.RpcError`` from streaming calls,
pyetcd's "failed node" ValueError — is translated here, once, into EtcdUnavailable with a message that says
which etcd and what to do. Every call has a deadline (``timeout_s``), so nothing waits on a dead etcd forever.

Two pyetcd defaults would make a controller stay broken after etcd comes back, so they are overridden: an
endpoint that failed once is shunned for 300 s (we retry at once), and grpc's reconnect backoff grows to
120 s (we cap it at 1 s). grpc's 4 MiB limit on a message received would fail every read of a pool larger than
that (about a thousand hosts of 8 GPUs, or three made-up hosts of 10,000), so reads may be up to 256 MiB.
Keys and what the transactions compare are the callers' business (keys.py, pool.py).

Watches are our own (``WatchStream``) rather than pyetcd's watcher, which drops etcd's cancellation of a watch
without telling its callback: a cache fed by a watch must learn at once that it stopped being fed.
"""
from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlsplit

import grpc
from pyetcd import etcdrpc
from pyetcd import exceptions as etcd_exc
from pyetcd.client import Endpoint, MultiEndpointEtcd3Client
from pyetcd.etcdrpc import kv_pb2
from pyetcd.utils import prefix_range_end

from controller.errors import EtcdRefused, EtcdUnavailable

log = logging.getLogger(__name__)

T = TypeVar("T")

MAX_READ_BYTES = 256 << 20  # one read of the whole pool; grpc's default, 4 MiB, is about 1,000 hosts of 8 GPUs

_GRPC_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.max_receive_message_length", MAX_READ_BYTES),
]


_OUTAGE_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED,
                 grpc.StatusCode.INTERNAL)


@dataclass(frozen=True)
class Entry:
    """One key as read: value, the revision it was last modified at, and its lease (0: none)."""

    key: str
    value: bytes
    mod_revision: int
    lease: int


@dataclass(frozen=True)
class Change:
    """One key as a watched revision left it: its new state, or ``deleted`` (then only the key and the
    revision of the deletion are meaningful)."""

    entry: Entry
    deleted: bool


class WatchLost(Exception):
    """etcd ended a watch (its start revision was compacted away, or etcd cancelled it): whatever was built from
    the watch is incomplete from here on and must be read afresh."""


def parse_endpoints(url: str) -> list[tuple[str, int]]:
    """``http://host:port[,http://host:port...]`` → [(host, port)]; ValueError with a usable message."""
    endpoints = []
    for part in url.split(","):
        part = part.strip()
        split = urlsplit(part if "://" in part else f"http://{part}")
        if split.scheme != "http":
            raise ValueError(f"etcd endpoint {part!r}: only http:// endpoints are supported in this release")
        if not split.hostname:
            raise ValueError(f"etcd endpoint {part!r} has no host; use http://HOST:PORT")
        try:
            port = split.port or 2379
        except ValueError:
            raise ValueError(f"etcd endpoint {part!r} has a bad port; use http://HOST:PORT") from None
        endpoints.append((split.hostname, port))
    return endpoints


class PendingLease:
    """A lease grant in flight; ``result()`` waits (within the store's deadline) for (id, granted TTL)."""

    def __init__(self, store: EtcdStore, future: Any) -> None:
        self._store = store
        self._future = future
        self._result: tuple[int, int] | None = None

    def result(self) -> tuple[int, int]:
        if self._result is None:
            resp = self._store._call("lease grant", lambda: self._future.result(timeout=self._store.timeout_s))
            self._result = (int(resp.ID), int(resp.TTL))
        return self._result


class EtcdStore:
    """Typed etcd calls with bounded waits and translated errors; safe to share between threads."""

    def __init__(self, url: str, timeout_s: float = 3.0) -> None:
        self.url = url
        self.timeout_s = timeout_s
        parsed = parse_endpoints(url)
        # one endpoint: retry it at once; several: skip a failed one for a second so that calls fail over
        retry_s = 0.0 if len(parsed) == 1 else 1.0
        endpoints = [Endpoint(host, port, secure=False, time_retry=retry_s, opts=_GRPC_OPTIONS)
                     for host, port in parsed]
        self._client = MultiEndpointEtcd3Client(endpoints=endpoints, timeout=timeout_s,
                                                failover=len(endpoints) > 1)
        self._watches: set[WatchStream] = set()
        self._watches_lock = threading.Lock()
        self._closing: list[Callable[[], None]] = []
        self.closed = False

    def on_close(self, stop: Callable[[], None]) -> None:
        """Have ``close`` call ``stop`` first: a thread that uses this connection must be gone before the
        channel closes under it (grpc can crash the process otherwise)."""
        self._closing.append(stop)

    def close(self) -> None:
        """Stop what registered with ``on_close``, end open watches, then close the connection."""
        self.closed = True
        for stop in self._closing:
            stop()
        with self._watches_lock:
            watches = list(self._watches)
        for w in watches:
            w.close()
        self._client.close()

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except (etcd_exc.ConnectionFailedError, etcd_exc.NoServerAvailableError):
            raise self._unavailable(what, "connection failed") from None
        except etcd_exc.ConnectionTimeoutError:
            raise self._unavailable(what, f"no answer within {self.timeout_s:g} s") from None
        except etcd_exc.InternalServerError:
            raise self._unavailable(what, "internal error") from None
        except etcd_exc.Etcd3Exception as exc:
            raise EtcdRefused(f"etcd at {self.url} refused {what}: {type(exc).__name__} {exc}") from None
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else None
            if code in _OUTAGE_CODES:
                raise self._unavailable(what, f"grpc {code}") from None
            details = exc.details() if hasattr(exc, "details") else ""
            if "too many operations" in (details or ""):
                raise EtcdRefused(f"etcd at {self.url} refused {what}: {details}; orion-controller "
                                  f"--etcd-max-txn-ops must not be more than etcd's --max-txn-ops") from None
            raise EtcdRefused(f"etcd at {self.url} refused {what}: {code} {details}") from None
        except ValueError as exc:  # pyetcd: 'Trying to use a failed node'
            if "failed node" not in str(exc):
                raise
            raise self._unavailable(what, "endpoint marked failed") from None

    def _unavailable(self, what: str, why: str) -> EtcdUnavailable:
        # a watch is retried every second while etcd is down, and its owner reports the outage once
        log.log(logging.DEBUG if what == "watch" else logging.WARNING, "etcd %s failed: %s", what, why)
        return EtcdUnavailable(f"etcd at {self.url} is unreachable ({why} during {what}); start etcd there or "
                               f"point orion-controller --etcd at a running one")

    # reads
    def read_prefixes(self, prefixes: Sequence[str]) -> tuple[int, list[list[Entry]]]:
        """All keys under each prefix, read in one transaction so they share one revision.

        Built on pyetcd's generated stub rather than ``transaction()``, which wraps every key in a metadata
        object: for a pool of hundreds of claims that wrapping cost more than the read itself."""
        ops = [etcdrpc.RequestOp(request_range=etcdrpc.RangeRequest(key=p.encode(),
                                                                     range_end=prefix_range_end(p.encode())))
               for p in prefixes]
        client = self._client

        def run() -> tuple[int, list[list[Entry]]]:
            resp = client.kvstub.Txn(etcdrpc.TxnRequest(compare=[], success=ops, failure=[]), self.timeout_s,
                                     credentials=client.call_credentials, metadata=client.metadata)
            return int(resp.header.revision), [
                [Entry(kv.key.decode(), kv.value, kv.mod_revision, kv.lease) for kv in r.response_range.kvs]
                for r in resp.responses]

        return self._call("read", run)

    def get(self, key: str) -> Entry | None:
        def run() -> Entry | None:
            value, meta = self._client.get(key)
            if meta is None:
                return None
            return Entry(key, value, meta.mod_revision, meta.lease_id)

        return self._call("get", run)

    def watch(self, prefix: str, start_revision: int = 0) -> WatchStream:
        """Follow every change under ``prefix`` from ``start_revision`` on (0: from the next one; see
        WatchStream)."""
        stream = WatchStream(self, prefix, start_revision)
        with self._watches_lock:
            if not self.closed:
                self._watches.add(stream)
        if self.closed:
            stream.close()
        return stream

    def _forget(self, stream: WatchStream) -> None:
        with self._watches_lock:
            self._watches.discard(stream)

    # writes
    def transaction(self, compare: list[Any], success: list[Any]) -> tuple[bool, int]:
        """Commit ``success`` if every comparison holds: (whether it did, the revision etcd answered at; for a
        committed transaction that writes, the revision of its writes). Built on the generated stub because
        pyetcd's ``transaction()`` drops the response header, and with it the revision; pyetcd still turns the
        operations into requests."""
        client = self._client
        request = etcdrpc.TxnRequest(compare=[c.build_message() for c in compare],
                                     success=client._ops_to_requests(success), failure=[])

        def run() -> tuple[bool, int]:
            resp = client.kvstub.Txn(request, self.timeout_s, credentials=client.call_credentials,
                                     metadata=client.metadata)
            return bool(resp.succeeded), int(resp.header.revision)

        return self._call("transaction", run)

    def put(self, key: str, value: str, lease: int = 0) -> None:
        self._call("put", lambda: self._client.put(key, value, lease=lease or None))

    # leases
    def grant(self, ttl_s: int) -> tuple[int, int]:
        """A new lease: (id, granted TTL); etcd may round a short TTL up to its minimum."""
        lease = self._call("lease grant", lambda: self._client.lease(ttl_s))
        return int(lease.id), int(lease.ttl)

    def grant_started(self, ttl_s: int) -> PendingLease:
        """Start granting a lease without waiting: the allocation path overlaps it with its pool read."""
        client = self._client
        request = etcdrpc.LeaseGrantRequest(TTL=ttl_s)
        future = self._call("lease grant", lambda: client.leasestub.LeaseGrant.future(
            request, self.timeout_s, credentials=client.call_credentials, metadata=client.metadata))
        return PendingLease(self, future)

    def revoke(self, lease_id: int) -> int:
        """Revoke a lease (and delete its keys): the revision of the deletion, or 0 if it had already expired."""
        client = self._client
        request = etcdrpc.LeaseRevokeRequest(ID=lease_id)

        def run() -> int:
            try:
                resp = client.leasestub.LeaseRevoke(request, self.timeout_s, credentials=client.call_credentials,
                                                    metadata=client.metadata)
            except grpc.RpcError as exc:
                if exc.code() == grpc.StatusCode.NOT_FOUND:
                    return 0
                raise
            return int(resp.header.revision)

        return self._call("lease revoke", run)

    def refresh(self, lease_id: int) -> int:
        """Keep a lease alive once; its TTL now, or 0 if it has expired (or never existed)."""
        def run() -> int:
            ttl = 0
            for resp in self._client.refresh_lease(lease_id):
                ttl = int(resp.TTL)
            return ttl

        return self._call("lease keepalive", run)

    def healthy(self) -> None:
        """Raise EtcdUnavailable unless etcd answers a status request."""
        self._call("status", self._client.status)

    @property
    def txn(self) -> Any:
        """pyetcd's comparison and operation builders (value, version, mod, put, delete...)."""
        return self._client.transactions


class WatchStream:
    """One etcd watch of a prefix, from a start revision, on a stream of its own.

    Iterating yields, per etcd response, the changes of whole revisions in revision order (etcd never splits a
    revision between responses); an empty list means "watching" (the watch was created, or etcd reported
    progress). Iteration raises WatchLost when etcd ends the watch, EtcdUnavailable when the stream breaks, and
    simply stops after ``close()``.
    """

    def __init__(self, store: EtcdStore, prefix: str, start_revision: int) -> None:
        self._store = store
        self._closed = False
        self._requests: queue.SimpleQueue[etcdrpc.WatchRequest | None] = queue.SimpleQueue()
        key = prefix.encode()
        self._requests.put(etcdrpc.WatchRequest(create_request=etcdrpc.WatchCreateRequest(
            key=key, range_end=prefix_range_end(key), start_revision=start_revision)))
        client = store._client
        self._responses = store._call("watch", lambda: etcdrpc.WatchStub(client.channel).Watch(
            iter(self._requests.get, None), credentials=client.call_credentials, metadata=client.metadata))

    def __iter__(self) -> Iterator[list[Change]]:
        while True:
            resp = self._store._call("watch", self._next)
            if resp is None:
                if self._closed:
                    return
                raise WatchLost("etcd ended the watch stream")
            if resp.compact_revision:
                raise WatchLost(f"etcd compacted its history up to revision {resp.compact_revision}")
            if resp.canceled:
                raise WatchLost(f"etcd cancelled the watch ({resp.cancel_reason or 'no reason given'})")
            yield [Change(Entry(e.kv.key.decode(), e.kv.value, e.kv.mod_revision, e.kv.lease),
                          e.type == kv_pb2.Event.DELETE) for e in resp.events]

    def _next(self) -> Any:
        """The next response; None when the stream ended or we closed it (a cancelled call is not an outage)."""
        try:
            return next(self._responses)
        except StopIteration:
            return None
        except grpc.RpcError:
            if self._closed:
                return None
            raise

    def close(self) -> None:
        self._closed = True
        self._requests.put(None)
        self._responses.cancel()
        self._store._forget(self)


def connect(url: str, timeout_s: float = 3.0) -> EtcdStore:
    """An EtcdStore for ``url``; ValueError (with what to type instead) for a malformed URL."""
    return EtcdStore(url, timeout_s)


