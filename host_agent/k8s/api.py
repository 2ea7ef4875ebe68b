"""Kubelet's device-plugin API v1beta1: the compiled messages and stubs, and the names kubelet expects.

The modules are compiled from deviceplugin.proto when the package is built (hatch_build.py); a checkout that
was never installed lacks them, and importing this says how to get them rather than failing deep in grpc.
"""
from __future__ import annotations

from ..errors import UnavailableError

VERSION = "v1beta1"  # RegisterRequest.version
DEVICE_PLUGIN_DIR = "/var/lib/kubelet/device-plugins/"
KUBELET_SOCKET = "kubelet.sock"  # kubelet's Registration service, in DEVICE_PLUGIN_DIR
HEALTHY, UNHEALTHY = "Healthy", "Unhealthy"
RESOURCE_NAME = "virtaitech.com/gpu"  # Orion's resource name
ENDPOINT = "orion-vgpu.sock"  # this plugin's socket, in DEVICE_PLUGIN_DIR


class ApiMissing(UnavailableError, ImportError):
    """The compiled API modules are not there (the package was not built)."""


try:
    from . import deviceplugin_pb2 as pb
    from . import deviceplugin_pb2_grpc as rpc
except ImportError as exc:  # pragma: no cover - the generated modules are present in every installed copy
    raise ApiMissing(f"kubelet's device-plugin API is not compiled ({exc}); install the package (sudo ./setup.sh, "
                     "or pip install .), which compiles host_agent/k8s/deviceplugin.proto") from None

__all__ = ["DEVICE_PLUGIN_DIR", "ENDPOINT", "HEALTHY", "KUBELET_SOCKET", "RESOURCE_NAME", "UNHEALTHY", "VERSION",
           "ApiMissing", "pb", "rpc"]
