"""The host's compiled modules: each a CPython extension built from one C file with the system C compiler, cached,
and loaded once per process (session/hot_path.py's hot_dispatch.c, relay/compiled_pump.py's relay_pump.c).

A module is compiled on first use into a cache directory (a file named after the hash of its source, the shared
header native_common.h and the interpreter) and reused; its source lies beside the Python module that owns it, and
both compile against native_common.h (rings, waits, writes under a relay connection's lock). Without a compiler or
Python's headers, or with ORION_HOT_PATH=0, no module loads and its owner serves everything in Python, saying so
in one log line. The cache is refused when another user could have written it: oriond runs what it loads as
itself. What does not belong here: what a module does.
"""
from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import logging
import os
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

from ivshmem.shared.compiler import CFLAGS, find_compiler

from .errors import UnavailableError

log = logging.getLogger(__name__)
COMMON_HEADER = Path(__file__).resolve().with_name("native_common.h")


class Unavailable(UnavailableError):
    """A compiled module cannot be had here; the message says why, in one line."""


def cache_dir() -> Path:
    """Where built modules are kept: $ORION_CACHE_DIR, else $XDG_CACHE_HOME/orion, else ~/.cache/orion."""
    configured = os.environ.get("ORION_CACHE_DIR")
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "orion"


def compiled_code_off() -> bool:
    """ORION_HOT_PATH=0: the operator turned every compiled module off."""
    return os.environ.get("ORION_HOT_PATH", "1") == "0"


def _trusted(path: Path) -> None:
    """Refuse code another user could have put there: the agent runs what it loads from the cache as itself."""
    info = path.stat()
    if info.st_uid != os.geteuid() or info.st_mode & 0o022:
        raise Unavailable(f"{path} is owned by uid {info.st_uid} or writable by others; the agent loads no code "
                          "from it (set ORION_CACHE_DIR to a directory only this user can write)")


def ring_shape(ring: Any) -> tuple[int, int, int, int, int]:
    """(head word, tail word, first slot, slot size, slots) of one of a ring Endpoint's rings (ivshmem.ring), as
    byte offsets in the region: what native_common.h's ring_from() takes."""
    return ring._head_i * 4, ring._tail_i * 4, ring.data, ring.cell, ring.capacity


class NativeModule:
    """One compiled module: `source` (a C file) built into the extension `name`, loaded at most once per process."""

    def __init__(self, source: Path, name: str, what: str, serves: str) -> None:
        """`what` names the module in the log, and `serves` says what Python does instead when it cannot be had."""
        self.source, self.name, self.what, self.serves = source, name, what, serves
        self._loaded: ModuleType | None | bool = False  # False: not tried yet in this process

    def build(self, directory: Path | None = None) -> Path:
        """The compiled module's path, compiling it first unless this source was built for this interpreter
        already. Raises Unavailable with one line."""
        source = self.source.read_bytes() + COMMON_HEADER.read_bytes()
        include = sysconfig.get_paths()["include"]
        tag = hashlib.sha256(source + sys.version.encode() + include.encode()).hexdigest()[:16]
        suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
        target = (directory or cache_dir()) / f"{self.name}-{tag}{suffix}"
        if target.exists():
            _trusted(target.parent)
            _trusted(target)
            return target
        compiler = find_compiler()
        if compiler is None:
            raise Unavailable("no C compiler (set CC, or install gcc)")
        if not os.path.exists(os.path.join(include, "Python.h")):
            raise Unavailable(f"no Python headers in {include} (install python3-dev)")
        try:
            target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise Unavailable(f"cannot create {target.parent}: {exc.strerror}") from None
        _trusted(target.parent)
        # Built beside its final name and renamed: workers of other sessions may build or load it at the same time.
        fd, partial = tempfile.mkstemp(dir=target.parent, prefix=f".{self.name}-", suffix=suffix)
        os.close(fd)
        try:
            done = subprocess.run([*compiler, *CFLAGS, f"-I{include}", f"-I{COMMON_HEADER.parent}", "-o", partial,
                                   str(self.source)], capture_output=True, text=True, timeout=120)
            if done.returncode != 0:
                first = (done.stderr.strip().splitlines() or ["(no message)"])[0]
                raise Unavailable(f"{compiler[0]} failed on {self.source.name}: {first}")
            os.replace(partial, target)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise Unavailable(f"could not compile {self.source.name}: {exc}") from None
        finally:
            if os.path.exists(partial):
                os.unlink(partial)
        return target

    def load(self) -> ModuleType | None:
        """The compiled module, built on first use; None (and one log line per process) where it cannot be had."""
        if self._loaded is not False:
            return self._loaded or None  # type: ignore[return-value]
        self._loaded = None
        if compiled_code_off():
            log.info("%s off (ORION_HOT_PATH=0): %s", self.what, self.serves)
            return None
        try:
            path = self.build()
            spec = importlib.util.spec_from_file_location(self.name, path)
            if spec is None or spec.loader is None:
                raise Unavailable(f"{path} is not a loadable module")
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        except (Unavailable, ImportError) as exc:
            log.warning("%s unavailable (%s): %s", self.what, exc, self.serves)
            return None
        self._loaded = module
        return module

    def reset(self) -> None:
        """Forget what load() found (tests that simulate a host without a compiler)."""
        self._loaded = False

    def main(self) -> int:
        """`python -m` of the owning module: build it now (setup.sh does), print where it is."""
        try:
            print(self.build())
        except Unavailable as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        return 0
