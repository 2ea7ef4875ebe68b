"""The agent's per-host cache of module images, by SHA-256: each fatbin crosses a guest's ring once per host.

PyTorch, cuBLAS and cuDNN load the same multi-MiB fatbins at every start. A guest first asks for a load by the
image's digest (driver_api.IMAGE_BY_DIGEST); a session worker that finds the image here loads it without the guest
sending its bytes. Every session runs in its own worker process, so the cache is a directory, shared by all of them:

* a file per image, named by the hex SHA-256 of its bytes, which the agent computes itself from an image a guest
  sent in full (`store`). A guest names a digest but never chooses what is filed under it: no cache poisoning.
* written atomically (a private temporary file in the directory, then rename), mode 0600: a reader never sees a
  half-written image under a digest's name, and two workers storing the same image both rename identical bytes.
* verified on every read: the file's size must be the size asked for and its bytes must hash to its name; a
  corrupted or truncated file (a full disk, an operator's mistake) is removed and answered as not cached, and the
  guest sends the image again. Hashing costs a few ms per MiB-sized image, far less than the ring would.
* bounded: beyond `limit` bytes the least recently used images go (a hit renews an image's modification time).
* refused unless the directory is this user's and no one else can write to it (mode 0700 when it is created here):
  a directory others could write to would let them plant files and race renames. Verification would still catch
  bytes that do not hash to their name, but a refused directory just means no cache, logged once.

Nothing here raises: a missing or unwritable directory, a full disk, a hostile digest or size all come out as
"not cached" (the old full-image path), each kind logged once per worker.
"""
from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import stat
import time
from dataclasses import dataclass

from ivshmem.driver_api import IMAGE_BY_DIGEST_MIN

log = logging.getLogger(__name__)

DIGEST_BYTES = 32  # SHA-256
TEMP_PREFIX = ".tmp-"
STALE_TEMP_S = 600.0  # a temporary file this old belongs to a writer that died (a live one renames in ms)


@dataclass(frozen=True)
class CacheSettings:
    """Where the cache lives and how much it may hold; an empty directory or a zero limit turn it off."""

    directory: str = ""
    limit: int = 0  # bytes


