"""SHARE_* and IPC_*: cuMem physical memory, and legacy IPC memory and events, shared between the sessions of one
region (issue 32).

NCCL's P2P transport between two processes of one guest exports each buffer with cuMemExportToShareableHandle as a
POSIX file descriptor, passes it to the peer over a UNIX socket, and the peer imports it. Each of those processes is
a session with its own worker here, so the descriptor the driver exports lives in one worker and must reach the
other's driver. The guest's side (guest_runtime/native/shareable_handles.c) carries a token instead:

- SHARE_EXPORT of a session's CUmemGenericAllocationHandle: the driver exports it; this worker keeps the descriptor
  under a random 128-bit secret and answers the token (its own pid, the secret).
- SHARE_IMPORT of a token: the importing worker asks the exporting one (the token's pid) for the descriptor over a
  host-local UNIX socket (abstract, `orion-cumem-exports-<pid>`, whose listener must be that pid of its own user),
  saying which region its session is of; the exporter hands it over (SCM_RIGHTS) only to a process of its own user,
  for a secret it holds, to a session of its own region.
  The importer's driver imports it, and the new handle is the importing session's.

Legacy IPC (IPC_EXPORT, IPC_OPEN, IPC_CLOSE: cuIpcGetMemHandle and cuIpcGetEventHandle, which PyTorch's
multiprocessing shares CUDA tensors with) goes the same way, with the driver's 64-byte handle handed over instead of a
descriptor: the opening worker opens it with its own driver, and the memory opened is the session's to name (a range
of the ledger's `imported`, never counted against its quota) until cuIpcCloseMemHandle.

So a guest reaches memory another of its own processes exported, and nothing else: a token from another region, a
forged or stale one, or a relayed session (whose region the GPU host does not know) is CUDA_ERROR_INVALID_VALUE or
CUDA_ERROR_NOT_SUPPORTED. Imported memory counts against the exporter's quota only (the ledger never counts it). An
exported descriptor is kept until the session's worker exits (at most MAX_EXPORTS per session; past that
OUT_OF_MEMORY, as a driver out of descriptors answers), and the listening socket goes with it. Not here: the
executor's dispatch (executor.py), the guest's side.
"""
from __future__ import annotations

import ctypes
import logging
import os
import secrets
import socket
import struct
import threading
from collections.abc import Callable
from typing import Any, NamedTuple

from ivshmem.cuda_status import INVALID_HANDLE, INVALID_VALUE, NOT_SUPPORTED, OUT_OF_MEMORY, SUCCESS
from ivshmem.driver_api import (
    IPC_CLOSE_OPCODE,
    IPC_CLOSE_REQUEST,
    IPC_EVENT,
    IPC_EXPORT_OPCODE,
    IPC_EXPORT_REQUEST,
    IPC_MEMORY,
    IPC_OPEN_OPCODE,
    IPC_OPEN_REQUEST,
    SHARE_EXPORT_OPCODE,
    SHARE_EXPORT_REQUEST,
    SHARE_IMPORT_OPCODE,
    SHARE_IMPORT_REQUEST,
    SHARE_REPLY,
)
from ivshmem.errors import RecordError
from ivshmem.record import Status

from ..handler import Reply
from .session_ledger import SessionLedger

log = logging.getLogger(__name__)

POSIX_FILE_DESCRIPTOR = 1  # CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
DESCRIPTOR = 2  # an export's kind besides driver_api.IPC_MEMORY and IPC_EVENT: a cuMem file descriptor
IPC_HANDLE_SIZE = 64  # CUipcMemHandle, CUipcEventHandle
MAX_EXPORTS = 4096
ASK_TIMEOUT_S = 5.0
REQUEST = struct.Struct("<16sH")  # the secret, the length of the region name that follows (UTF-8)
MAX_REGION_NAME = 1024
PHYSICAL = "CUmemGenericAllocationHandle"
REFUSED, GIVEN = b"\0", b"\1"  # the first byte of an answer; a given IPC handle's kind and 64 bytes follow


def socket_name(pid: int) -> str:
    """The abstract UNIX socket on which worker `pid` hands out what it exported."""
    return f"\0orion-cumem-exports-{pid}"


