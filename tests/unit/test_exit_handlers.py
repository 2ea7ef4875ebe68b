"""The guest runtime's work at exit, in process: bounded, without a resolver, in the right order (issue 11).

The release of the vGPUs at exit talks to a controller: here a small HTTP server of the test's own, or a socket
that accepts and never answers. Waits are bounded by the release's own socket timeout, and the test's joins.
"""
from __future__ import annotations

import ctypes
import ipaddress
import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from guest_runtime import activate, allocation
from guest_runtime.forward import Forwarder
from ivshmem.errors import WireError

JOIN_S = 30.0  # far above any socket timeout used here; a release still running then is a hang
GRANT = {"id": "a-1", "host": "h", "address": "10.0.0.1", "port": 9960, "vgpus": [{"gpu": 0, "vgpu": 0}],
         "ttl_s": 600}


class _Controller(BaseHTTPRequestHandler):
    requests: list[tuple[str, str]]

    def _answer(self, status: int, body: dict[str, Any]) -> None:
        self.requests.append((self.command, self.path))
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:  # noqa: N802 - http.server's spelling
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._answer(201, GRANT)

    def do_DELETE(self) -> None:  # noqa: N802
        self._answer(200, {"id": GRANT["id"], "released": True})

    def log_message(self, *_args: Any) -> None:
        pass


@pytest.fixture
def controller() -> Iterator[tuple[int, list[tuple[str, str]]]]:
    seen: list[tuple[str, str]] = []
    handler = type("Handler", (_Controller,), {"requests": seen})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1], seen
    server.shutdown()
    server.server_close()
    thread.join(JOIN_S)


def in_thread(target: Any) -> None:
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(JOIN_S)
    assert not thread.is_alive(), f"still running after {JOIN_S} s"


def test_the_release_goes_to_the_address_that_granted_it_without_a_resolver(
        controller: tuple[int, list[tuple[str, str]]], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """At exit a name lookup could wait on an unreachable resolver, which no socket timeout bounds."""
    port, seen = controller
    alloc = allocation.Allocation.request(f"localhost:{port}", 1, None)
    real = socket.getaddrinfo

    def numeric_only(host: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            ipaddress.ip_address(host.strip("[]") if isinstance(host, str) else host)
        except ValueError:
            raise socket.gaierror(socket.EAI_AGAIN, "no resolver at exit") from None
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", numeric_only)
    in_thread(alloc.release)
    assert seen == [("POST", "/api/v1/allocations"), ("DELETE", "/api/v1/allocations/a-1")]
    err = capsys.readouterr().err
    assert "not confirmed" not in err, err
    assert err.rstrip().endswith("[INFO] Client exits with allocation ID a-1"), err


def test_an_unanswered_release_at_exit_ends_with_a_line_saying_so(
        controller: tuple[int, list[tuple[str, str]]], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    port, _seen = controller
    alloc = allocation.Allocation.request(f"127.0.0.1:{port}", 1, None)
    with socket.socket() as silent:  # accepts connections (the backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)
        alloc._release_to = f"127.0.0.1:{silent.getsockname()[1]}"  # the controller went quiet
        monkeypatch.setattr(allocation, "_current", alloc)
        monkeypatch.setattr(allocation, "EXIT_TIMEOUT_S", 0.2)
        with allocation._lock:  # a thread still inside acquire() holds it: the exit does not wait for it
            in_thread(allocation.release_at_exit)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2, lines
    assert lines[0].startswith("orion: the release of allocation a-1 was not confirmed (")
    assert "timed out" in lines[0] and "lease expires" in lines[0]
    assert lines[1].endswith("[INFO] Client exits with allocation ID a-1")


def test_after_close_every_call_answers_deinitialized_without_connecting() -> None:
    connects: list[int] = []

    def connect() -> Any:
        connects.append(1)
        raise WireError("no agent here")

    forwarder = Forwarder(connect)
    fn = forwarder.implementations()
    forwarder.close()
    count = ctypes.c_int()
    assert fn["cuInit"](0) == 4  # CUDA_ERROR_DEINITIALIZED
    assert fn["cuDeviceGetCount"](ctypes.addressof(count)) == 4
    assert fn["cuCtxSynchronize"]() == 4
    assert connects == []


def test_the_exit_handler_ends_the_session_then_says_there_was_no_allocation(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    order: list[str] = []

    class Session:
        def close(self) -> None:
            order.append("session closed")

    monkeypatch.setattr(activate, "_forwarder", Session())
    monkeypatch.setattr(activate, "_without_allocation", True)
    monkeypatch.setattr(allocation, "release_at_exit", lambda: order.append("vGPUs released"))
    activate._at_exit()
    assert order == ["session closed", "vGPUs released"]
    assert capsys.readouterr().err.rstrip().endswith("[INFO] Client exits without allocation ID.")
