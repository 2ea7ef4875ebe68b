"""Memory of one device mapped for two with the virtual-memory API (issue 32: "multi-device memory"), through the
driver API as a program that shares a buffer between its GPUs does it: device 0's physical memory, one address range
with read-write access for both devices; device 0 writes it, device 1's context copies it to its own memory and
writes a word of it back, device 0 reads that; a second range mapped for device 0 alone reports no access for
device 1. RESULT: every step's status, the access flags each device reports, and whether each read saw the other
device's bytes. With fewer than two devices it reports only the count."""
import json

from cuda.bindings import driver as cu

out = {}


def call(name, *args):
    """The call's status (recorded under `name`) and its value, if any."""
    err, *values = getattr(cu, name.split(" ")[0])(*args)
    out.setdefault("status", {})[name] = int(err)
    return values[0] if len(values) == 1 else values


def location(device):
    where = cu.CUmemLocation()
    where.type, where.id = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE, device
    return where


def access(device):
    desc = cu.CUmemAccessDesc()
    desc.location, desc.flags = location(device), cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    return desc


call("cuInit", 0)
count = call("cuDeviceGetCount")
out["count"] = count
if count >= 2:
    contexts = [call(f"cuDevicePrimaryCtxRetain {d}", call(f"cuDeviceGet {d}", d)) for d in (0, 1)]
    out["peer"] = call("cuDeviceCanAccessPeer", 1, 0)
    call("cuCtxSetCurrent 0", contexts[0])
    prop = cu.CUmemAllocationProp()
    prop.type, prop.location = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED, location(0)
    size = call("cuMemGetAllocationGranularity", prop,
                cu.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM)
    handle = call("cuMemCreate", size, prop, 0)
    shared, alone = call("cuMemAddressReserve shared", size, 0, 0, 0), call("cuMemAddressReserve alone", size, 0, 0, 0)
    call("cuMemMap shared", shared, size, 0, handle, 0)
    call("cuMemMap alone", alone, size, 0, handle, 0)
    call("cuMemSetAccess shared", shared, size, [access(0), access(1)], 2)
    call("cuMemSetAccess alone", alone, size, [access(0)], 1)
    out["access"] = {name: [int(call(f"cuMemGetAccess {name} {d}", location(d), base)) for d in (0, 1)]
                     for name, base in (("shared", shared), ("alone", alone))}
    pattern = bytes((i * 13 + 5) & 0xFF for i in range(size))
    call("cuMemcpyHtoD", shared, pattern, size)
    call("cuCtxSynchronize 0")
    call("cuCtxSetCurrent 1", contexts[1])  # device 1's context: its copies and memsets reach device 0's memory
    own = call("cuMemAlloc", size)
    call("cuMemcpyDtoD to device 1", own, shared, size)
    call("cuMemsetD32 on device 0's memory", shared, 0xA5A5A5A5, 4)
    call("cuCtxSynchronize 1")
    seen = bytearray(size)
    call("cuMemcpyDtoH from device 1", seen, own, size)
    out["device1_read"] = bytes(seen) == pattern
    call("cuCtxSetCurrent 0 again", contexts[0])
    head = bytearray(32)
    call("cuMemcpyDtoH through the other range", head, alone, 32)
    out["device0_read"] = bytes(head) == b"\xa5" * 16 + pattern[16:32]
    call("cuMemUnmap shared", shared, size)
    call("cuMemUnmap alone", alone, size)
    call("cuMemAddressFree shared", shared, size)
    call("cuMemAddressFree alone", alone, size)
    call("cuMemRelease", handle)
    call("cuMemFree", own)
    out["ok"] = out["device1_read"] and out["device0_read"] and not any(out["status"].values())
print("RESULT " + json.dumps(out, sort_keys=True))
