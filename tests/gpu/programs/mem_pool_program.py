"""An ordinary cuda.bindings program (nothing Orion in it): a memory pool of its own (created, its access set and read,
allocated from in stream order, values copied in and out, its attributes read, trimmed, destroyed), CUDA 13's pools by
location (the default and current pool of a device, a pool made current), a pitched allocation, and the virtual-memory
queries (access of a mapped range, an allocation's properties from its handle, a handle retained from an address and
released twice). Prints one JSON line of results, so the same program can be run natively and forwarded and the two
outputs compared. It launches no kernel, so it also runs against tests/fake_driver.py through the native driver
(tests/wire/test_native_mem_pools.py)."""
import json
import sys

import numpy as np
from cuda.bindings import driver

MIB = 1 << 20


def check(result):
    err, *rest = result
    if int(err) != 0:
        raise SystemExit(f"CUDA error {err!r}")
    return rest[0] if len(rest) == 1 else tuple(rest)


def location(ordinal):
    where = driver.CUmemLocation()
    where.type = driver.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    where.id = ordinal
    return where


def access(ordinal, flags=driver.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE):
    desc = driver.CUmemAccessDesc()
    desc.location = location(ordinal)
    desc.flags = flags
    return desc


def pool_attribute(pool, name):
    """The attribute, or "bindings" where cuda-bindings' own value helper refuses it in Python before any driver
    (13.3: MAX_POOL_SIZE and the location attributes, measured on the H200), natively and forwarded alike; the
    forwarding host answers 801 for it (its cuda-bindings refuses it too)."""
    try:
        result = driver.cuMemPoolGetAttribute(pool, getattr(driver.CUmemPool_attribute, name))
    except TypeError:
        return "bindings"
    return int(check(result))


def pool_of(pointer):
    attribute = driver.CUpointer_attribute.CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE
    return int(check(driver.cuPointerGetAttribute(attribute, pointer)))


def read(pointer, count, dtype=np.uint32):
    host = np.zeros(count, dtype=dtype)
    check(driver.cuMemcpyDtoH(host.ctypes.data, pointer, host.nbytes))
    return host


def own_pool(out, stream, peers):
    """A pool of the program's own on device 0: access, a stream-ordered allocation used and freed, attributes."""
    pinned = driver.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    props = driver.CUmemPoolProps()
    props.allocType = pinned
    props.handleTypes = driver.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_NONE
    props.location = location(0)
    props.maxSize = 64 * MIB
    pool = check(driver.cuMemPoolCreate(props))
    check(driver.cuMemPoolSetAccess(pool, [access(0)] + [access(p) for p in peers], 1 + len(peers)))
    out["pool_access"] = [int(check(driver.cuMemPoolGetAccess(pool, location(d)))) for d in [0, *peers]]
    threshold = driver.CUmemPool_attribute.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD
    check(driver.cuMemPoolSetAttribute(pool, threshold, driver.cuuint64_t(8 * MIB)))
    out["pool_threshold"] = pool_attribute(pool, "CU_MEMPOOL_ATTR_RELEASE_THRESHOLD")
    # (LOCATION_TYPE and LOCATION_ID are CUDA 13's; cuda-bindings 13.3's getter refuses them in Python, measured on
    # the H200, so they are not asked here)
    out["pool_max_size"] = pool_attribute(pool, "CU_MEMPOOL_ATTR_MAX_POOL_SIZE")

    n = 1 << 20  # 4 MiB of words: staged through the region in chunks
    values = (np.arange(n, dtype=np.uint64) * 2654435761 % 1000003).astype(np.uint32)
    pointer = check(driver.cuMemAllocFromPoolAsync(values.nbytes, pool, stream))
    check(driver.cuMemcpyHtoDAsync(pointer, values.ctypes.data, values.nbytes, stream))
    check(driver.cuMemsetD32Async(int(pointer) + 4 * 1000, 7, 24, stream))
    back = np.zeros(n, dtype=np.uint32)
    check(driver.cuMemcpyDtoHAsync(back.ctypes.data, pointer, back.nbytes, stream))
    check(driver.cuStreamSynchronize(stream))
    expected = values.copy()
    expected[1000:1024] = 7
    out["pool_copy_ok"] = bool((back == expected).all())
    out["pool_copy_sum"] = int(back.sum(dtype=np.uint64))
    out["pool_used"] = pool_attribute(pool, "CU_MEMPOOL_ATTR_USED_MEM_CURRENT") >= values.nbytes
    out["pool_handle_ok"] = pool_of(pointer) == int(pool)
    plain = check(driver.cuMemAlloc(4096))  # the pool's memory is device memory like any other: DtoD, unified copies
    check(driver.cuMemcpyDtoD(plain, int(pointer) + 4 * 996, 64))
    words = np.arange(16, dtype=np.uint32) + 100
    check(driver.cuMemcpy(int(pointer) + 4 * 16, words.ctypes.data, words.nbytes))
    check(driver.cuMemcpy(int(plain) + 64, int(pointer) + 4 * 16, words.nbytes))
    out["pool_dtod"] = [int(v) for v in read(plain, 32)]
    check(driver.cuMemFree(plain))
    check(driver.cuMemFreeAsync(pointer, stream))
    check(driver.cuStreamSynchronize(stream))
    out["pool_used_after_free"] = pool_attribute(pool, "CU_MEMPOOL_ATTR_USED_MEM_CURRENT")
    check(driver.cuMemPoolTrimTo(pool, 0))
    out["pool_reserved_after_trim"] = pool_attribute(pool, "CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT")
    return pool


