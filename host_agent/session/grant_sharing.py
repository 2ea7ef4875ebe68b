"""A controller grant shared by a process and the processes it starts (docs/controller.md).

Orion's guide trains with `ORION_VGPU=4` and four ranks that the first process starts, one per device. Each rank
inherits `ORION_VGPU=4`; asked of the controller, four ranks would want sixteen vGPUs. So a process that took up a
grant offers it to the processes it starts: its driver asks its session's worker for a token (GRANT_SHARE) and puts
it in its environment (`ORION_GRANT`), and a process that finds one there joins that grant (GRANT_JOIN) instead of
asking the controller. Its session gets the holder's vGPUs with their quotas and slots, and no allocation of its own.

Trust: the token is the holding worker's pid and a 128-bit secret. The holding worker hands the grant over on a
host-local abstract socket (`orion-grants-<pid>`) only to a worker of its own uid, for that secret, for a session of
its own region (another guest's region never matches), and never for a relayed session, whose guest the GPU host
cannot tell (docs/security.md). The joining worker keeps that connection open: when the holding worker ends (its
process ended; oriond then gives the grant back), the joined worker ends too, its session with reason GRANT_ENDED
(CUDA_ERROR_DEVICE_UNAVAILABLE in the guest), so no session outlives the grant it uses.

Each vGPU of a grant is used by one session at a time, as CUDA's exclusive-process compute mode has it: a session
claims a vGPU at its first context there (an abstract socket named by a hash of the grant's secret and the vGPU's
ordinal, held until the worker ends: /proc/net/unix shows bound names to any local user, and one name tells nothing
of another vGPU's), and a context of another session on a claimed vGPU answers CUDA_ERROR_DEVICE_UNAVAILABLE. So
each vGPU's quota is counted by one worker, as before. Not here: the opcodes' decoding (executor.py), the quota.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import re
import socket
import struct
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from ivshmem.record import GRANT_SHARE_REPLY, Status

from ..handler import Reply, Session, refused
from ..limits import one_line
from .session_ledger import SessionLedger
from .shared_handles import listen_abstract, peer_credentials, receive_exactly
from .vgpu_grant import Grant

log = logging.getLogger(__name__)

EXIT_GRANT_ENDED = 7  # a joined session's worker's exit code once its holder ended (region_server.EXIT_REASONS)

ASK_TIMEOUT_S = 5.0
MAX_JOINED = 256  # sessions joined to one holder at once (a region has at most this many channels)
MAX_REGION_NAME = 1024
MAX_GRANT_BYTES = 64 << 10
TOKEN = re.compile(r"^([1-9][0-9]{0,9})-([0-9a-f]{32})$")
REQUEST = struct.Struct("<16sH")  # the secret, the length of the region name that follows (UTF-8)
ANSWER = struct.Struct("<BI")  # 1 given (0 refused), the length of the grant's JSON that follows


def socket_name(pid: int) -> str:
    """The abstract UNIX socket on which worker `pid` hands its grant to its guest's other processes."""
    return f"\0orion-grants-{pid}"


def encode(grant: Grant) -> bytes:
    """What a joining session takes up of the holder's grant: its allocation, its vGPUs' GPUs, quotas and slots."""
    return json.dumps({"allocation": grant.allocation, "devices": grant.devices, "memory_mib": grant.memory_mib,
                       "slots": grant.slots}).encode()


def decode(data: bytes) -> Grant:
    """The grant `encode` sent; ValueError for anything of another shape."""
    try:
        fields = json.loads(data)
        grant = Grant(str(fields["allocation"]), tuple(int(d) for d in fields["devices"]),
                      tuple(int(m) for m in fields["memory_mib"]), slots=tuple(int(s) for s in fields["slots"]))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ValueError(f"not a grant: {exc}") from None
    if not grant.devices or not len(grant.devices) == len(grant.memory_mib) == len(grant.slots):
        raise ValueError("not a grant: its vGPUs' lists differ in length")
    return grant


