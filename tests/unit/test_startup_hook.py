"""orion_guest.pth runs in every Python process of an environment with orion-guest installed: without Orion's
environment it must cost nothing beyond its own tiny module (it once imported the whole forwarding layer,
~0.1 s, into every interpreter); with it, forwarding is on before the program's first line."""
from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest

from guest_runtime.activate import same_signature
from ivshmem.driver_api import CALLS

LOADED = ("import sys; print(' '.join(sorted(m for m in sys.modules "
          "if m.split('.')[0] in ('guest_runtime', 'ivshmem', 'cuda'))))")


def _modules(**extra: str) -> set[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORION_")} | extra
    out = subprocess.run([sys.executable, "-c", LOADED], env=env, capture_output=True, text=True, timeout=60,
                         check=True).stdout
    return set(out.split())


def test_without_orions_environment_start_up_imports_only_the_hook() -> None:
    assert _modules() == {"guest_runtime", "guest_runtime.startup"}  # the .pth ran, and did nothing more


def test_with_orions_environment_forwarding_is_on_at_start_up() -> None:
    loaded = _modules(ORION_SHM="/nonexistent/orionsock0")  # nothing connects before the first CUDA call
    assert {"guest_runtime.activate", "guest_runtime.forward", "ivshmem.driver_api"} <= loaded


def test_a_function_whose_wheel_signature_differs_is_left_to_the_fallback(caplog: pytest.LogCaptureFixture) -> None:
    """Another cuda-bindings' cuCtxCreate (say, 12.x's three parameters) would be handed arguments the table's
    implementation misreads: it is not forwarded, and the log says why and what to install."""
    impls = {"cuCtxCreate": lambda *a: 0, "cuInit": lambda *a: 0, "cuMemAlloc": lambda *a: 0}
    wheel = {"cuCtxCreate": "CUresult (CUcontext *, unsigned int, CUdevice)", "cuInit": CALLS["cuInit"].signature}
    with caplog.at_level(logging.WARNING):
        kept = same_signature(impls, wheel)
    assert set(kept) == {"cuInit", "cuMemAlloc"}  # a function the wheel lacks is the hook's business
    assert "cuCtxCreate is CUresult (CUcontext *, unsigned int, CUdevice) in this cuda-bindings" in caplog.text
    assert "orion-guest[cuda]" in caplog.text
