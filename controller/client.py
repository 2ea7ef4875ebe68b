"""ControllerClient: a small synchronous client of the controller's JSON API, standard library only.

For oriond (register GPUs, heartbeat), the guest runtime (allocate, keep alive, release) and tests/benchmarks.
It imports nothing outside the standard library so that it can be vendored into the ``orion-guest``
distribution, which must not pull aiohttp or etcd. One instance keeps one HTTP/1.1 connection: use one per
thread. Every call has a timeout; errors come back as ControllerClientError with the controller's one-line
reason, or with what to check when the controller cannot be reached.
"""
from __future__ import annotations

import http.client
import json
import socket
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote as _quote
from urllib.parse import urlsplit


class ControllerClientError(Exception):
    """A request failed. ``status`` is the HTTP status (0: no answer), ``code`` the controller's error word."""

    def __init__(self, status: int, code: str, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.code = code
        self.reason = reason


def quote(name: str) -> str:
    """A host or allocation name as one path segment: '/' is escaped too, so no name can reach another endpoint."""
    return _quote(name, safe="")


def _split(address: str) -> tuple[str, int]:
    split = urlsplit(address if "://" in address else f"http://{address}")
    if split.scheme != "http" or not split.hostname:
        raise ValueError(f"controller address {address!r}: use HOST:PORT, e.g. 127.0.0.1:9123")
    return split.hostname, split.port or 9123


class ControllerClient:
    """``ControllerClient("127.0.0.1:9123")``; methods mirror the JSON API (docs/controller.md)."""

    def __init__(self, address: str, timeout_s: float = 10.0) -> None:
        self.address = address
        self.host, self.port = _split(address)
        self.timeout_s = timeout_s
        self._conn: http.client.HTTPConnection | None = None

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> ControllerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, bytes]:
        """One request; (status, body). Retries once on a keep-alive connection the server had closed."""
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if data is not None else {}
        for attempt in (0, 1):
            if self._conn is None:
                self._conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
            try:
                self._conn.request(method, path, body=data, headers=headers)
                resp = self._conn.getresponse()
                return resp.status, resp.read()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as exc:
                self.close()
                if attempt:
                    raise ControllerClientError(0, "unreachable", f"controller {self.address} closed the "
                                                                  f"connection ({exc})") from None
            except (OSError, http.client.HTTPException) as exc:
                self.close()
                why = "timed out" if isinstance(exc, socket.timeout | TimeoutError) else str(exc)
                raise ControllerClientError(0, "unreachable",
                                            f"cannot reach the Orion Controller at {self.address} ({why}); check "
                                            f"that it runs there and ORION_CONTROLLER / controller_addr") from None
        raise AssertionError("unreachable")

    def _json(self, method: str, path: str, body: Any = None, expect: Sequence[int] = (200, 201)) -> Any:
        status, raw = self.request(method, path, body)
        try:
            data = json.loads(raw) if raw else {}
        except ValueError:
            data = {"error": "bad_response", "reason": raw.decode(errors="replace")[:200]}
        if status not in expect:
            raise ControllerClientError(status, data.get("error", f"http_{status}"),
                                        data.get("reason", f"HTTP {status}"))
        return data

    # pool and hosts
    def info(self) -> dict[str, Any]:
        return self._json("GET", "/api/v1/info")

    def health(self) -> dict[str, Any]:
        return self._json("GET", "/api/v1/health")

    def pool(self) -> dict[str, Any]:
        return self._json("GET", "/api/v1/pool")

    def register_host(self, host: str, gpus: Sequence[dict[str, Any]], port: int = 9960, vgpu_count: int = 4,
                      address: str | None = None, ttl_s: int | None = None) -> dict[str, Any]:
        """gpus: ``[{"uuid": "GPU-...", "name": "...", "memory_mib": 16160}, ...]`` (optional index, vgpu_count)."""
        body: dict[str, Any] = {"host": host, "port": port, "vgpu_count": vgpu_count, "gpus": list(gpus)}
        if address:
            body["address"] = address
        if ttl_s:
            body["ttl_s"] = ttl_s
        return self._json("POST", "/api/v1/hosts", body)

    def heartbeat(self, host: str) -> int:
        return int(self._json("POST", f"/api/v1/hosts/{quote(host)}/heartbeat")["ttl_s"])

    def unregister_host(self, host: str) -> None:
        self._json("DELETE", f"/api/v1/hosts/{quote(host)}")

    # allocations
    def allocate(self, vgpus: int, memory_mib: int | None = None, ttl_s: int | None = None,
                 client: str = "", host: str = "") -> dict[str, Any]:
        body: dict[str, Any] = {"vgpus": vgpus}
        if host:
            body["host"] = host
        if memory_mib is not None:
            body["memory_mib"] = memory_mib
        if ttl_s is not None:
            body["ttl_s"] = ttl_s
        if client:
            body["client"] = client
        return self._json("POST", "/api/v1/allocations", body)

    def allocation(self, alloc_id: str) -> dict[str, Any]:
        return self._json("GET", f"/api/v1/allocations/{quote(alloc_id)}")

    def allocations(self) -> list[dict[str, Any]]:
        return list(self._json("GET", "/api/v1/allocations")["allocations"])

    def keepalive(self, alloc_id: str) -> int:
        return int(self._json("POST", f"/api/v1/allocations/{quote(alloc_id)}/keepalive")["ttl_s"])

    def confirm(self, alloc_id: str, host: str = "") -> dict[str, Any]:
        """Take the allocation up on ``host`` (409 wrong_host if it was granted elsewhere)."""
        return self._json("POST", f"/api/v1/allocations/{quote(alloc_id)}/confirm", {"host": host} if host else None)

    def release(self, alloc_id: str) -> None:
        self._json("DELETE", f"/api/v1/allocations/{quote(alloc_id)}")
