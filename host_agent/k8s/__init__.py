"""orion-k8s-plugin: kubelet's device plugin for Orion vGPUs (docs/kubernetes.md).

It advertises this node's vGPUs, as the controller sees them, as the extended resource ``virtaitech.com/gpu``
and, when kubelet admits a container that asks for some, gives that container its own region and the
environment that points Orion's guest runtime at it. One module per job: ``api`` (kubelet's wire),
``devices`` (the device list and its health), ``pool_watch`` (keeps them from the controller),
``container_regions`` (a region per container), ``service`` (the DevicePlugin gRPC service), ``plugin`` (the
socket, registration with kubelet and kubelet's restarts) and ``cli``.
"""
