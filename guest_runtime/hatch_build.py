"""Build hook of the orion-guest wheel: compile the native guest driver (libcuda.so.1) into it.

`pip install ./guest_runtime` runs this: the library is generated from the call table and compiled with the
system compiler (docs/native-driver.md), and ships as guest_runtime/native/lib/libcuda.so.1, where the start-up
hook finds it. Without a compiler the install still succeeds, says so in one line, and programs take the
capsule path (`orion-guest probe` says which path a program will use). `make wheels` builds this wheel once, with
the library in it, for guests and containers that have no compiler.
"""
from __future__ import annotations

import sys
import sysconfig
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface


class NativeDriverHook(BuildHookInterface):  # type: ignore[misc]
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name != "wheel":
            return
        # The checkout's ivshmem and guest_runtime, not an installed orion-guest's: its start-up hook
        # (orion_guest.pth) may have imported those at this interpreter's start, and an installed wheel holds no
        # build code (a re-install over it failed: "No module named 'guest_runtime.native.build'").
        for name in [m for m in sys.modules if m.split(".")[0] in ("guest_runtime", "ivshmem")]:
            del sys.modules[name]
        sys.path.insert(0, str(Path(self.root).resolve().parent))
        from guest_runtime.native.build import ALIASES, BuildError, build_driver

        output = Path(self.directory) / "orion-native" / "libcuda.so.1"
        try:
            build_driver(output)
        except BuildError as exc:
            print(f"orion-guest: the native CUDA driver was not built ({exc}); forwarded programs will use the "
                  "capsule path", file=sys.stderr)
            return
        build_data["force_include"][str(output)] = "guest_runtime/native/lib/libcuda.so.1"
        for alias in ALIASES:
            build_data["force_include"][str(output.with_name(alias))] = f"guest_runtime/native/lib/{alias}"
        # A platform wheel for any Python 3: the library is plain C against the C library, no Python ABI, so a
        # guest or container without a compiler installs it (`make wheels`; docs/containers.md).
        build_data["pure_python"] = False
        build_data["tag"] = f"py3-none-{sysconfig.get_platform().replace('-', '_').replace('.', '_')}"
