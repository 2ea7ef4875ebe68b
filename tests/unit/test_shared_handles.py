"""SHARE_* and IPC_*, the GPU host's side (host_agent/session/shared_handles.py): exported memory (and an IPC event)
reaches a session of the same region only, through a worker that holds the export; a secret no worker holds, another
region, another user, a relayed session, a handle that is not the session's, another handle type or an export of
another kind never reach the driver's import or open. The exporting worker is a forked process of its own, as a
session's worker is; the memory is the fake driver's (a memfd, so an import really is the same bytes)."""
from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from host_agent.session.session_ledger import SessionLedger
from host_agent.session.shared_handles import MAX_EXPORTS, OPCODES, SharedHandles, _ask
from ivshmem.driver_api import (
    IPC_CLOSE_REQUEST,
    IPC_EVENT,
    IPC_EXPORT_REQUEST,
    IPC_MEMORY,
    IPC_OPEN_REQUEST,
    SHARE_EXPORT_REQUEST,
    SHARE_IMPORT_REQUEST,
    SHARE_REPLY,
)
from ivshmem.record import Status
from tests.fake_driver import (
    VMM_GRANULARITY,
    CUmemAllocationHandleType,
    CUmemAllocationProp,
    CUmemAllocationType,
    CUmemLocationType,
    FakeDriver,
)

SUCCESS, INVALID_VALUE, OUT_OF_MEMORY, INVALID_HANDLE, NOT_SUPPORTED = 0, 1, 2, 400, 801
POSIX, FABRIC = 1, 8
PHYSICAL = "CUmemGenericAllocationHandle"


def _ledger() -> SessionLedger:
    usage = SimpleNamespace(allocated=lambda size, device=None: 0, freed=lambda device, size: None,
                            may_have_changed=lambda: None)
    return SessionLedger((0,), usage)


def _memory(driver: FakeDriver, ledger: Any, handle_types: int = POSIX) -> int:
    """Exportable memory of the session's, its first bytes written."""
    prop = CUmemAllocationProp()
    prop.type = CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.requestedHandleTypes = CUmemAllocationHandleType(handle_types)
    prop.location.type = CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = 0
    err, handle = driver.cuMemCreate(VMM_GRANULARITY, prop, 0)
    assert int(err) == SUCCESS
    driver.physical[int(handle)].data[:5] = b"hello"
    ledger.handles[PHYSICAL].add(int(handle))
    return int(handle)


def _driver() -> FakeDriver:
    driver = FakeDriver()
    driver.cuInit(0)
    driver.cuCtxSetCurrent(driver.cuDevicePrimaryCtxRetain(0)[1])
    return driver


def _token(reply: Any) -> tuple[int, int, int]:
    _handle, secret_a, secret_b, pid = SHARE_REPLY.decode(reply.payload)
    return secret_a, secret_b, pid


@pytest.fixture
def exporters() -> Iterator[list[tuple[int, int, int]]]:
    """A forked worker of region "guest-a" that exported cuMem memory, an allocation by IPC and an event by IPC, and
    serves their tokens until the test ends."""
    tokens, stop = os.pipe(), os.pipe()
    pid = os.fork()
    if pid == 0:  # the exporting worker
        try:
            driver, ledger = _driver(), _ledger()
            shared = SharedHandles(driver, ledger, "guest-a", relayed=False)
            pointer = int(driver.cuMemAlloc(VMM_GRANULARITY)[1])
            driver.memory[pointer][:5] = b"world"
            ledger.allocations[pointer] = VMM_GRANULARITY
            event = int(driver.cuEventCreate(0x6)[1])
            ledger.handles["CUevent"].add(event)
            replies = [shared.export(SHARE_EXPORT_REQUEST.encode(_memory(driver, ledger), 0, POSIX)),
                       shared.ipc_export(IPC_EXPORT_REQUEST.encode(pointer, IPC_MEMORY)),
                       shared.ipc_export(IPC_EXPORT_REQUEST.encode(event, IPC_EVENT))]
            ok = all(reply.status == SUCCESS for reply in replies)
            os.write(tokens[1], b"".join(struct.pack("<QQI", *_token(reply)) for reply in replies) if ok else b"!")
            os.read(stop[0], 1)
        finally:
            os._exit(0)
    made = os.read(tokens[0], 60)
    assert len(made) == 60, "the exporting worker failed"
    yield [struct.unpack_from("<QQI", made, at) for at in (0, 20, 40)]
    os.write(stop[1], b"x")
    os.waitpid(pid, 0)
    for end in (*tokens, *stop):
        os.close(end)