class Export(NamedTuple):
    """What a session exported: its region, the kind, and the driver's descriptor or IPC handle."""

    region: str
    kind: int
    descriptor: int = -1
    handle: bytes = b""


class _Exports:
    """What this process exported, by secret (descriptors kept open), offered to other workers on one listening
    socket (started at the first export; a daemon thread in accept)."""

    def __init__(self) -> None:
        self.held: dict[bytes, Export] = {}
        self.lock = threading.Lock()
        self._listener: socket.socket | None = None

    def add(self, export: Export) -> bytes:
        """Keep `export`; its secret. OSError where it cannot be offered."""
        with self.lock:
            if self._listener is None:
                self._listener = listen_abstract(socket_name(os.getpid()), self._serve_one, "cumem-exports")
            secret = secrets.token_bytes(16)
            self.held[secret] = export
            return secret

    def copy(self, secret: bytes, region: str) -> Export | None:
        """`secret`'s export, if a session of `region` made it (a descriptor duplicated: the caller's to close)."""
        with self.lock:
            export = self.held.get(secret)
            if export is None or export.region != region:
                return None
            return export._replace(descriptor=os.dup(export.descriptor)) if export.kind == DESCRIPTOR else export

    def _serve_one(self, peer: socket.socket) -> None:
        with peer:
            try:
                self._answer(peer)
            except (OSError, ValueError, struct.error) as exc:
                log.debug("a request for exported memory ended early: %s", exc)

    def _answer(self, peer: socket.socket) -> None:
        """One request: the export of a secret held here, to a process of this one's user asking for a session of
        the export's region; anything else gets a refusal and nothing."""
        if peer_credentials(peer)[1] != os.geteuid():  # refused before a byte is read: another user cannot hold it
            peer.sendall(REFUSED)
            return
        peer.settimeout(ASK_TIMEOUT_S)
        secret, length = REQUEST.unpack(receive_exactly(peer, REQUEST.size))
        region = receive_exactly(peer, length).decode() if length <= MAX_REGION_NAME else ""
        export = self.copy(secret, region) if region else None
        if export is None:
            peer.sendall(REFUSED)
        elif export.kind == DESCRIPTOR:
            try:
                socket.send_fds(peer, [GIVEN + bytes([DESCRIPTOR])], [export.descriptor])
            finally:
                os.close(export.descriptor)
        else:
            peer.sendall(GIVEN + bytes([export.kind]) + export.handle)


_EXPORTS = _Exports()  # one per worker process (a session's worker serves one session)


def _forked() -> None:
    """A forked process holds none of its parent's exports, nor its socket, lock or thread."""
    global _EXPORTS
    _EXPORTS = _Exports()


os.register_at_fork(after_in_child=_forked)


