"""A guest process for the allocation tests: the first CUDA call (cuInit, through the real Forwarder) under
the ORION_* environment the test gives it; prints ``{"cuInit": <CUresult>, "id": <allocation id or null>}``
as one line, then waits for a line on stdin (or EOF) and exits normally, so atexit runs.

``python tests/controller/allocating_guest.py`` — run with ORION_CONTROLLER / ORION_VGPU / ORION_GMEM set.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from guest_runtime import allocation  # noqa: E402
from guest_runtime.activate import activate  # noqa: E402


def main() -> int:
    result = activate().implementations()["cuInit"](0)
    alloc = allocation.current()
    print(json.dumps({"cuInit": result, "id": alloc.id if alloc else None,
                      "host": alloc.host if alloc else None}), flush=True)
    sys.stdin.readline()
    return 0


if __name__ == "__main__":
    sys.exit(main())
