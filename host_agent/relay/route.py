"""Whether a session on one of this host's regions is served here or relayed to a GPU host (docs/remote.md).

A session's loop (session_loop.RecordLoop.open) answers its opening records before anything can have touched a
GPU: HELLO (checked by the session's own handler, as always), AGENT_INFO, the wire diagnostics, and BIND; it asks
`RelayRoute` (its SessionRoute) where the session goes, and the route connects it. The route is decided by the
first of:
- BIND naming a controller allocation: the controller says which host it was granted on (`GET
  /api/v1/allocations/<id>`, asked of this oriond's own controller, never of an address the guest sends). This
  host's grant is taken up here, as before; another host's is relayed to that host's oriond, at the address and
  listen_port it registered, and that oriond confirms it with the controller;
- the first CUDA record: with `[server-relay] remote_addr` every session is relayed there (with the allocation
  its BIND brought, or none); otherwise the session is this host's, and the worker's loop serves the rest.

A relay answers BIND with the GPU host's own answer (or its refusal, in one line), so a guest cannot tell a
relayed session from a local one but by its speed. A GPU host that cannot be reached refuses BIND with the reason;
a fixed route that cannot be reached makes every CUDA call of the session answer CUDA_ERROR_DEVICE_UNAVAILABLE,
said once in the log.

AGENT_INFO on a host that only relays (a controller, but no GPU registered there) names the host "*": the guest
then asks the controller for vGPUs on any host (guest_runtime/allocation.serving_host).

Before anything is relayed, the two orionds prove to each other that they hold the cluster key (handshake.py,
docs/security.md): this end loads the key as the GPU host's listener does (controller/cluster_key.load_key, at each
dial, so a key file put right is used at once), names itself (`RelayRoute.member`) and refuses a GPU host that
cannot prove itself; the session then gets the refusal as any unreachable GPU host's.
"""
from __future__ import annotations

import logging
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from controller.cluster_key import DEFAULT_KEY_FILE, ClusterKeyError, load_key
from ivshmem.channel import Endpoint
from ivshmem.errors import RecordError
from ivshmem.record import AGENT_INFO_REPLY, RELAYING_AGENT, Status
from ivshmem.shared.controller_client import ControllerClient, ControllerClientError, split_address

from ..errors import RefusedError
from ..handler import Handler
from . import compiled_pump, handshake, transport
from .frames import (
    CONTROL_MAX,
    RELAY_ACCEPT,
    RELAY_ACCEPT_REPLY,
    RELAY_HELLO,
    RELAY_HELLO_REQUEST,
    ConnectionLost,
    FrameStream,
)
from .pool import PoolRelay
from .rdma_stream import RdmaLink, RdmaStream, RdmaUnavailable
from .relayed_session import Relay
from .stream_endpoint import StreamEndpoint
from .transport import TCP_ONLY, RdmaSettings

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 5.0  # the relay's silence bound: a GPU host that does not answer in this is unreachable
ACCEPT_TIMEOUT_S = 15.0  # RELAY_ACCEPT waits for its turn to start (at most 5 s), the grant's confirm (5 s), a worker
LOOKUP_TIMEOUT_S = 5.0


class RouteRefused(RefusedError):
    """The session cannot be relayed where it must go; the message is one line for the guest's user."""


@dataclass(frozen=True)
class RelayRoute:
    fixed: str = ""  # [server-relay] remote_addr (HOST:PORT): every session of this oriond is relayed there
    controller: str = ""  # this oriond's controller, where a grant's host is looked up ("" : none)
    host: str = ""  # this host's name in the controller's pool; "" when it registered no GPU (it only relays)
    rdma: RdmaSettings = TCP_ONLY  # whether this host offers RDMA for its relay connections
    key_file: Path = DEFAULT_KEY_FILE  # [cluster] key_file: the cluster key this end proves itself with
    member: str = ""  # this node's name in the handshake: the name oriond registers under; "": the host name

    def prepare(self) -> None:
        """session_loop.SessionRoute: the compiled pump, built (once, cached) and loaded before workers fork."""
        compiled_pump.PROGRAM.load()

    def agent_info(self) -> bytes:
        return AGENT_INFO_REPLY.encode(self.host or (RELAYING_AGENT if self.controller else ""), self.controller)

    def target_of(self, allocation: str) -> tuple[str, int] | None:
        """Where a session bringing `allocation` goes: the GPU host's (address, port), or None for this host."""
        if self.fixed:
            return split_address(self.fixed)
        if not self.controller:
            return None  # no controller to ask: the local BIND refuses the allocation in its own words
        try:
            with ControllerClient(self.controller, timeout_s=LOOKUP_TIMEOUT_S) as client:
                grant = client.allocation(allocation)
        except ControllerClientError as exc:
            raise RouteRefused(f"the Orion Controller at {self.controller} cannot say where allocation "
                               f"{allocation[:80]} is: {exc.reason}") from None
        if str(grant.get("host", "")) == self.host and self.host:
            return None
        try:
            return str(grant["address"]), int(grant["port"])
        except (KeyError, TypeError, ValueError):
            raise RouteRefused(f"the Orion Controller gave a malformed answer for allocation {allocation[:80]}") \
                from None

    def relay(self, target: tuple[str, int], hello: tuple[int, int, str, str], allocation: str, ring: Endpoint,
              handler: Handler, session: int) -> tuple[Relay, bytes]:
        """The session on `ring` relayed to `target` (the cluster-key handshake, RELAY_HELLO, RELAY_ACCEPT), with
        its page-locked pool kept here (relay/pool.py); and the GPU host's BIND answer (empty without an
        allocation). RouteRefused with the reason otherwise."""
        remote, bound = _dial(target, hello, allocation, self, session)
        return Relay(ring, remote, session, None, PoolRelay(getattr(handler, "pool", None), session)), bound

    def unreachable(self, why: str, ring: Endpoint, handler: Handler, session: int) -> Relay:
        """The session on `ring`, whose GPU host could not be reached (`why`): every CUDA call of it answers
        CUDA_ERROR_DEVICE_UNAVAILABLE."""
        return Relay(ring, None, session, why, PoolRelay(getattr(handler, "pool", None), session))