class SharedHandles:
    """One session's exports, imports and opened IPC memory."""

    def __init__(self, driver: Any, ledger: SessionLedger, region: str, relayed: bool) -> None:
        self._driver, self._ledger, self._region, self._relayed = driver, ledger, region, relayed
        self._exported = 0

    def answer(self, opcode: int, payload: bytes) -> Reply:
        """A record of one of OPCODES (a payload of another shape is MALFORMED)."""
        try:
            return getattr(self, OPCODES[opcode])(payload)  # type: ignore[no-any-return]
        except RecordError as exc:
            return Reply(Status.MALFORMED, str(exc).encode())

    # --- cuMem descriptors ----------------------------------------------------------------------------------------
    def export(self, payload: bytes) -> Reply:
        handle, flags, handle_type = SHARE_EXPORT_REQUEST.decode(payload)
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
        return self._keep(handle, Export(self._region, DESCRIPTOR, descriptor=int(descriptor)))

    def import_(self, payload: bytes) -> Reply:
        secret_a, secret_b, pid, handle_type = SHARE_IMPORT_REQUEST.decode(payload)
        if self._relayed or handle_type != POSIX_FILE_DESCRIPTOR:
            return Reply(NOT_SUPPORTED)
        secret = struct.pack("<QQ", secret_a, secret_b)
        export = self._find(secret, pid, DESCRIPTOR)
        if export is None:
            return Reply(INVALID_VALUE)  # no such export for this region: as a descriptor that is not one
        driver = self._driver
        try:
            err, handle = driver.cuMemImportFromShareableHandle(
                export.descriptor, driver.CUmemAllocationHandleType(POSIX_FILE_DESCRIPTOR))
        finally:
            os.close(export.descriptor)
        if int(err) != SUCCESS:
            return Reply(int(err))
        self._ledger.handles[PHYSICAL].add(int(handle))  # the session's to map; never counted against its quota
        return Reply(SUCCESS, _token_reply(int(handle), secret, pid))

    # --- legacy IPC -----------------------------------------------------------------------------------------------
    def ipc_export(self, payload: bytes) -> Reply:
        """cuIpcGetMemHandle of the session's memory, or cuIpcGetEventHandle of its event."""
        value, kind = IPC_EXPORT_REQUEST.decode(payload)
        if self._relayed:
            return Reply(NOT_SUPPORTED)
        if kind == IPC_MEMORY and not self._ledger.owns(value, 1):
            return Reply(INVALID_VALUE)
        if kind == IPC_EVENT and value not in self._ledger.handles["CUevent"]:
            return Reply(INVALID_HANDLE)
        if kind not in (IPC_MEMORY, IPC_EVENT):
            return Reply(INVALID_VALUE)
        if self._exported >= MAX_EXPORTS:
            return Reply(OUT_OF_MEMORY)
        driver = self._driver
        err, handle = (driver.cuIpcGetMemHandle if kind == IPC_MEMORY else driver.cuIpcGetEventHandle)(value)
        if int(err) != SUCCESS:
            return Reply(int(err))
        return self._keep(value, Export(self._region, kind, handle=ctypes.string_at(handle.getPtr(), IPC_HANDLE_SIZE)))

    def ipc_open(self, payload: bytes) -> Reply:
        """cuIpcOpenMemHandle or cuIpcOpenEventHandle of a token: what the driver opens of the exporter's handle,
        the session's from now on."""
        secret_a, secret_b, pid, kind, flags = IPC_OPEN_REQUEST.decode(payload)
        if self._relayed:
            return Reply(NOT_SUPPORTED)
        secret = struct.pack("<QQ", secret_a, secret_b)
        export = self._find(secret, pid, kind) if kind in (IPC_MEMORY, IPC_EVENT) else None
        if export is None:
            return Reply(INVALID_VALUE)  # not a handle an export of this region made: as a malformed one is
        driver = self._driver
        handle = driver.CUipcMemHandle() if kind == IPC_MEMORY else driver.CUipcEventHandle()
        ctypes.memmove(handle.getPtr(), export.handle, IPC_HANDLE_SIZE)
        if kind == IPC_EVENT:
            err, event = driver.cuIpcOpenEventHandle(handle)
            if int(err) != SUCCESS:
                return Reply(int(err))
            self._ledger.handles["CUevent"].add(int(event))
            return Reply(SUCCESS, _token_reply(int(event), secret, pid))
        err, pointer = driver.cuIpcOpenMemHandle(handle, flags)
        if int(err) != SUCCESS:
            return Reply(int(err))
        err, base, size = driver.cuMemGetAddressRange(pointer)
        if int(err) != SUCCESS:  # a range the driver cannot size is none the session can be held to
            driver.cuIpcCloseMemHandle(pointer)
            return Reply(int(err))
        self._ledger.imported[int(base)] = int(size)  # the session's to name; counted where it was allocated
        return Reply(SUCCESS, _token_reply(int(pointer), secret, pid))

    def ipc_close(self, payload: bytes) -> Reply:
        """cuIpcCloseMemHandle of memory an IPC_OPEN gave this session, and only that."""
        (pointer,) = IPC_CLOSE_REQUEST.decode(payload)
        if pointer not in self._ledger.imported:
            return Reply(INVALID_VALUE)
        (err,) = self._driver.cuIpcCloseMemHandle(pointer)
        if int(err) == SUCCESS:
            del self._ledger.imported[pointer]
        return Reply(int(err))

    # --- both -----------------------------------------------------------------------------------------------------
    def _keep(self, value: int, export: Export) -> Reply:
        """Offer `export` to the region's other sessions: the token, or NOT_SUPPORTED where it cannot be offered."""
        try:
            secret = _EXPORTS.add(export)
        except OSError as exc:
            if export.kind == DESCRIPTOR:
                os.close(export.descriptor)
            log.warning("cannot offer exported memory to the region's other sessions: %s", exc)
            return Reply(NOT_SUPPORTED)
        self._exported += 1
        return Reply(SUCCESS, _token_reply(value, secret, os.getpid()))

    def _find(self, secret: bytes, pid: int, kind: int) -> Export | None:
        """The export of `secret` in worker `pid` (this one's own too) of `kind`, made by a session of this region."""
        export = _EXPORTS.copy(secret, self._region) if pid == os.getpid() else _ask(pid, secret, self._region)
        if export is not None and export.kind != kind:
            if export.kind == DESCRIPTOR:
                os.close(export.descriptor)
            return None
        return export


