"""The one connection to etcd: pyetcd (the maintained python-etcd3 fork) behind a few typed calls.

Why this module exists: every foreign error — pyetcd's exceptions, raw ``grpc.RpcError`` from streaming calls,
pyetcd's "failed node" ValueError — is translated here, once, into EtcdUnavailable with a message that says
which etcd and what to do. Every call has a deadline (``timeout_s``), so nothing waits on a dead etcd forever.

Two pyetcd defaults would make a controller stay broken after etcd comes back, so they are overridden: an
endpoint that failed once is shunned for 300 s (we retry at once), and grpc's reconnect backoff grows to
120 s (we cap it at 1 s). Keys and what the transactions compare are the callers' business (keys.py, pool.py).
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlsplit

import grpc
from pyetcd import etcdrpc
from pyetcd import exceptions as etcd_exc
from pyetcd.client import Endpoint, MultiEndpointEtcd3Client
from pyetcd.utils import prefix_range_end

from controller.errors import EtcdRefused, EtcdUnavailable

log = logging.getLogger(__name__)

T = TypeVar("T")

_GRPC_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
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

    def close(self) -> None:
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
            raise EtcdRefused(f"etcd at {self.url} refused {what}: {code} {details}") from None
        except ValueError as exc:  # pyetcd: 'Trying to use a failed node'
            if "failed node" not in str(exc):
                raise
            raise self._unavailable(what, "endpoint marked failed") from None

    def _unavailable(self, what: str, why: str) -> EtcdUnavailable:
        log.warning("etcd %s failed: %s", what, why)
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

    # writes
    def transaction(self, compare: list[Any], success: list[Any], failure: list[Any] | None = None
                    ) -> tuple[bool, list[Any]]:
        return self._call("transaction", lambda: self._client.transaction(compare=compare, success=success,
                                                                            failure=failure or []))

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

    def revoke(self, lease_id: int) -> bool:
        """Revoke a lease (and delete its keys); False if it had already expired."""
        def run() -> bool:
            try:
                self._client.revoke_lease(lease_id)
            except grpc.RpcError as exc:
                if exc.code() == grpc.StatusCode.NOT_FOUND:
                    return False
                raise
            return True

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


def connect(url: str, timeout_s: float = 3.0) -> EtcdStore:
    """An EtcdStore for ``url``; ValueError (with what to type instead) for a malformed URL."""
    return EtcdStore(url, timeout_s)