def host_name(otherwise: str) -> str:
    """This machine's host name where it can name a node in the relay handshake, else `otherwise` (a machine
    whose host name was never set says "(none)")."""
    name = socket.gethostname()
    return name if handshake.valid_name(name) else otherwise


def _credentials(route: RelayRoute) -> tuple[bytes, str]:
    """This end's cluster key and node name; RouteRefused saying what to fix when it has none it may use."""
    member = route.member or host_name(route.host or "localhost")
    if not handshake.valid_name(member):
        raise RouteRefused(f"this host's node name {member[:80]!r} cannot name it in the cluster: it must be a host "
                           f"name or address of at most {handshake.NAME_BYTES} characters")
    try:
        return load_key(route.key_file), member
    except ClusterKeyError as exc:
        raise RouteRefused(f"this host cannot relay sessions: {exc}") from None


def _dial(target: tuple[str, int], hello: tuple[int, int, str, str], allocation: str,
          route: RelayRoute, session: int) -> tuple[StreamEndpoint, bytes]:
    """Open the relay connection for a session: the cluster-key handshake, RELAY_HELLO, then the GPU host's
    RELAY_ACCEPT. The connection and the GPU host's BIND answer (empty without an allocation); RouteRefused with the
    reason otherwise."""
    where = f"{target[0]}:{target[1]}"
    key, member = _credentials(route)
    try:
        sock = socket.create_connection(target, timeout=CONNECT_TIMEOUT_S)
    except OSError as exc:
        raise RouteRefused(f"cannot reach the GPU host's oriond at {where}: {exc.strerror or exc}; check that it "
                           f"runs and that its bind_addr and listen_port are reachable from here") from None
    link = None
    try:
        try:
            handshake.prove(sock, key, member, where, time.monotonic() + handshake.HANDSHAKE_S)
        except handshake.HandshakeFailed as exc:
            raise RouteRefused(str(exc)) from None
        sock.settimeout(None)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # records are small; never delayed
        frames = FrameStream(sock)
        link, why_not = transport.prepare(sock, route.rdma)
        protocol, pid, client_host, calls = hello
        frames.send(1, RELAY_HELLO, RELAY_HELLO_REQUEST.encode(protocol, pid, client_host, calls, allocation,
                                                               link.offer() if link else b""))
        answer = frames.receive(timeout=ACCEPT_TIMEOUT_S, limit=CONTROL_MAX)
        if answer is None:
            raise RouteRefused(f"the GPU host's oriond at {where} did not answer within {ACCEPT_TIMEOUT_S:g} s")
        reason = bytes(answer.payload).decode(errors="replace")
        if answer.opcode != RELAY_ACCEPT:
            raise RouteRefused(f"{where} is not an Orion relay listener (it answered opcode {answer.opcode:#x})")
        if answer.status != Status.OK:
            raise RouteRefused(f"the GPU host {where} refused the session: {reason}")
        number, chosen, their_why, offer, bound = RELAY_ACCEPT_REPLY.decode(answer.payload)
        stream: FrameStream | RdmaStream = frames
        if chosen == "rdma" and link is not None:
            stream = transport.connect(link, offer, sock)
            how = f"rdma ({transport.describe(link)})"
        elif chosen == "tcp":
            how = f"tcp: {why_not or their_why}"
        else:
            raise RouteRefused(f"the GPU host {where} chose transport {chosen[:20]!r}, which this relay did not "
                               "offer")
    except (ConnectionLost, RecordError, RdmaUnavailable) as exc:
        _close(sock, link)
        raise RouteRefused(f"the relay connection to {where} failed: {exc}") from None
    except RouteRefused:
        _close(sock, link)
        raise
    if stream is frames and link is not None:
        link.close()
    log.info("session %d: relayed to %s (its session %d) over %s", session, where, number, how)
    return StreamEndpoint(stream, answer.generation), bytes(bound)


def _close(sock: socket.socket, link: RdmaLink | None) -> None:
    if link is not None:
        link.close()
    sock.close()
