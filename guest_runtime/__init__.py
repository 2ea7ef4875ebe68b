"""orion-guest: the client side of Orion vGPU, for QEMU guests, containers and GPU-less hosts.

It finds its region (ORION_SHM, an ivshmem PCI device or a /dev/shm file), claims a channel, and forwards the
CUDA driver calls of the call table (ivshmem/driver_api.py) to the host agent: the `.pth` start-up hook turns
forwarding on when Orion's environment is set (startup.py, activate.py), before cuda-python copies the driver's
function pointers. It also asks the Orion Controller for vGPUs (allocation.py) and ships `orion-guest probe`
and `orion-check`. At import its modules need only the standard library and `ivshmem` (cuda.bindings is the
program's own, reached once the program has imported it). `ini.py` and `controller_client.py` are the two
modules the host side may import from here; importing this package itself does nothing.
"""