class ImageCache:
    """One worker's view of the shared directory."""

    def __init__(self, settings: CacheSettings) -> None:
        self.settings = settings
        self._said: set[str] = set()
        self.usable = bool(settings.directory) and settings.limit >= IMAGE_BY_DIGEST_MIN and self._prepare()

    def _once(self, kind: str, message: str, *args: object) -> None:
        """Log one line per kind of trouble: a hostile guest repeating a bad request cannot fill the log."""
        if kind not in self._said:
            self._said.add(kind)
            log.warning("image cache %s: " + message, self.settings.directory, *args)

    def _prepare(self) -> bool:
        """Create the directory (0700) if missing; refuse one that is not ours or that others may write to."""
        directory = self.settings.directory
        try:
            os.makedirs(directory, mode=0o700, exist_ok=True)
            info = os.stat(directory, follow_symlinks=False)
        except OSError as exc:
            self._once("prepare", "unusable (%s); module images travel in full", exc.strerror or exc)
            return False
        if not stat.S_ISDIR(info.st_mode):
            self._once("prepare", "not a directory; module images travel in full")
            return False
        if info.st_uid != os.geteuid() or info.st_mode & 0o022:
            self._once("prepare", "owned by uid %d with mode %o: only the agent's user may write to it "
                       "(chmod 0700); module images travel in full", info.st_uid, stat.S_IMODE(info.st_mode))
            return False
        return True

    def _path(self, digest: bytes) -> str | None:
        if len(digest) != DIGEST_BYTES:
            return None
        return os.path.join(self.settings.directory, digest.hex())

    # --- reading ------------------------------------------------------------------------------------------------
    def load(self, digest: bytes, size: int) -> bytes | None:
        """The image of `size` bytes whose SHA-256 is `digest`, or None (not held, or not what it should be)."""
        path = self._path(digest)
        if not self.usable or path is None or not IMAGE_BY_DIGEST_MIN <= size <= self.settings.limit:
            return None
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        except OSError as exc:
            self._once("open", "cannot open a cached image (%s)", exc.strerror or exc)
            return None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_size != size:
                return None  # a guest's wrong size, or a truncated file (replaced by the next store): a miss
            data = _read_all(fd, size)
        except OSError as exc:
            self._once("read", "cannot read a cached image (%s)", exc.strerror or exc)
            return None
        finally:
            os.close(fd)
        if len(data) != size or hashlib.sha256(data).digest() != digest:
            self._bad(path, info, "does not hash to its name")
            return None
        with contextlib.suppress(OSError):
            os.utime(path)  # recently used: evicted last
        return data

    def _bad(self, path: str, info: os.stat_result, why: str) -> None:
        """A file of the right size under a digest's name that is not that image (only corruption makes one: the
        name is what this module computed): removed if it is still the same file. A file of another size is left
        to the next store, which replaces it: a guest naming a wrong size must not make anyone's image go."""
        self._once("corrupt", "%s %s; removed", os.path.basename(path), why)
        with contextlib.suppress(OSError):
            now = os.stat(path, follow_symlinks=False)
            if (now.st_dev, now.st_ino) == (info.st_dev, info.st_ino):
                os.unlink(path)

    # --- writing ------------------------------------------------------------------------------------------------
    def store(self, image: bytes | memoryview) -> bytes | None:
        """Keep `image` under the digest computed here; its digest, or None when it is not kept."""
        size = len(image)
        if not self.usable or not IMAGE_BY_DIGEST_MIN <= size <= self.settings.limit:
            return None
        digest = hashlib.sha256(image).digest()
        path = os.path.join(self.settings.directory, digest.hex())
        # Written even when a file of that name exists: a store follows a miss, so what is there is missing,
        # truncated or corrupt, or another worker's identical copy that the rename replaces harmlessly.
        temp = os.path.join(self.settings.directory, f"{TEMP_PREFIX}{os.getpid()}-{os.urandom(6).hex()}")
        try:
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                view = memoryview(image).cast("B")
                while view:
                    view = view[os.write(fd, view):]
            finally:
                os.close(fd)
            os.rename(temp, path)  # atomic: readers see all of it or none; a concurrent writer's is identical
        except OSError as exc:
            self._once("write", "cannot store an image (%s); it will travel in full again", exc.strerror or exc)
            with contextlib.suppress(OSError):
                os.unlink(temp)
            return None
        self._evict()
        return digest

    def _evict(self) -> None:
        """Remove the least recently used images until the directory holds at most `limit` bytes (and the
        temporary files of writers that died)."""
        now = time.time()
        images: list[tuple[float, int, str]] = []
        try:
            with os.scandir(self.settings.directory) as entries:
                for entry in entries:
                    try:
                        info = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue  # removed meanwhile by another worker
                    if entry.name.startswith(TEMP_PREFIX):
                        if now - info.st_mtime > STALE_TEMP_S:
                            _remove(entry.path)
                    elif stat.S_ISREG(info.st_mode) and len(entry.name) == 2 * DIGEST_BYTES:
                        images.append((info.st_mtime, info.st_size, entry.path))
        except OSError as exc:
            self._once("scan", "cannot list it (%s); not bounding it this time", exc.strerror or exc)
            return
        total = sum(size for _, size, _ in images)
        for _, size, path in sorted(images):
            if total <= self.settings.limit:
                break
            _remove(path)
            total -= size


def _read_all(fd: int, size: int) -> bytes:
    parts, got = [], 0
    while got < size:
        chunk = os.read(fd, size - got)
        if not chunk:
            break
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


def _remove(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)  # gone already: another worker evicted it first
