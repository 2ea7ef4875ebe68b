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

Every session of a grant may use each of its vGPUs, as processes share a GPU natively (PyTorch's ranks each retain
device 0's primary context at start, whatever device they then train on): a vGPU's quota bounds what the grant's
sessions count on it together, through the usage table the holder hands over with the grant (grant_usage.py).
Not here: the opcodes' decoding (executor.py), the quota's decisions (vgpu_quota.py).
"""
from __future__ import annotations

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
from .grant_usage import UsageBoard
from .shared_handles import listen_abstract, peer_credentials, receive_exactly
from .vgpu_grant import Grant
from .vgpu_quota import VgpuQuota

log = logging.getLogger(__name__)

EXIT_GRANT_ENDED = 7  # a joined session's worker's exit code once its holder ended (region_server.EXIT_REASONS)

ASK_TIMEOUT_S = 5.0
MAX_REGION_NAME = 1024
MAX_GRANT_BYTES = 64 << 10
TOKEN = re.compile(r"^([1-9][0-9]{0,9})-([0-9a-f]{32})$")
REQUEST = struct.Struct("<16sH")  # the secret, the length of the region name that follows (UTF-8)
ANSWER = struct.Struct("<BIH")  # 1 given (0 refused), the length of the grant's JSON that follows, the usage row
# (with the usage table's descriptor, SCM_RIGHTS, when given)


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
    GRANT_SHARE; a daemon thread in accept, and one per joined session, which holds its connection), and the table
    of what each of the grant's sessions counts (grant_usage.py: row 0 is this worker's)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.secret = b""
        self.grant: Grant | None = None
        self.region = ""
        self.board: UsageBoard | None = None
        self.rows = {0}  # the usage rows given and not yet cleared
        self._listener: socket.socket | None = None

    def share(self, grant: Grant, region: str, secret: bytes) -> tuple[str, UsageBoard]:
        """The token for `grant` of a session of `region` under `secret` (16 bytes), and the grant's usage table;
        OSError where it cannot be offered."""
        with self.lock:
            if self.board is None:
                self.board = UsageBoard.create(len(grant.devices))
            if self._listener is None:
                self._listener = listen_abstract(socket_name(os.getpid()), self._serve_one, "grant-sharing")
            self.grant, self.region, self.secret = grant, region, secret
            return f"{os.getpid()}-{secret.hex()}", self.board

    def _serve_one(self, peer: socket.socket) -> None:
        threading.Thread(target=self._answer, args=(peer,), name="grant-joined", daemon=True).start()

    def _answer(self, peer: socket.socket) -> None:
        """One joining worker: the grant and a usage row, if it asks with the secret for a session of the grant's
        region and runs as this worker's user; then its connection is held until either end goes, and its row is
        cleared."""
        with peer:
            try:
                if peer_credentials(peer)[1] != os.geteuid():  # refused before a byte is read
                    peer.sendall(ANSWER.pack(0, 0, 0))
                    return
                peer.settimeout(ASK_TIMEOUT_S)
                secret, length = REQUEST.unpack(receive_exactly(peer, REQUEST.size))
                region = receive_exactly(peer, length).decode() if length <= MAX_REGION_NAME else ""
                with self.lock:
                    grant, board, row = self.grant, self.board, None
                    if (grant is not None and board is not None and self.secret
                            and hmac.compare_digest(secret, self.secret) and region and region == self.region):
                        row = board.give_row(self.rows)
                    if row is not None:
                        self.rows.add(row)
                if grant is None or board is None or row is None:
                    peer.sendall(ANSWER.pack(0, 0, 0))
                    return
                try:
                    data = encode(grant)
                    socket.send_fds(peer, [ANSWER.pack(1, len(data), row) + data], [board.descriptor])
                    peer.settimeout(None)
                    while peer.recv(64):  # held: its end is the joined session's
                        pass
                finally:
                    board.clear_row(row)
                    with self.lock:
                        self.rows.discard(row)
            except (OSError, ValueError, struct.error, UnicodeDecodeError) as exc:
                log.debug("a request to join this session's grant ended early: %s", exc)


_HOLDER = _Holder()  # one per worker process (a session's worker serves one session)


def _forked() -> None:
    """A forked process holds none of its parent's grant, nor its socket, lock or threads."""
    global _HOLDER
    _HOLDER = _Holder()


os.register_at_fork(after_in_child=_forked)


def share(grant: Grant, region: str, secret: bytes) -> tuple[str, UsageBoard]:
    """GRANT_SHARE: the token the holder's processes pass on, and the grant's usage table (OSError where the grant
    cannot be offered)."""
    return _HOLDER.share(grant, region, secret)


def join(token: str, region: str, on_end: Callable[[], None]) -> tuple[Grant, bytes, UsageBoard]:
    """GRANT_JOIN: the grant the token's holder gives a session of `region`, its secret, and this session's view of
    the grant's usage table; `on_end` runs (on a thread of its own) when the holder's worker ends. Raises ValueError
    with the reason, for the guest, when it gives none."""
    found = TOKEN.match(token)
    if found is None:
        raise ValueError(f"{token[:80]!r} is not a grant token (ORION_GRANT holds one the process that shared its "
                         f"vGPUs put there)")
    pid, secret = int(found.group(1)), bytes.fromhex(found.group(2))
    name = region.encode()
    peer = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    descriptors: list[int] = []
    try:
        peer.settimeout(ASK_TIMEOUT_S)
        peer.connect(socket_name(pid))
        if peer_credentials(peer)[:2] != (pid, os.geteuid()):  # a name another process took first: told nothing
            raise ValueError("the grant's holder is not a worker of this host agent")
        peer.sendall(REQUEST.pack(secret, len(name)) + name)
        head, descriptors, _flags, _address = socket.recv_fds(peer, ANSWER.size, 1)
        given, length, row = ANSWER.unpack(head + receive_exactly(peer, ANSWER.size - len(head)))
        if not given or length > MAX_GRANT_BYTES or len(descriptors) != 1:
            raise ValueError("the process that shared it does not share it with this session")
        grant = decode(receive_exactly(peer, length))
        board = UsageBoard(descriptors.pop(), len(grant.devices), row)
    except OSError as exc:
        _close(peer, descriptors)
        raise ValueError(f"the process that shared it is gone ({exc.strerror or exc})") from None
    except (ValueError, struct.error) as exc:
        _close(peer, descriptors)
        raise ValueError(str(exc)) from None
    peer.settimeout(None)
    threading.Thread(target=_watch, args=(peer, on_end), name="grant-holder", daemon=True).start()
    return grant, secret, board


def _close(peer: socket.socket, descriptors: list[int]) -> None:
    peer.close()
    for descriptor in descriptors:
        os.close(descriptor)


def _watch(peer: socket.socket, on_end: Callable[[], None]) -> None:
    """The holder's end of the connection: its end of file is the holder's."""
    with peer:
        try:
            while peer.recv(64):
                pass
        except OSError:
            pass
    on_end()


class GrantSharingCalls:
    """GRANT_SHARE and GRANT_JOIN. A CudaExecutor mixin."""

    # CudaExecutor's, set in its __init__
    grant: Grant | None
    relayed: bool
    session: Session
    grant_secret: bytes
    quota: VgpuQuota

    if TYPE_CHECKING:  # executor.py
        def _may_take_up(self, what: str) -> Reply | None: ...
        def _place(self, grant: Grant, secret: bytes) -> Reply: ...

    def _grant_share(self, payload: bytes | bytearray) -> Reply:
        if len(payload):
            return Reply(Status.MALFORMED, f"GRANT_SHARE carries no payload, not {len(payload)} bytes".encode())
        if self.relayed:
            return refused("a relayed session's vGPUs are not shared: the GPU host cannot tell its guest's processes "
                           "from another guest's")
        if self.grant is None:
            return refused("this session took up no controller grant to share (BIND comes first)")
        if self.quota.board is not None and self.quota.board.row != 0:
            return refused("a session that joined a grant does not share it again: its processes inherit the "
                           "holder's ORION_GRANT")
        try:
            token, board = share(self.grant, self.session.region, self.grant_secret)
            self.quota.share(board)
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
            grant, secret, board = join(token, self.session.region, _grant_ended)
        except ValueError as exc:
            return refused(one_line(f"cannot join the vGPUs of the process that shared them: {exc}"))
        log.info("session %d: joined allocation %s of the process that shared it (%d vGPUs)", self.session.number,
                 grant.allocation, len(grant.devices))
        reply = self._place(grant, secret)
        self.quota.share(board)
        return reply


def _grant_ended() -> None:
    """The holder's worker ended: so does this one, its session with reason GRANT_ENDED (region_server.py)."""
    log.warning("the process whose vGPUs this session joined ended, and gave them back: this session ends too")
    for handler in logging.getLogger().handlers:
        handler.flush()
    os._exit(EXIT_GRANT_ENDED)