def _import(shared: SharedHandles, token: tuple[int, int, int], handle_type: int = POSIX) -> Any:
    return shared.import_(SHARE_IMPORT_REQUEST.encode(*token, handle_type))


@pytest.fixture
def exporter(exporters: list[tuple[int, int, int]]) -> tuple[int, int, int]:
    return exporters[0]


def test_a_session_of_the_same_region_imports_the_same_memory(exporter: tuple[int, int, int]) -> None:
    driver, ledger = _driver(), _ledger()
    reply = _import(SharedHandles(driver, ledger, "guest-a", relayed=False), exporter)
    assert reply.status == SUCCESS
    handle = SHARE_REPLY.decode(reply.payload)[0]
    assert handle in ledger.handles[PHYSICAL]  # the importing session's to map from now on
    assert bytes(driver.physical[handle].data[:5]) == b"hello"  # the exporter's bytes
    assert driver.physical[handle].imported and driver.used[0] == 0  # counted where it was made only


def test_another_region_user_or_secret_gets_nothing(exporter: tuple[int, int, int]) -> None:
    driver = _driver()
    secret_a, secret_b, pid = exporter
    for region, token in [("guest-b", exporter), ("guest-a", (secret_a ^ 1, secret_b, pid)),
                          ("guest-a", (secret_a, secret_b, 1))]:  # another guest; a forged secret; no such worker
        assert _import(SharedHandles(driver, _ledger(), region, relayed=False), token).status == INVALID_VALUE
    assert [call.name for call in driver.calls if call.name == "cuMemImportFromShareableHandle"] == []
    child = os.fork()
    if child == 0:  # another user of the host asking the worker directly
        os.setgid(65534)
        os.setuid(65534)
        os._exit(0 if _ask(pid, struct.pack("<QQ", secret_a, secret_b), "guest-a") is None else 1)
    assert os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]) == 0


def test_what_is_not_shared_is_refused_before_the_driver() -> None:
    driver, ledger = _driver(), _ledger()
    shared = SharedHandles(driver, ledger, "guest-a", relayed=False)
    handle = _memory(driver, ledger)
    assert shared.export(SHARE_EXPORT_REQUEST.encode(handle + 99, 0, POSIX)).status == INVALID_VALUE  # not its own
    assert shared.export(SHARE_EXPORT_REQUEST.encode(handle, 0, FABRIC)).status == NOT_SUPPORTED
    for opcode in OPCODES:  # a payload of another shape, through the executor's entry
        assert shared.answer(opcode, b"\0" * 3).status == Status.MALFORMED
    relayed = SharedHandles(driver, ledger, "relay 10.0.0.1:9000", relayed=True)
    assert relayed.export(SHARE_EXPORT_REQUEST.encode(handle, 0, POSIX)).status == NOT_SUPPORTED
    assert _import(relayed, (1, 2, os.getpid())).status == NOT_SUPPORTED
    own = shared.export(SHARE_EXPORT_REQUEST.encode(handle, 0, POSIX))
    assert own.status == SUCCESS
    assert _import(shared, _token(own)).status == SUCCESS  # a session imports what it exported itself
    assert _import(shared, _token(own), FABRIC).status == NOT_SUPPORTED


def test_exports_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    driver, ledger = _driver(), _ledger()
    shared = SharedHandles(driver, ledger, "guest-a", relayed=False)
    handle = _memory(driver, ledger)
    monkeypatch.setattr("host_agent.session.shared_handles.MAX_EXPORTS", 2)
    replies = [shared.export(SHARE_EXPORT_REQUEST.encode(handle, 0, POSIX)).status for _ in range(3)]
    assert replies == [SUCCESS, SUCCESS, OUT_OF_MEMORY] and MAX_EXPORTS > 2


