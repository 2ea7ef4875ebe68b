"""SHARE_EXPORT and SHARE_IMPORT: cuMem physical memory shared between the sessions of one region (issue 32).

NCCL's P2P transport between two processes of one guest exports each buffer with cuMemExportToShareableHandle as a
POSIX file descriptor, passes it to the peer over a UNIX socket, and the peer imports it. Each of those processes is
a session with its own worker here, so the descriptor the driver exports lives in one worker and must reach the
other's driver. The guest's side (guest_runtime/native/shareable_handles.c) carries a token instead:

- SHARE_EXPORT of a session's CUmemGenericAllocationHandle: the driver exports it; this worker keeps the descriptor
  under a random 128-bit secret and answers the token (its own pid, the secret).
- SHARE_IMPORT of a token: the importing worker asks the exporting one (the token's pid) for the descriptor over a
  host-local UNIX socket (abstract, `orion-cumem-exports-<pid>`), saying which region its session is of; the exporter
  hands it over (SCM_RIGHTS) only to a process of its own user, for a secret it holds, to a session of its own region.
  The importer's driver imports it, and the new handle is the importing session's.

So a guest reaches memory another of its own processes exported, and nothing else: a token from another region, a
forged or stale one, or a relayed session (whose region the GPU host does not know) is CUDA_ERROR_INVALID_VALUE or
CUDA_ERROR_NOT_SUPPORTED. Imported memory counts against the exporter's quota only (the ledger never counts it). An
exported descriptor is kept until the session's worker exits (at most MAX_EXPORTS per session; past that
OUT_OF_MEMORY, as a driver out of descriptors answers), and the listening socket goes with it. Not here: the
executor's dispatch (executor.py), the guest's side.
"""
from __future__ import annotations

import logging
import os
import secrets
import socket
import struct
import threading
from typing import Any

from ivshmem.cuda_status import INVALID_VALUE, NOT_SUPPORTED, OUT_OF_MEMORY, SUCCESS
from ivshmem.driver_api import SHARE_EXPORT_REQUEST, SHARE_IMPORT_REQUEST, SHARE_REPLY
from ivshmem.errors import RecordError
from ivshmem.record import Status

from ..handler import Reply
from .session_ledger import SessionLedger

log = logging.getLogger(__name__)

POSIX_FILE_DESCRIPTOR = 1  # CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
MAX_EXPORTS = 4096
ASK_TIMEOUT_S = 5.0
REQUEST = struct.Struct("<16sH")  # the secret, the length of the region name that follows (UTF-8)
MAX_REGION_NAME = 1024
PHYSICAL = "CUmemGenericAllocationHandle"


def socket_name(pid: int) -> str:
    """The abstract UNIX socket on which worker `pid` hands out what it exported."""
    return f"\0orion-cumem-exports-{pid}"