def pools_by_location(out, dev, stream, pool):
    """CUDA 13's location-based queries agree with the device ones; a pool made current serves cuMemAllocAsync."""
    pinned = driver.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    default = check(driver.cuMemGetDefaultMemPool(location(0), pinned))
    out["default_pool_ok"] = int(default) == int(check(driver.cuDeviceGetDefaultMemPool(dev)))
    out["current_is_default"] = int(check(driver.cuMemGetMemPool(location(0), pinned))) == int(default)
    check(driver.cuMemSetMemPool(location(0), pinned, pool))
    out["current_is_pool"] = [int(check(driver.cuMemGetMemPool(location(0), pinned))) == int(pool),
                              int(check(driver.cuDeviceGetMemPool(dev))) == int(pool)]
    pointer = check(driver.cuMemAllocAsync(MIB, stream))
    out["async_from_pool"] = pool_of(pointer) == int(pool)
    check(driver.cuMemsetD32Async(pointer, 0xABCD, MIB // 4, stream))
    check(driver.cuStreamSynchronize(stream))
    out["async_sum"] = int(read(pointer, MIB // 4).sum(dtype=np.uint64))
    check(driver.cuMemFreeAsync(pointer, stream))
    check(driver.cuStreamSynchronize(stream))
    check(driver.cuMemSetMemPool(location(0), pinned, default))
    out["current_is_default_again"] = int(check(driver.cuDeviceGetMemPool(dev))) == int(default)
    return default


def pitched(out):
    """pitch x rows bytes, each row reached at its pitch."""
    width, rows = 1000, 8
    pointer, pitch = check(driver.cuMemAllocPitch(width, rows, 4))
    out["pitch_ok"] = pitch >= width and pitch % 4 == 0
    check(driver.cuMemsetD32(pointer, 3, pitch * rows // 4))
    row = (np.arange(width // 4, dtype=np.uint32) + 1) * 11
    for r in range(rows):
        check(driver.cuMemcpyHtoD(int(pointer) + r * pitch, (row + r).ctypes.data, width))
    last = read(int(pointer) + (rows - 1) * pitch, pitch // 4)
    out["pitch_last_row_ok"] = bool((last[:width // 4] == row + rows - 1).all() and (last[width // 4:] == 3).all())
    out["pitch_rows_sum"] = sum(int(read(int(pointer) + r * pitch, width // 4).sum(dtype=np.uint64))
                                for r in range(rows))
    check(driver.cuMemFree(pointer))


def virtual_memory(out):
    """A mapped range's access, its allocation's properties, and a handle retained from an address."""
    prop = driver.CUmemAllocationProp()
    prop.type = driver.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location = location(0)
    granularity = check(driver.cuMemGetAllocationGranularity(
        prop, driver.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM))
    base = check(driver.cuMemAddressReserve(2 * granularity, 0, 0, 0))
    handle = check(driver.cuMemCreate(granularity, prop, 0))
    check(driver.cuMemMap(base, granularity, 0, handle, 0))
    check(driver.cuMemSetAccess(base, granularity, [access(0)], 1))
    out["vmm_access"] = int(check(driver.cuMemGetAccess(location(0), base)))
    got = check(driver.cuMemGetAllocationPropertiesFromHandle(handle))
    out["vmm_prop"] = [int(got.type), int(got.requestedHandleTypes), int(got.location.type), int(got.location.id)]
    retained = check(driver.cuMemRetainAllocationHandle(int(base) + 4096))
    out["retained_same"] = int(retained) == int(handle)
    data = (np.arange(4096, dtype=np.uint32) * 3).astype(np.uint32)
    check(driver.cuMemcpyHtoD(base, data.ctypes.data, data.nbytes))
    check(driver.cuMemRelease(retained))  # the retain's reference, then the creation's: still mapped, still there
    check(driver.cuMemRelease(handle))
    out["vmm_sum_after_release"] = int(read(base, 4096).sum(dtype=np.uint64))
    check(driver.cuMemUnmap(base, granularity))
    check(driver.cuMemAddressFree(base, 2 * granularity))


def main():
    out = {}
    check(driver.cuInit(0))
    dev = check(driver.cuDeviceGet(0))
    count = check(driver.cuDeviceGetCount())
    supported = driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED
    out["pools_supported"] = check(driver.cuDeviceGetAttribute(supported, dev))
    ctx = check(driver.cuDevicePrimaryCtxRetain(dev))
    check(driver.cuCtxSetCurrent(ctx))
    peers = [d for d in range(1, count) if check(driver.cuDeviceCanAccessPeer(dev, check(driver.cuDeviceGet(d))))]
    stream = check(driver.cuStreamCreate(1))  # CU_STREAM_NON_BLOCKING
    pool = own_pool(out, stream, peers)
    default = pools_by_location(out, dev, stream, pool)
    check(driver.cuMemPoolDestroy(pool))
    out["destroy_default"] = int(driver.cuMemPoolDestroy(default)[0])  # a device's default pool is not destroyed
    pitched(out)
    virtual_memory(out)
    check(driver.cuStreamDestroy(stream))
    check(driver.cuDevicePrimaryCtxRelease(dev))
    print("RESULT " + json.dumps(out, sort_keys=True))


if __name__ == "__main__":
    sys.exit(main())
