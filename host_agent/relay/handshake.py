"""The relay connection's first bytes: the cluster-key handshake (docs/security.md, "Who may talk to whom: the
cluster key"; the bytes in docs/wire-protocol.md, "Relay handshake").

Before either end reads a frame, each proves that it holds the cluster key, over two fresh nonces:

    GPU host -> relay   GREETING   40 bytes: b"ORIONRH1", the GPU host's nonce (32)
    relay -> GPU host   CLAIM     256 bytes: the relay's nonce (32), its proof (32), its name's length (1), its node
                                             name (NAME_BYTES, padded with zeros)
    GPU host -> relay   VERDICT    33 bytes: PROVEN and the GPU host's proof, or REFUSED and 32 zero bytes

A proof is cluster_key.relay_proof(key, role, GPU host's nonce, relay's nonce, name): role "client" for the relay's,
"server" for the GPU host's, so neither can be played back as the other, and fresh nonces on both sides, so no
recorded handshake is good for another connection. Every message has a fixed size of at most 256 bytes: each end
reads exactly that much, never a length the peer declares; the relay sends nothing but its claim until the GPU
host has proved itself.

The GPU host's half (`ServerHandshake`) is fed by the listener's event loop, many at once and never blocking; the
relay's (`prove`) runs on its own connection with a deadline. What does not belong here: how many handshakes a
peer may hold and when one is given up (relay/admission.py, relay/listener.py), the key file (controller/
cluster_key.py).
"""
from __future__ import annotations

import os
import re
import socket
import struct
import time

from controller.cluster_key import NONCE_BYTES, proofs_match, relay_proof

from ..errors import RefusedError

MAGIC = b"ORIONRH1"  # the listener's first bytes: an Orion relay listener speaking handshake 1
GREETING = struct.Struct(f"8s{NONCE_BYTES}s")
NAME_BYTES = 191  # a host name or an address; the claim is then 256 bytes exactly
CLAIM = struct.Struct(f"{NONCE_BYTES}s32sB{NAME_BYTES}s")
VERDICT = struct.Struct("B32s")
PROVEN, REFUSED = 0, 1
HANDSHAKE_S = 5.0  # all of it, from the connection's accept (or connect) to the verdict
_NAME = re.compile(rf"[A-Za-z0-9._:-]{{1,{NAME_BYTES}}}")  # a host name, an IPv4 or IPv6 address


class HandshakeFailed(RefusedError):
    """The handshake did not prove the peer (or this end); the message is one line saying what happened."""


def valid_name(name: str) -> bool:
    """Whether `name` can name a node in a claim: a host name or an address, ASCII, at most NAME_BYTES."""
    return _NAME.fullmatch(name) is not None


class ServerHandshake:
    """The GPU host's half for one connection: its greeting, then the claim read as it arrives (`feed`), then the
    verdict (`judge`). Holds at most CLAIM.size bytes of the peer's, whatever the peer sends."""

    __slots__ = ("nonce", "_claim", "_got")

    def __init__(self) -> None:
        self.nonce = os.urandom(NONCE_BYTES)
        self._claim = bytearray(CLAIM.size)
        self._got = 0

    def greeting(self) -> bytes:
        return GREETING.pack(MAGIC, self.nonce)

    def feed(self, sock: socket.socket) -> bool:
        """Read what has arrived of the claim, never past it, from a non-blocking `sock`: whether it is whole.
        HandshakeFailed when the peer closed the connection or it failed."""
        try:
            with memoryview(self._claim) as view:
                n = sock.recv_into(view[self._got:])
        except (BlockingIOError, InterruptedError):
            return False
        except OSError as exc:
            raise HandshakeFailed(f"the connection failed in the handshake ({exc.strerror or exc})") from None
        if n == 0:
            raise HandshakeFailed(f"the peer closed the connection in the handshake ({self._got} of {CLAIM.size} "
                                  "bytes of its claim sent)")
        self._got += n
        return self._got == CLAIM.size

    def judge(self, key: bytes) -> tuple[str | None, bytes]:
        """The node the whole claim proves (None: not proved) and the verdict to send it."""
        nonce, proof, length, padded = CLAIM.unpack(self._claim)
        name = bytes(padded[:length]).decode("ascii", errors="replace") if length <= NAME_BYTES else ""
        if (not valid_name(name) or any(padded[length:])
                or not proofs_match(relay_proof(key, "client", self.nonce, nonce, name), proof)):
            return None, VERDICT.pack(REFUSED, bytes(32))
        return name, VERDICT.pack(PROVEN, relay_proof(key, "server", self.nonce, nonce, name))


def prove(sock: socket.socket, key: bytes, name: str, where: str, deadline: float) -> None:
    """The relay's half on a connected blocking `sock`, by time.monotonic() `deadline`: returns once the GPU host
    at `where` has proved it holds the key and has taken this node's proof; HandshakeFailed otherwise, saying
    which end failed and what to do. `name` must be valid_name."""
    greeting = _read(sock, GREETING.size, deadline, where, "its greeting")
    magic, server_nonce = GREETING.unpack(greeting)
    if magic != MAGIC:
        raise HandshakeFailed(f"{where} is not an Orion relay listener of this release (it did not begin the "
                              "cluster-key handshake)")
    nonce = os.urandom(NONCE_BYTES)
    encoded = name.encode("ascii")
    claim = CLAIM.pack(nonce, relay_proof(key, "client", server_nonce, nonce, name), len(encoded), encoded)
    try:
        sock.settimeout(max(0.001, deadline - time.monotonic()))
        sock.sendall(claim)
    except OSError as exc:
        raise HandshakeFailed(f"sending this host's claim to {where} failed ({exc.strerror or exc})") from None
    status, proof = VERDICT.unpack(_read(sock, VERDICT.size, deadline, where, "its verdict"))
    if status != PROVEN:
        raise HandshakeFailed(f"the GPU host {where} refused this host's proof of the cluster key: the two hosts' "
                              "key files differ; give every member the cluster's key ([cluster] key_file)")
    if not proofs_match(relay_proof(key, "server", server_nonce, nonce, name), proof):
        raise HandshakeFailed(f"the GPU host {where} could not prove that it holds the cluster key: it is not a "
                              "member of this cluster, or its key differs; nothing is relayed to it")


def _read(sock: socket.socket, size: int, deadline: float, where: str, what: str) -> bytes:
    """Exactly `size` bytes by `deadline`."""
    data = bytearray(size)
    got = 0
    with memoryview(data) as view:
        while got < size:
            left = deadline - time.monotonic()
            if left <= 0:
                raise HandshakeFailed(f"{where} did not send {what} in the cluster-key handshake within "
                                      f"{HANDSHAKE_S:g} s: it is not an Orion relay listener of this release, or it "
                                      "is overloaded")
            try:
                sock.settimeout(left)
                n = sock.recv_into(view[got:])
            except TimeoutError:
                continue
            except OSError as exc:
                raise HandshakeFailed(f"the connection to {where} failed in the cluster-key handshake "
                                      f"({exc.strerror or exc})") from None
            if n == 0:
                raise HandshakeFailed(f"{where} closed the connection in the cluster-key handshake, before {what}: "
                                      "it may be refusing this host (too many connections from here), or it is "
                                      "not an Orion relay listener of this release")
            got += n
    return bytes(data)
