"""The one client of the Orion Controller's HTTP API, standard library only.

Every program that talks to the controller uses it: oriond's link (register, heartbeat, release), its session
workers (confirm a grant), orion-smi, the guest runtime (allocate, keep alive, release at exit), orion-check
(Orion's plain-text ``/info`` and ``/devices``) and the tests and benchmarks. It lives in ivshmem/shared/, which both
wheels ship, because the ``orion-guest`` wheel needs it and must not pull the controller's aiohttp or etcd.

What belongs here: one HTTP/1.1 connection per instance (use one instance per thread), a timeout on every
socket operation, the address check, and one error, :class:`ControllerClientError`, carrying the HTTP status
(0: no answer) and a one-line reason. What does not: retries, backoff and what a caller prints; those are the
callers' policies (controller_link.py, allocation.py); and the cluster key. A member of the cluster (oriond)
gives the client a ``signer`` that adds the Authorization header of the member-only endpoints
(docs/security.md); it is made on the host side (host_agent/controller_link.Member, over controller/cluster_key),
since a guest never holds the key and the guest wheel must not import the controller.

Import cost matters, since a guest program imports this at start-up when Orion's environment is set:
``http.client`` and ``json`` (about 15 ms together) are imported at the first request, not here.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from .ini import host_port

if TYPE_CHECKING:
    import http.client

DEFAULT_TIMEOUT_S = 10.0
EXAMPLE = "127.0.0.1:9123"
CONFIGURED_BY = "ORION_CONTROLLER / controller_addr"  # where an address comes from, for the unreachable hint


class ControllerClientError(Exception):
    """A request failed. ``status`` is the HTTP status (0: no answer), ``code`` the controller's error word,
    ``reason`` one line for the user (the controller's reason, or what to check when it did not answer)."""

    def __init__(self, status: int, code: str, reason: str) -> None:
        reason = " ".join(str(reason).split())  # a foreign server's body may hold newlines: keep it one line
        super().__init__(reason)
        self.status = status
        self.code = code
        self.reason = reason


class Answer(NamedTuple):
    """One HTTP answer: its status, its body, and the ``ip:port`` that answered (where a later request can go
    without resolving the name again: a release at exit must not wait on a resolver)."""

    status: int
    body: bytes
    peer: str

    def json(self) -> dict[str, Any]:
        """The body as a JSON object; ``{"error": "bad_response", "reason": …}`` when it is not JSON, {} when it
        is JSON but no object."""
        import json

        try:
            data = json.loads(self.body) if self.body else {}
        except (ValueError, RecursionError):
            return {"error": "bad_response", "reason": self.body.decode(errors="replace")[:200]}
        return data if isinstance(data, dict) else {}

    def reason(self) -> str:
        """The controller's one-line reason for this answer, else ``HTTP <status>``."""
        return str(self.json().get("reason") or f"HTTP {self.status}")


class MemberSigner(Protocol):
    """What signs a member's requests: ``signer(method, path, body)`` is the Authorization header's value for
    that request (the path as sent, with its query; the body's exact bytes). ``member`` is the signer's name."""

    @property
    def member(self) -> str: ...

    def __call__(self, method: str, path: str, body: bytes) -> str: ...


def quote(name: str) -> str:
    """A host or allocation name as one path segment: '/' is escaped too, so no name can reach another endpoint."""
    from urllib.parse import quote as _quote

    return _quote(name, safe="")


def split_address(address: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``[IPv6]:PORT`` (an ``http://`` in front allowed) as (host, port), the port 1-65535
    (ini.host_port, the one parser); ValueError with one line otherwise. There is no default port: port 0 or
    none is a mistake, never Orion's 9123."""
    try:
        return host_port(address)
    except ValueError as exc:
        raise ValueError(f"controller address {address!r}: {exc}; use HOST:PORT, e.g. {EXAMPLE}") from None


def _address_of(sockaddr: tuple[Any, ...]) -> str:
    ip, port = sockaddr[0], sockaddr[1]
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


class ControllerClient:
    """``ControllerClient("127.0.0.1:9123")``; methods mirror the JSON API (docs/controller.md).

    ``via``: connect there instead (an ``ip:port`` an earlier :attr:`Answer.peer` gave), still naming
    ``address`` in errors. ``configured_by``: where the user set the address, named when it cannot be reached.
    ``signer``: a member's (oriond's) signer, which signs every request; None for a guest, whose requests go
    unsigned. A malformed address or ``via`` is a ValueError here, before any connection."""

    def __init__(self, address: str, timeout_s: float = DEFAULT_TIMEOUT_S, *, via: str = "",
                 configured_by: str = CONFIGURED_BY, signer: MemberSigner | None = None) -> None:
        self.address = address
        self.host, self.port = split_address(via or address)
        self.timeout_s = timeout_s
        self.configured_by = configured_by
        self.signer = signer
        self._conn: http.client.HTTPConnection | None = None

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> ControllerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _unreachable(self, exc: BaseException) -> ControllerClientError:
        why = "timed out" if isinstance(exc, TimeoutError) else str(exc) or type(exc).__name__
        return ControllerClientError(0, "unreachable", f"cannot reach the Orion Controller at {self.address} "
                                                       f"({why}); check that it runs there and {self.configured_by}")

    def request(self, method: str, path: str, body: Any = None,
                headers: Mapping[str, str] | None = None) -> Answer:
        """One request, whatever the status; ControllerClientError (status 0) only when nothing answered.
        A kept-alive connection the server had closed is retried once on a new one; a new one is never
        retried, so a request the controller may have acted on is not sent twice."""
        import http.client
        import json

        data = None if body is None else json.dumps(body).encode()
        sent = dict(headers or {})
        if data is not None:
            sent["Content-Type"] = "application/json"
        if self.signer is not None:
            sent["Authorization"] = self.signer(method, path, data or b"")
        while True:
            reused = self._conn is not None
            if self._conn is None:
                self._conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
            conn = self._conn
            try:
                conn.request(method, path, body=data, headers=sent)
                peer = _address_of(conn.sock.getpeername()) if conn.sock is not None else ""
                response = conn.getresponse()
                return Answer(response.status, response.read(), peer)
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as exc:
                self.close()
                if not reused:
                    raise self._unreachable(exc) from None
            except (OSError, http.client.HTTPException) as exc:
                self.close()
                raise self._unreachable(exc) from None

    def text(self, path: str, headers: Mapping[str, str] | None = None) -> str:
        """``GET path`` of one of Orion's plain-text endpoints: the body, stripped; ControllerClientError
        unless the status is 200."""
        answer = self.request("GET", path, headers=headers)
        body = answer.body.decode(errors="replace").strip()
        if answer.status != 200:
            raise ControllerClientError(answer.status, f"http_{answer.status}", f"HTTP {answer.status}: {body[:200]}")
        return body

    def _json(self, method: str, path: str, body: Any = None, expect: Sequence[int] = (200, 201)) -> Any:
        answer = self.request(method, path, body)
        data = answer.json()
        if answer.status not in expect:
            raise ControllerClientError(answer.status, str(data.get("error") or f"http_{answer.status}"),
                                        answer.reason())
        return data

    # pool and hosts
    def info(self) -> dict[str, Any]:
        return self._json("GET", "/api/v1/info")

    def health(self) -> dict[str, Any]:
        return self._json("GET", "/api/v1/health")

    def pool(self, host: str = "") -> dict[str, Any]:
        """The pool; with `host`, its ``hosts`` list holds that host alone (or nothing: not in the pool)."""
        return self._json("GET", "/api/v1/pool" + (f"?host={quote(host)}" if host else ""))

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
                 client: str = "", host: str = "", origin: str = "") -> dict[str, Any]:
        """``host``: only that host's vGPUs; ``origin``: the host whose oriond serves the asking guest (it relays
        the session), so that only a session of that host may take the grant up."""
        body: dict[str, Any] = {"vgpus": vgpus}
        if host:
            body["host"] = host
        if origin:
            body["origin"] = origin
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
        """Every allocation, ids included: for a member (a client with a signer). The controller answers anyone
        else counts only, which this says in one line (ControllerClientError, status 401)."""
        answer = self._json("GET", "/api/v1/allocations")
        if "allocations" not in answer:
            raise ControllerClientError(401, "member_only", f"the Orion Controller at {self.address} lists allocations "
                                        f"to members of the cluster only (requests signed with the cluster key); "
                                        f"it answered {answer.get('count', '?')} allocation(s)")
        return list(answer["allocations"])

    def allocation_count(self) -> int:
        """How many allocations the pool holds (what the controller tells anyone)."""
        answer = self._json("GET", "/api/v1/allocations")
        return len(answer["allocations"]) if "allocations" in answer else int(answer.get("count", 0))

    def keepalive(self, alloc_id: str) -> int:
        return int(self._json("POST", f"/api/v1/allocations/{quote(alloc_id)}/keepalive")["ttl_s"])

    def confirm(self, alloc_id: str, host: str = "", *, relay: str = "", transport: str = "", session: str = "",
                relay_member: str = "") -> dict[str, Any]:
        """Bind the allocation to one session of ``host`` (the signer's host; 409 wrong_host if it was granted
        elsewhere, already_bound if another session took it up): ``session`` is its id on that host,
        ``relay_member`` the member that relayed it here ("" for a local session), ``relay`` (the relaying
        oriond's IP:PORT) and ``transport`` ("tcp") how it travels. A member-only call: it needs a signer."""
        said = (("host", host), ("session", session), ("relay_member", relay_member), ("relay", relay),
                ("transport", transport))
        body = {key: value for key, value in said if value}
        return self._json("POST", f"/api/v1/allocations/{quote(alloc_id)}/confirm", body or None)

    def release(self, alloc_id: str, session: str = "") -> None:
        """Give the allocation back. ``session``: a GPU host's (signed) release for the session bound to it."""
        query = f"?session={quote(session)}" if session else ""
        self._json("DELETE", f"/api/v1/allocations/{quote(alloc_id)}{query}")
