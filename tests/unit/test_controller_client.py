"""ivshmem.shared.controller_client, the one client of the controller, against small HTTP servers of the test's own
(no controller, no etcd): the address check, errors with the HTTP status and one line, the timeout, the one retry
of a kept-alive connection, Orion's plain-text endpoints, and what importing it costs a guest program."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from ivshmem.shared.controller_client import ControllerClient, ControllerClientError, quote, split_address

REPO = Path(__file__).resolve().parents[2]
JOIN_S = 30.0


@pytest.mark.parametrize(("address", "words"), [
    ("127.0.0.1:0", "the port '0' is not a number from 1 to 65535"),
    ("127.0.0.1:65536", "is not a number from 1 to 65535"),
    ("127.0.0.1:９１２３", "is not a number from 1 to 65535"),  # fullwidth digits: int() would take them
    ("127.0.0.1", "the port is missing"),
    ("127.0.0.1:", "the port is missing"),
    ("ctl example:9123", "is not a host name or IP address"),
    ("::1:9123", "IPv6"),
])
def test_an_address_it_cannot_use_is_one_line_before_any_connection(address: str, words: str) -> None:
    """Port 0 used to mean Orion's 9123 (and no port too), so a typo silently asked another controller."""
    with pytest.raises(ValueError) as caught:
        ControllerClient(address)
    message = str(caught.value)
    assert len(message.splitlines()) == 1 and words in message and "HOST:PORT" in message, message
    assert message.startswith(f"controller address {address!r}: ")


@pytest.mark.parametrize(("address", "split"), [
    ("10.0.0.1:9124", ("10.0.0.1", 9124)), ("http://ctl.example:80/", ("ctl.example", 80)),
    ("[::1]:9123", ("::1", 9123)), (" 127.0.0.1:65535 ", ("127.0.0.1", 65535)),
])
def test_good_addresses(address: str, split: tuple[str, int]) -> None:
    assert split_address(address) == split


def test_quote_keeps_a_name_in_one_path_segment() -> None:
    assert quote("a/../b") == "a%2F..%2Fb" and quote("GPU-1:2") == "GPU-1%3A2"


class _Handler(BaseHTTPRequestHandler):
    """Answers by path: /json (201, a JSON object), /refused (409 with a reason), /text (Orion's plain text,
    echoing the api_version header), /html (a 502 page of several lines), /list (a JSON list), /close (closes
    the connection without answering)."""

    protocol_version = "HTTP/1.1"  # keep-alive, as aiohttp answers
    seen: list[str]

    def _send(self, status: int, body: bytes, kind: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _serve(self) -> None:
        self.seen.append(f"{self.command} {self.path}")
        length = int(self.headers.get("Content-Length") or 0)
        sent = self.rfile.read(length) if length else b""
        if self.path == "/close":
            self.close_connection = True
            return
        if self.path == "/json":
            self._send(201, json.dumps({"got": json.loads(sent) if sent else None}).encode())
        elif self.path == "/refused":
            self._send(409, b'{"error": "wrong_host", "reason": "granted on host h2, not h1"}')
        elif self.path.startswith("/text"):
            self._send(200, f"  api_version={self.headers.get('api_version')}\n".encode(), "text/plain")
        elif self.path == "/html":
            self._send(502, b"<html>\n<body>Bad\nGateway</body>\n</html>", "text/html")
        elif self.path == "/list":
            self._send(200, b"[1, 2]")

    do_GET = do_POST = do_DELETE = _serve  # noqa: N815 - http.server's spelling

    def log_message(self, *_args: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[tuple[str, list[str]]]:
    seen: list[str] = []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), type("Handler", (_Handler,), {"seen": seen}))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{httpd.server_address[1]}", seen
    httpd.shutdown()
    httpd.server_close()
    thread.join(JOIN_S)


def test_a_request_returns_status_body_and_the_peer_that_answered(server: tuple[str, list[str]]) -> None:
    address, _ = server
    with ControllerClient(address) as client:
        answer = client.request("POST", "/json", {"vgpus": 2})
    assert answer.status == 201 and answer.json() == {"got": {"vgpus": 2}} and answer.peer == address