class _Exports:
    """What this process exported, by secret: each descriptor kept open with the region of the session that made it,
    offered to other workers on one listening socket (started at the first export; a daemon thread in accept)."""

    def __init__(self) -> None:
        self.held: dict[bytes, tuple[int, str]] = {}  # secret -> (the driver's descriptor, its session's region)
        self.lock = threading.Lock()
        self._listener: socket.socket | None = None

    def add(self, descriptor: int, region: str) -> bytes:
        """Keep `descriptor` for `region`'s sessions; its secret. OSError where it cannot be offered."""
        with self.lock:
            if self._listener is None:
                listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
                listener.bind(socket_name(os.getpid()))
                listener.listen(16)
                self._listener = listener
                threading.Thread(target=self._serve, args=(listener,), name="cumem-exports", daemon=True).start()
            secret = secrets.token_bytes(16)
            self.held[secret] = (descriptor, region)
            return secret

    def duplicate(self, secret: bytes, region: str) -> int | None:
        """A new descriptor for `secret`'s export, if a session of `region` made it."""
        with self.lock:
            descriptor, owner = self.held.get(secret, (-1, ""))
            return os.dup(descriptor) if descriptor >= 0 and owner == region else None

    def _serve(self, listener: socket.socket) -> None:
        while True:
            try:
                peer, _ = listener.accept()
            except OSError:
                return
            with peer:
                try:
                    self._answer(peer)
                except (OSError, ValueError, struct.error) as exc:
                    log.debug("a request for exported memory ended early: %s", exc)

    def _answer(self, peer: socket.socket) -> None:
        """One request: the descriptor for a secret held here, to a process of this one's user asking for a session
        of the export's region; anything else gets a refusal and nothing."""
        uid = struct.unpack("3i", peer.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[1]
        if uid != os.geteuid():  # refused before a byte is read: another user cannot hold this thread
            peer.sendall(b"\0")
            return
        peer.settimeout(ASK_TIMEOUT_S)
        secret, length = REQUEST.unpack(_receive(peer, REQUEST.size))
        region = _receive(peer, length).decode() if length <= MAX_REGION_NAME else ""
        descriptor = self.duplicate(secret, region) if region else None
        if descriptor is None:
            peer.sendall(b"\0")
            return
        try:
            socket.send_fds(peer, [b"\1"], [descriptor])
        finally:
            os.close(descriptor)


_EXPORTS = _Exports()  # one per worker process (a session's worker serves one session)


def _forked() -> None:
    """A forked process holds none of its parent's exports, nor its socket, lock or thread."""
    global _EXPORTS
    _EXPORTS = _Exports()


os.register_at_fork(after_in_child=_forked)


class SharedHandles:
    """One session's exports and imports."""

    def __init__(self, driver: Any, ledger: SessionLedger, region: str, relayed: bool) -> None:
        self._driver, self._ledger, self._region, self._relayed = driver, ledger, region, relayed
        self._exported = 0

    def export(self, payload: bytes) -> Reply:
        try:
            handle, flags, handle_type = SHARE_EXPORT_REQUEST.decode(payload)
        except RecordError as exc:
            return Reply(Status.MALFORMED, str(exc).encode())
        if self._relayed or handle_type != POSIX_FILE_DESCRIPTOR:
            return Reply(NOT_SUPPORTED)
        if handle not in self._ledger.handles[PHYSICAL]:
            return Reply(INVALID_VALUE)  # not the session's memory: what the driver says of a handle it does not know
        if self._exported >= MAX_EXPORTS:
            return Reply(OUT_OF_MEMORY)
        driver = self._driver
        err, descriptor = driver.cuMemExportToShareableHandle(
            handle, driver.CUmemAllocationHandleType(POSIX_FILE_DESCRIPTOR), flags)
        if int(err) != SUCCESS:
            return Reply(int(err))
        try:
            secret = _EXPORTS.add(int(descriptor), self._region)
        except OSError as exc:
            os.close(int(descriptor))
            log.warning("cannot offer exported memory to the region's other sessions: %s", exc)
            return Reply(NOT_SUPPORTED)
        self._exported += 1
        return Reply(SUCCESS, _token_reply(handle, secret, os.getpid()))

    def import_(self, payload: bytes) -> Reply:
        try:
            secret_a, secret_b, pid, handle_type = SHARE_IMPORT_REQUEST.decode(payload)
        except RecordError as exc:
            return Reply(Status.MALFORMED, str(exc).encode())
        if self._relayed or handle_type != POSIX_FILE_DESCRIPTOR:
            return Reply(NOT_SUPPORTED)
        secret = struct.pack("<QQ", secret_a, secret_b)
        mine = pid == os.getpid()
        descriptor = _EXPORTS.duplicate(secret, self._region) if mine else _ask(pid, secret, self._region)
        if descriptor is None:
            return Reply(INVALID_VALUE)  # no such export for this region: as a descriptor that is not one
        driver = self._driver
        try:
            err, handle = driver.cuMemImportFromShareableHandle(
                descriptor, driver.CUmemAllocationHandleType(POSIX_FILE_DESCRIPTOR))
        finally:
            os.close(descriptor)
        if int(err) != SUCCESS:
            return Reply(int(err))
        self._ledger.handles[PHYSICAL].add(int(handle))  # the session's to map; never counted against its quota
        return Reply(SUCCESS, _token_reply(int(handle), secret, pid))


def _token_reply(handle: int, secret: bytes, pid: int) -> bytes:
    secret_a, secret_b = struct.unpack("<QQ", secret)
    return SHARE_REPLY.encode(handle, secret_a, secret_b, pid)


def _receive(peer: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = peer.recv(size - len(data))
        if not chunk:
            raise ValueError("the peer closed the connection")
        data += chunk
    return data


def _ask(pid: int, secret: bytes, region: str) -> int | None:
    """The descriptor worker `pid` exported under `secret`, if it gives it to a session of `region`; else None."""
    name = region.encode()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC) as peer:
            peer.settimeout(ASK_TIMEOUT_S)
            peer.connect(socket_name(pid))
            peer.sendall(REQUEST.pack(secret, len(name)) + name)
            answer, descriptors, _flags, _address = socket.recv_fds(peer, 1, 1)
    except OSError as exc:
        log.debug("no exported memory from worker %d: %s", pid, exc)
        return None
    if answer == b"\1" and len(descriptors) == 1:
        return descriptors[0]
    for descriptor in descriptors:
        os.close(descriptor)
    return None
