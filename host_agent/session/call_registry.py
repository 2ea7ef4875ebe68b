"""The host's registries of the calls it serves by hand (HOST) and of the generic calls its policies decide
(POLICY), kept apart from executor.py so that CudaExecutor's mixins (vmm_calls.py, launch_extras.py), which
executor.py imports, can register their handlers without importing executor.py back."""
from __future__ import annotations

from ivshmem.driver_api import Handlers

HOST = Handlers("host")  # hand-written calls, by name: CudaExecutor and its mixins
# Generic calls whose answer the session's devices and quota decide, before (or instead of) the driver.
POLICY = Handlers("host policy")
