"""Build hook of the orion-vgpu distribution: compile kubelet's device-plugin API for orion-k8s-plugin.

host_agent/k8s/deviceplugin.proto is compiled with grpcio-tools (a build requirement, pinned to the oldest
grpcio this project allows, so the generated modules' own version checks pass with every protobuf and grpcio
the project accepts) into host_agent/k8s/deviceplugin_pb2.py and deviceplugin_pb2_grpc.py. They are written
into the source tree, where an editable install (setup.sh) and a checkout on PYTHONPATH import them, and are
added to a built wheel. Git ignores them: the .proto is the source.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

PROTO = "host_agent/k8s/deviceplugin.proto"
GENERATED = ("host_agent/k8s/deviceplugin_pb2.py", "host_agent/k8s/deviceplugin_pb2_grpc.py")


def compile_api(root: Path) -> None:
    """Run protoc (grpcio-tools' own) on the API; RuntimeError with its message when it fails."""
    from grpc_tools import protoc  # the build environment's grpcio-tools

    include = Path(protoc.__file__).parent / "_proto"  # protoc's well-known types
    code = protoc.main(["protoc", f"-I{root}", f"-I{include}", f"--python_out={root}", f"--grpc_python_out={root}",
                        str(root / PROTO)])
    if code != 0:
        raise RuntimeError(f"protoc could not compile {PROTO} (exit {code}; its message is above)")


class DevicePluginApiHook(BuildHookInterface):  # type: ignore[misc]
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name != "wheel":
            return
        root = Path(self.root)
        compile_api(root)
        if version != "editable":
            for path in GENERATED:
                build_data["force_include"][str(root / path)] = path


if __name__ == "__main__":  # regenerate in a checkout: python hatch_build.py (needs grpcio-tools)
    compile_api(Path(__file__).resolve().parent)
    print("generated " + ", ".join(GENERATED), file=sys.stderr)
