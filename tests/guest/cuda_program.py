"""An unmodified CUDA Python program: nothing in it knows about Orion.

Run in the libvirt test guest by cuda_guest.py, where the installed orion-guest .pth hook forwards its calls.
Prints one line `CUDA-PROGRAM init=<name>(<code>) devices=<n> name=<device name>` (fields after init only
when cuInit succeeded, i.e. on a host with a GPU).
"""
from cuda.bindings import driver

err, = driver.cuInit(0)
line = f"CUDA-PROGRAM init={err.name}({int(err)})"
if err == driver.CUresult.CUDA_SUCCESS:
    _, count = driver.cuDeviceGetCount()
    _, device = driver.cuDeviceGet(0)
    _, name = driver.cuDeviceGetName(64, device)
    name = name.split(b"\0", 1)[0].decode()
    line += f" devices={count} name={name}"
print(line, flush=True)