class _Holder:
    """This worker's grant, offered to the other processes of its guest (one listening socket, started at the first
    GRANT_SHARE; a daemon thread in accept, and one per joined session, which holds its connection)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.secret = b""
        self.grant: Grant | None = None
        self.region = ""
        self.joined = 0
        self._listener: socket.socket | None = None

    def share(self, grant: Grant, region: str, secret: bytes) -> str:
        """The token for `grant` of a session of `region` under `secret` (16 bytes); OSError where it cannot be
        offered."""
        with self.lock:
            if self._listener is None:
                self._listener = listen_abstract(socket_name(os.getpid()), self._serve_one, "grant-sharing")
            self.grant, self.region, self.secret = grant, region, secret
            return f"{os.getpid()}-{secret.hex()}"

    def _serve_one(self, peer: socket.socket) -> None:
        threading.Thread(target=self._answer, args=(peer,), name="grant-joined", daemon=True).start()

    def _answer(self, peer: socket.socket) -> None:
        """One joining worker: the grant, if it asks with the secret for a session of the grant's region and runs
        as this worker's user; then its connection is held until either end goes."""
        with peer:
            try:
                if peer_credentials(peer)[1] != os.geteuid():  # refused before a byte is read
                    peer.sendall(ANSWER.pack(0, 0))
                    return
                peer.settimeout(ASK_TIMEOUT_S)
                secret, length = REQUEST.unpack(receive_exactly(peer, REQUEST.size))
                region = receive_exactly(peer, length).decode() if length <= MAX_REGION_NAME else ""
                with self.lock:
                    grant = self.grant if (self.secret and hmac.compare_digest(secret, self.secret) and region
                                           and region == self.region and self.joined < MAX_JOINED) else None
                    self.joined += grant is not None
                if grant is None:
                    peer.sendall(ANSWER.pack(0, 0))
                    return
                try:
                    data = encode(grant)
                    peer.sendall(ANSWER.pack(1, len(data)) + data)
                    peer.settimeout(None)
                    while peer.recv(64):  # held: its end is the joined session's
                        pass
                finally:
                    with self.lock:
                        self.joined -= 1
            except (OSError, ValueError, struct.error, UnicodeDecodeError) as exc:
                log.debug("a request to join this session's grant ended early: %s", exc)


_HOLDER = _Holder()  # one per worker process (a session's worker serves one session)


def _forked() -> None:
    """A forked process holds none of its parent's grant, nor its socket, lock or threads."""
    global _HOLDER
    _HOLDER = _Holder()


os.register_at_fork(after_in_child=_forked)


def share(grant: Grant, region: str, secret: bytes) -> str:
    """GRANT_SHARE: the token the holder's processes pass on (OSError where the grant cannot be offered)."""
    return _HOLDER.share(grant, region, secret)


def join(token: str, region: str, on_end: Callable[[], None]) -> tuple[Grant, bytes]:
    """GRANT_JOIN: the grant the token's holder gives a session of `region`, and its secret (the claims' key);
    `on_end` runs (on a thread of its own) when the holder's worker ends. Raises ValueError with the reason, for
    the guest, when it gives none."""
    found = TOKEN.match(token)
    if found is None:
        raise ValueError(f"{token[:80]!r} is not a grant token (ORION_GRANT holds one the process that shared its "
                         f"vGPUs put there)")
    pid, secret = int(found.group(1)), bytes.fromhex(found.group(2))
    name = region.encode()
    peer = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        peer.settimeout(ASK_TIMEOUT_S)
        peer.connect(socket_name(pid))
        if peer_credentials(peer)[:2] != (pid, os.geteuid()):  # a name another process took first: told nothing
            raise ValueError("the grant's holder is not a worker of this host agent")
        peer.sendall(REQUEST.pack(secret, len(name)) + name)
        given, length = ANSWER.unpack(receive_exactly(peer, ANSWER.size))
        if not given or length > MAX_GRANT_BYTES:
            raise ValueError("the process that shared it does not share it with this session")
        grant = decode(receive_exactly(peer, length))
    except OSError as exc:
        peer.close()
        raise ValueError(f"the process that shared it is gone ({exc.strerror or exc})") from None
    except (ValueError, struct.error) as exc:
        peer.close()
        raise ValueError(str(exc)) from None
    peer.settimeout(None)
    threading.Thread(target=_watch, args=(peer, on_end), name="grant-holder", daemon=True).start()
    return grant, secret