def test_a_refusal_carries_the_status_the_code_and_the_controllers_reason(server: tuple[str, list[str]]) -> None:
    address, _ = server
    with ControllerClient(address) as client, pytest.raises(ControllerClientError) as caught:
        client._json("POST", "/refused")
    assert (caught.value.status, caught.value.code, caught.value.reason) == (409, "wrong_host",
                                                                             "granted on host h2, not h1")


def test_a_foreign_error_page_is_one_line(server: tuple[str, list[str]]) -> None:
    address, _ = server
    with ControllerClient(address) as client:
        with pytest.raises(ControllerClientError) as json_call:
            client._json("GET", "/html")
        with pytest.raises(ControllerClientError) as text_call:
            client.text("/html")
        assert client.request("GET", "/list").json() == {}  # JSON, but no object
    assert json_call.value.status == 502 and json_call.value.code == "bad_response"
    assert json_call.value.reason == "<html> <body>Bad Gateway</body> </html>"
    assert text_call.value.reason == "HTTP 502: <html> <body>Bad Gateway</body> </html>"


def test_text_sends_orions_headers_and_strips_the_answer(server: tuple[str, list[str]]) -> None:
    address, _ = server
    with ControllerClient(address) as client:
        assert client.text("/text?x", {"api_version": "0.2"}) == "api_version=0.2"


def unused_address() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"  # closed again: nothing listens there


def test_nobody_there_is_status_0_with_what_to_check() -> None:
    address = unused_address()
    with ControllerClient(address, configured_by="controller_addr in client.conf") as client, \
            pytest.raises(ControllerClientError) as caught:
        client.health()
    assert caught.value.status == 0 and caught.value.code == "unreachable"
    assert caught.value.reason.startswith(f"cannot reach the Orion Controller at {address} (")
    assert caught.value.reason.endswith("; check that it runs there and controller_addr in client.conf")


def test_a_silent_controller_times_out() -> None:
    with socket.socket() as silent:  # accepts connections (the backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        with ControllerClient(address, timeout_s=0.2) as client, pytest.raises(ControllerClientError) as caught:
            client.pool()
    assert caught.value.status == 0 and f"at {address} (timed out)" in caught.value.reason


def test_via_connects_elsewhere_but_names_the_configured_address(server: tuple[str, list[str]]) -> None:
    address, seen = server
    with ControllerClient("ctl.invalid:9123", via=address) as client:
        assert client.request("DELETE", "/json").status == 201
    assert seen == ["DELETE /json"]
    with ControllerClient("ctl.invalid:9123", timeout_s=0.5, via=unused_address()) as client, \
            pytest.raises(ControllerClientError, match="at ctl.invalid:9123 "):
        client.health()


def test_a_closed_kept_alive_connection_is_retried_once_a_new_one_never(server: tuple[str, list[str]]) -> None:
    """Retrying on a new connection could send a request the controller acted on twice (an allocation)."""
    address, seen = server
    with ControllerClient(address) as client:
        with pytest.raises(ControllerClientError, match="cannot reach"):
            client.request("POST", "/close", {})  # a new connection the server closed: not sent again
        assert seen == ["POST /close"]
        assert client.request("GET", "/json").status == 201
        assert client._conn is not None
        client._conn.sock.shutdown(socket.SHUT_RDWR)  # type: ignore[union-attr]  # as a server's idle timeout
        assert client.request("GET", "/json").status == 201  # retried on a new connection
    assert seen == ["POST /close", "GET /json", "GET /json"]


def test_importing_it_costs_a_guest_program_no_http_or_json_module() -> None:
    """A guest program imports it (through allocation.py) at start-up when Orion's environment is set; http.client
    and the email package it needs (about 15 ms) are imported at the first request instead."""
    code = ("import sys, ivshmem.shared.controller_client, guest_runtime.allocation; "
            "print(sorted(m for m in ('http.client', 'email.parser') if m in sys.modules))")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORION_")}
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env={**env, "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"