OPCODES = {SHARE_EXPORT_OPCODE: "export", SHARE_IMPORT_OPCODE: "import_", IPC_EXPORT_OPCODE: "ipc_export",
           IPC_OPEN_OPCODE: "ipc_open", IPC_CLOSE_OPCODE: "ipc_close"}  # SharedHandles.answer's


def _token_reply(handle: int, secret: bytes, pid: int) -> bytes:
    secret_a, secret_b = struct.unpack("<QQ", secret)
    return SHARE_REPLY.encode(handle, secret_a, secret_b, pid)


def listen_abstract(name: str, on_connection: Callable[[socket.socket], None], thread: str) -> socket.socket:
    """A listening abstract UNIX socket `name` (OSError where it cannot be bound), each connection handed to
    `on_connection` by a daemon thread (named `thread`) in accept, which ends when the socket is closed."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        listener.bind(name)
        listener.listen(16)
    except OSError:
        listener.close()
        raise

    def serve() -> None:
        while True:
            try:
                peer, _ = listener.accept()
            except OSError:
                return
            on_connection(peer)
    threading.Thread(target=serve, name=thread, daemon=True).start()
    return listener


def peer_credentials(peer: socket.socket) -> tuple[int, int, int]:
    """The pid, uid and gid of the process at the other end of a UNIX socket (SO_PEERCRED)."""
    pid, uid, gid = struct.unpack("3i", peer.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    return pid, uid, gid


def receive_exactly(peer: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = peer.recv(size - len(data))
        if not chunk:
            raise ValueError("the peer closed the connection")
        data += chunk
    return data


def _ask(pid: int, secret: bytes, region: str) -> Export | None:
    """The export worker `pid` made under `secret`, if it gives it to a session of `region`; else None."""
    name = region.encode()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC) as peer:
            peer.settimeout(ASK_TIMEOUT_S)
            peer.connect(socket_name(pid))
            if peer_credentials(peer)[:2] != (pid, os.geteuid()):  # a name another process took first: told nothing
                return None
            peer.sendall(REQUEST.pack(secret, len(name)) + name)
            answer, descriptors, _flags, _address = socket.recv_fds(peer, 2 + IPC_HANDLE_SIZE, 1)
            if answer[:1] == GIVEN and answer[1:2] != bytes([DESCRIPTOR]):
                answer += receive_exactly(peer, 2 + IPC_HANDLE_SIZE - len(answer))
    except (OSError, ValueError) as exc:
        log.debug("no export from worker %d: %s", pid, exc)
        return None
    if answer[:2] == GIVEN + bytes([DESCRIPTOR]) and len(descriptors) == 1:
        return Export(region, DESCRIPTOR, descriptor=descriptors[0])
    for descriptor in descriptors:
        os.close(descriptor)
    if answer[:1] == GIVEN and answer[1] in (IPC_MEMORY, IPC_EVENT):
        return Export(region, answer[1], handle=answer[2:2 + IPC_HANDLE_SIZE])
    return None
