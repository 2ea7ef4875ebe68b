"""The system C compiler, as every part of Orion that compiles C at install or start finds it: the native guest
driver (guest_runtime/native/build.py) and the host's compiled hot path (host_agent/session/hot_path.py), with the same
flags (CFLAGS: a shared object of C11, warnings on). Standard library only (tests/unit/test_import_graph.py)."""
from __future__ import annotations

import os
import shlex
import shutil

CFLAGS = ("-std=c11", "-O2", "-Wall", "-Wextra", "-fPIC", "-shared")  # a shared object, as both builds make one


def find_compiler() -> list[str] | None:
    """The C compiler command: $CC (it may carry flags), else cc, else gcc; None when there is none."""
    configured = os.environ.get("CC", "").strip()
    if configured:
        words = shlex.split(configured)
        return words if shutil.which(words[0]) else None
    for name in ("cc", "gcc"):
        found = shutil.which(name)
        if found:
            return [found]
    return None