def _open(shared: SharedHandles, token: tuple[int, int, int], kind: int) -> Any:
    return shared.ipc_open(IPC_OPEN_REQUEST.encode(*token, kind, 0))


def test_ipc_memory_and_events_open_for_the_same_region_only(exporters: list[tuple[int, int, int]]) -> None:
    _share, memory, event = exporters
    driver, ledger = _driver(), _ledger()
    shared = SharedHandles(driver, ledger, "guest-a", relayed=False)
    for kind, token in [(IPC_EVENT, memory), (IPC_MEMORY, event), (IPC_MEMORY, _share)]:  # an export of another kind
        assert _open(shared, token, kind).status == INVALID_VALUE
    assert _open(SharedHandles(driver, _ledger(), "guest-b", relayed=False), memory, IPC_MEMORY).status == INVALID_VALUE
    assert [call for call in driver.calls if call.name.startswith("cuIpcOpen")] == []
    opened = _open(shared, memory, IPC_MEMORY)
    assert opened.status == SUCCESS
    pointer = SHARE_REPLY.decode(opened.payload)[0]
    assert ledger.owns(pointer, 5) and bytes(driver.memory[pointer][:5]) == b"world"  # the exporter's bytes
    assert driver.used[0] == 0  # counted where it was allocated
    event_reply = _open(shared, event, IPC_EVENT)
    assert event_reply.status == SUCCESS and SHARE_REPLY.decode(event_reply.payload)[0] in ledger.handles["CUevent"]
    close = IPC_CLOSE_REQUEST.encode(pointer)
    assert shared.ipc_close(close).status == SUCCESS and not ledger.owns(pointer, 1)
    assert shared.ipc_close(close).status == INVALID_VALUE  # closed once; and never what the session allocated


def test_ipc_exports_only_what_the_session_owns() -> None:
    driver, ledger = _driver(), _ledger()
    shared = SharedHandles(driver, ledger, "guest-a", relayed=False)
    assert shared.ipc_export(IPC_EXPORT_REQUEST.encode(0xDEAD0000, IPC_MEMORY)).status == INVALID_VALUE
    assert shared.ipc_export(IPC_EXPORT_REQUEST.encode(12345, IPC_EVENT)).status == INVALID_HANDLE
    assert shared.ipc_export(IPC_EXPORT_REQUEST.encode(0, 7)).status == INVALID_VALUE
    assert [call for call in driver.calls if call.name.startswith("cuIpc")] == []
    relayed = SharedHandles(driver, ledger, "relay 10.0.0.1:9000", relayed=True)
    assert relayed.ipc_export(IPC_EXPORT_REQUEST.encode(0, IPC_MEMORY)).status == NOT_SUPPORTED
    assert relayed.ipc_open(IPC_OPEN_REQUEST.encode(1, 2, 3, IPC_MEMORY, 0)).status == NOT_SUPPORTED


def test_a_socket_name_taken_by_another_process_is_told_nothing() -> None:
    """A process that binds the socket name of a worker pid that is not its own (to hand out memory of its choosing,
    or to learn secrets) is never asked: the asker checks the listener's pid and user first."""
    import contextlib
    import socket
    import threading

    from host_agent.session.shared_handles import socket_name

    squatted = 4_000_000 + os.getpid() % 1000  # no such pid here (above pid_max's default)
    heard: list[bytes] = []
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as squatter:
        squatter.bind(socket_name(squatted))
        squatter.listen(1)

        def answer() -> None:
            peer, _ = squatter.accept()
            with peer, contextlib.suppress(OSError):  # the asker may have gone already
                peer.settimeout(2)
                heard.append(peer.recv(64))
                peer.sendall(b"\1\0" + bytes(64))

        thread = threading.Thread(target=answer, daemon=True)
        thread.start()
        assert _ask(squatted, bytes(16), "guest-a") is None
        thread.join(timeout=5)
    assert heard in ([], [b""])  # not a byte of the request reached it
