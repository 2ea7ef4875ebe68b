"""The cluster key: the one secret that makes an oriond, the controller or the device plugin a member of this
cluster (docs/security.md, "Who may talk to whom"), and the MACs made with it.

The key is a root-only file (`[cluster] key_file`, default /etc/orion/cluster.key): a regular file, owned by the
user reading it, with no group or other permission bits, at least 32 bytes. Any other file is refused with one
line that says how to make it right, never read half-trusted. Guests, pods and containers never hold it.

Two uses, both HMAC-SHA256 with a domain label so that a MAC made for one use is never accepted for another:
- the relay handshake (`relay_proof`): mutual challenge-response over two fresh nonces, before any frame beyond
  the handshake is read;
- requests to the controller's member-only endpoints (`sign_request` / `verify_request`): a MAC over method,
  path, a timestamp and the body's digest, with the member's name, so that the controller knows which node asks.

What does not belong here: who may call what (controller/http_api.py, host_agent/relay/listener.py).
"""
from __future__ import annotations

import hashlib
import hmac
import os
import stat
import time
from pathlib import Path

DEFAULT_KEY_FILE = Path("/etc/orion/cluster.key")
MIN_KEY_BYTES = 32
MAX_KEY_BYTES = 4096
NONCE_BYTES = 32
MAX_CLOCK_SKEW_S = 60
AUTH_SCHEME = "Orion-HMAC"


class ClusterKeyError(Exception):
    """The key file is missing or not safe to use; the message says what to do."""


def make_key_file(path: Path) -> None:
    """Write a fresh random key (what `orion-controller cluster-key` and setup.sh do): 0600, never overwriting."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, os.urandom(MIN_KEY_BYTES).hex().encode() + b"\n")
    finally:
        os.close(fd)


def load_key(path: Path) -> bytes:
    """The key's bytes, or ClusterKeyError naming what is wrong with the file and how to fix it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        raise ClusterKeyError(f"cluster key {path} does not exist: copy the cluster's key there (mode 0600), or make "
                        f"one with `orion-controller cluster-key {path}`") from None
    except OSError as err:
        raise ClusterKeyError(f"cluster key {path} cannot be opened ({err.strerror}): it must be a regular file, "
                        f"not a link") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ClusterKeyError(f"cluster key {path} is not a regular file")
        if info.st_uid != os.geteuid():
            raise ClusterKeyError(f"cluster key {path} belongs to uid {info.st_uid}, not to this process's "
                            f"uid {os.geteuid()}: chown it")
        if info.st_mode & 0o077:
            raise ClusterKeyError(f"cluster key {path} has mode {stat.S_IMODE(info.st_mode):04o}: others could read "
                            f"it; chmod 600 {path}")
        data = os.read(fd, MAX_KEY_BYTES + 1).strip()
    finally:
        os.close(fd)
    if len(data) < MIN_KEY_BYTES or len(data) > MAX_KEY_BYTES:
        raise ClusterKeyError(f"cluster key {path} holds {len(data)} bytes: it must hold {MIN_KEY_BYTES} to "
                        f"{MAX_KEY_BYTES} (make one with `orion-controller cluster-key`)")
    return data


def _mac(key: bytes, label: bytes, *parts: bytes) -> bytes:
    mac = hmac.new(key, label, hashlib.sha256)
    for part in parts:  # length-prefixed: no two different part lists give the same MAC input
        mac.update(len(part).to_bytes(4, "big"))
        mac.update(part)
    return mac.digest()


def relay_proof(key: bytes, role: str, server_nonce: bytes, client_nonce: bytes, name: str) -> bytes:
    """What one end of a relay connection sends to prove it holds the key: `role` "client" (the relaying oriond,
    named `name`) or "server" (the GPU host), over both ends' fresh nonces."""
    return _mac(key, b"orion-relay-" + role.encode(), server_nonce, client_nonce, name.encode())


def proofs_match(expected: bytes, got: bytes) -> bool:
    return hmac.compare_digest(expected, got)


def sign_request(key: bytes, member: str, method: str, path: str, body: bytes,
                 now: float | None = None) -> str:
    """The Authorization header value for a member's request to the controller."""
    ts = str(int(time.time() if now is None else now))
    mac = _mac(key, b"orion-http", method.upper().encode(), path.encode(), ts.encode(),
               hashlib.sha256(body).digest(), member.encode())
    return f'{AUTH_SCHEME} member="{member}", ts="{ts}", mac="{mac.hex()}"'


def verify_request(key: bytes, header: str, method: str, path: str, body: bytes,
                   now: float | None = None) -> str | None:
    """The member a request's Authorization header proves, or None: no header, a malformed one, a wrong MAC or
    a timestamp more than MAX_CLOCK_SKEW_S away from now."""
    scheme, _, rest = header.partition(" ")
    if scheme != AUTH_SCHEME:
        return None
    fields: dict[str, str] = {}
    for item in rest.split(","):
        name, eq, value = item.strip().partition("=")
        if not eq or len(value) < 2 or value[0] != '"' or value[-1] != '"':
            return None
        fields[name] = value[1:-1]
    member, ts, mac = fields.get("member", ""), fields.get("ts", ""), fields.get("mac", "")
    if not member or not ts.isascii() or not ts.isdigit() or len(ts) > 12:
        return None
    if abs(int(ts) - (time.time() if now is None else now)) > MAX_CLOCK_SKEW_S:
        return None
    expected = _mac(key, b"orion-http", method.upper().encode(), path.encode(), ts.encode(),
                    hashlib.sha256(body).digest(), member.encode())
    try:
        got = bytes.fromhex(mac)
    except ValueError:
        return None
    return member if hmac.compare_digest(expected, got) else None