def _watch(peer: socket.socket, on_end: Callable[[], None]) -> None:
    """The holder's end of the connection: its end of file is the holder's."""
    with peer:
        try:
            while peer.recv(64):
                pass
        except OSError:
            pass
    on_end()


class VgpuClaims:
    """The vGPUs of a grant this session uses, each claimed at its first context here: one session at a time."""

    def __init__(self) -> None:
        self.key = b""  # the grant's secret ("": no grant, nothing to claim)
        self._held: dict[int, socket.socket] = {}

    def claim(self, ordinal: int) -> bool:
        """Whether this session may make a context on vGPU `ordinal`: it holds the vGPU, or now claimed it."""
        if not self.key or ordinal in self._held:
            return True
        claim = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        name = hashlib.sha256(self.key + ordinal.to_bytes(4, "little")).hexdigest()[:40]
        try:
            claim.bind(f"\0orion-vgpu-{name}")
        except OSError:
            claim.close()
            return False
        self._held[ordinal] = claim
        return True


class GrantSharingCalls:
    """GRANT_SHARE and GRANT_JOIN, and the claim of a vGPU before a context is made on it. A CudaExecutor mixin."""

    # CudaExecutor's, set in its __init__
    grant: Grant | None
    relayed: bool
    session: Session
    ledger: SessionLedger
    claims: VgpuClaims

    if TYPE_CHECKING:  # executor.py
        def _may_take_up(self, what: str) -> Reply | None: ...
        def _place(self, grant: Grant, key: bytes) -> Reply: ...

    def _grant_share(self, payload: bytes | bytearray) -> Reply:
        if len(payload):
            return Reply(Status.MALFORMED, f"GRANT_SHARE carries no payload, not {len(payload)} bytes".encode())
        if self.relayed:
            return refused("a relayed session's vGPUs are not shared: the GPU host cannot tell its guest's processes "
                           "from another guest's")
        if self.grant is None:
            return refused("this session took up no controller grant to share (BIND comes first)")
        try:
            token = share(self.grant, self.session.region, self.claims.key)
        except OSError as exc:
            log.warning("session %d: cannot offer its grant to its guest's other processes: %s", self.session.number,
                        exc)
            return refused(f"the host agent cannot offer this session's grant: {exc}")
        return Reply(0, GRANT_SHARE_REPLY.encode(token))

    def _grant_join(self, token: str) -> Reply:
        """Take up the grant of the process that shared it: its vGPUs become this session's, with their quotas."""
        refusal = self._may_take_up("GRANT_JOIN")
        if refusal is not None:
            return refusal
        if self.relayed:
            return refused("a relayed session cannot join another session's vGPUs")
        try:
            grant, key = join(token, self.session.region, _grant_ended)
        except ValueError as exc:
            return refused(one_line(f"cannot join the vGPUs of the process that shared them: {exc}"))
        log.info("session %d: joined allocation %s of the process that shared it (%d vGPUs)", self.session.number,
                 grant.allocation, len(grant.devices))
        return self._place(grant, key)

    def _claimed(self, ordinal: int) -> bool:
        """Whether this session may make a context on vGPU `ordinal` (a valid one: the claim of its grant's vGPU)."""
        return not 0 <= ordinal < len(self.ledger.devices) or self.claims.claim(ordinal)


def _grant_ended() -> None:
    """The holder's worker ended: so does this one, its session with reason GRANT_ENDED (region_server.py)."""
    log.warning("the process whose vGPUs this session joined ended, and gave them back: this session ends too")
    for handler in logging.getLogger().handlers:
        handler.flush()
    os._exit(EXIT_GRANT_ENDED)
