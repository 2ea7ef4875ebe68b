"""The system C compiler, as every part of Orion that compiles C at install or start finds it: the native guest
driver (guest_runtime/native/build.py) and the host's compiled hot path (host_agent/hot_path.py). Standard
library only, so the host side may import it (tests/unit/test_import_graph.py)."""
from __future__ import annotations

import os
import shlex
import shutil


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
