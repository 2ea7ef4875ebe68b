"""orion-guest: the client side of Orion vGPU, for QEMU guests, containers and GPU-less hosts.

For now it finds its region and proves the wire end to end (`orion-guest probe`); the CUDA interception
comes with the forwarding layer. It imports only the standard library and `ivshmem`.
"""
