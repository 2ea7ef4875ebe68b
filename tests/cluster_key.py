"""The cluster key of the tests' orionds, listeners and relays (docs/security.md, "Who may talk to whom: the cluster
key"): one fixed key, so that every process a test starts -- an oriond, a helper agent, a forked listener or
relay -- holds the same one without it being passed around. Each process that needs a key *file* writes the key to
one of its own (`key_file`, or `write_key` where a test wants it), as oriond requires: a regular file of the
process's user, mode 0600. A test that needs another key (an impostor, a relay with the wrong one) writes
`OTHER_KEY`.
"""
from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

TEST_KEY = b"7d2c0f9e4b8a1c6e3f5d7b9a0c2e4f6a8b1d3c5e7f9a2b4c6d8e0f1a3b5c7d9e"
OTHER_KEY = b"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
_made: Path | None = None  # the key file this process (or the one it was forked from) made


def write_key(path: Path, key: bytes = TEST_KEY) -> Path:
    """`key` in a new file `path`, mode 0600 (an existing one is replaced)."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, key + b"\n")
    finally:
        os.close(fd)
    return path


def key_file() -> Path:
    """A file holding TEST_KEY, made on first use (a forked child uses its parent's) and removed at the maker's
    exit."""
    global _made
    if _made is None or not _made.exists():
        directory = Path(tempfile.mkdtemp(prefix="orion-test-key-"))
        _made = write_key(directory / "cluster.key")
        atexit.register(shutil.rmtree, directory, ignore_errors=True)
    return _made
