"""Both ends of a relay connection for the relay tests (host_agent/relay_*.py): `start_listener`, the GPU host's
listener in a child process, and `RelayPeer`, the relay's end (records sent as a relaying oriond sends them,
answers read with the GPU host's BEATs skipped; `RelayPeer.dial` connects and proves the cluster key first, as a
relaying oriond does). Both hold the tests' cluster key (tests/cluster_key.py) unless told otherwise."""
from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import socket
import time
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from host_agent.handler import HandlerFactory
from host_agent.relay.frames import BEAT, RELAY_HELLO, RELAY_HELLO_REQUEST, FrameStream
from host_agent.relay.handshake import HANDSHAKE_S, prove
from host_agent.relay.listener import MAX_SESSIONS, Admission, RelayListener, listen_socket
from host_agent.session_loop import ServerOptions
from host_agent.stop import StopRequest
from ivshmem.driver_api import CALLS, table_digest
from ivshmem.record import PROTOCOL, Record
from tests import relay_net
from tests.cluster_key import TEST_KEY

START_TIMEOUT_S = 30.0


def _listen(factory: HandlerFactory, address: str, namespace: str, max_sessions: int, options: ServerOptions,
            admission: Admission, report: Connection) -> None:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG: never outlive who started it
    stop = StopRequest().on_signals()
    if namespace:
        relay_net.enter(namespace)
    listener = RelayListener(listen_socket(address, 0, admission), factory, options, stop, max_sessions)
    report.send(listener.address[1])
    listener.serve_forever()


def start_listener(factory: HandlerFactory, address: str = "127.0.0.1", namespace: str = "",
                   max_sessions: int = MAX_SESSIONS, options: ServerOptions | None = None,
                   admission: Admission | None = None) -> tuple[BaseProcess, int]:
    """A relay listener over `factory` on a free port of `address` (in network namespace `namespace`, if given), in
    a child process that ends on SIGTERM or with its parent: (the process, its port). It admits holders of the
    tests' key unless `admission` says otherwise."""
    ours, theirs = multiprocessing.get_context("fork").Pipe(duplex=False)
    process = multiprocessing.get_context("fork").Process(
        target=_listen, args=(factory, address, namespace, max_sessions, options or ServerOptions(),
                              admission or Admission(TEST_KEY), theirs),
        name="relay-listener", daemon=True)  # terminated, not waited for, when its parent exits
    process.start()
    assert ours.poll(START_TIMEOUT_S), "the relay listener did not start"
    return process, int(ours.recv())


class RelayPeer:
    def __init__(self, frames: FrameStream, generation: int = 0) -> None:
        self.frames = frames
        self.generation = generation  # the GPU host's session's, once an answer has said it

    @classmethod
    def dial(cls, address: str, port: int, key: bytes = TEST_KEY, name: str = "relay-test") -> RelayPeer:
        """A connection to a listener at `address:port`, proven as the cluster's node `name` with `key`."""
        sock = socket.create_connection((address, port), timeout=10)
        try:
            prove(sock, key, name, f"{address}:{port}", time.monotonic() + HANDSHAKE_S)
        except BaseException:
            sock.close()
            raise
        sock.settimeout(None)
        return cls(FrameStream(sock, stall_s=5))

    def hello(self, protocol: int = PROTOCOL, calls: str | None = None, allocation: str = "") -> Record:
        """RELAY_HELLO with this process as the client; its answer (RELAY_ACCEPT, or a refusal from whoever
        refused: the worker answers call 1, a full listener call 0)."""
        self.frames.send(1, RELAY_HELLO, RELAY_HELLO_REQUEST.encode(
            protocol, os.getpid(), "guest", table_digest() if calls is None else calls, allocation, b""))
        return self.answer(None)

    def answer(self, call_id: int | None) -> Record:
        """The next record that is not a BEAT; it must answer `call_id` (None: any)."""
        while True:
            record = self.frames.receive(timeout=10)
            assert record is not None, "no answer within 10 s"
            if record.opcode != BEAT:
                assert call_id is None or record.call_id == call_id, record
                self.generation = record.generation
                return record

    def call(self, call_id: int, name: str, *args: Any) -> Record:
        """A forwarded CUDA call and its answer."""
        call = CALLS[name]
        self.frames.send(call_id, call.opcode, call.request.encode(*args), generation=self.generation)
        return self.answer(call_id)
