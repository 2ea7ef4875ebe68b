"""An ordinary cuda.bindings program (nothing Orion in it): structured copies -- cuMemcpy2D, cuMemcpy2DUnaligned,
cuMemcpy2DAsync, cuMemcpy3D, cuMemcpy3DAsync -- in each direction (host to device, device to host, device to
device, host to host) between pitched device memory (cuMemAllocPitch where the driver gives it, else cuMemAlloc
with a pitch of the program's own), pageable host memory and page-locked memory (cuMemAllocHost), sub-rectangles
with offsets in every dimension, and one copy the driver refuses (a device pitch below the width). Prints one line,
RESULT and a JSON object of the statuses and of digests of what came back (never a pitch or an address), so a native
run and a forwarded run must print the same line.

`run(driver)` takes the driver module, so a test can run the same program on another implementation of its API (the
fake driver: tests/wire/test_native_structured_copies.py).
"""
import ctypes
import hashlib
import json

import numpy as np

W, H = 1000, 300  # a 2D copy: bytes per row, rows
W3, H3, D3 = 256, 64, 8  # a 3D copy: bytes per row, rows per slice, slices


def digest(data):
    return hashlib.sha256(bytes(data)).hexdigest()[:16]


def run(driver):
    out: dict = {"statuses": {}, "digests": {}, "same": {}}
    statuses, digests, same = out["statuses"], out["digests"], out["same"]
    keep = []

    def check(name, result):
        err, *rest = result
        statuses[name] = int(err)
        if int(err) != 0:
            raise SystemExit(f"{name}: CUDA error {err!r}")
        return rest[0] if len(rest) == 1 else tuple(rest)

    check("init", driver.cuInit(0))
    device = check("device", driver.cuDeviceGet(0))
    context = check("context", driver.cuDevicePrimaryCtxRetain(device))
    check("set current", driver.cuCtxSetCurrent(context))
    stream = check("stream", driver.cuStreamCreate(0))
    host, dev = driver.CUmemorytype.CU_MEMORYTYPE_HOST, driver.CUmemorytype.CU_MEMORYTYPE_DEVICE

    def pitched(width, rows, fallback):
        """Device memory of `rows` rows of at least `width` bytes: (pointer, pitch)."""
        allocate = getattr(driver, "cuMemAllocPitch", None)
        if allocate is not None:
            err, pointer, pitch = allocate(width, rows, 4)
            if int(err) == 0:
                return pointer, int(pitch)
        return check(f"alloc {width}x{rows}", driver.cuMemAlloc(fallback * rows)), fallback

    def page_locked(size):
        """`size` bytes of page-locked memory as a numpy array (pageable where the driver has no cuMemAllocHost:
        the same bytes either way)."""
        allocate = getattr(driver, "cuMemAllocHost", None)
        if allocate is not None:
            err, pointer = allocate(size)
            if int(err) == 0:
                return np.frombuffer((ctypes.c_char * size).from_address(int(pointer)), dtype=np.uint8)
        array = np.zeros(size, dtype=np.uint8)
        keep.append(array)
        return array

    def side(copy, prefix, kind, address, x=0, y=0, pitch=0, z=None, height=None):
        setattr(copy, prefix + "MemoryType", kind)
        setattr(copy, prefix + ("Host" if kind == host else "Device"), address)
        setattr(copy, prefix + "XInBytes", x)
        setattr(copy, prefix + "Y", y)
        setattr(copy, prefix + "Pitch", pitch)
        if z is not None:
            setattr(copy, prefix + "Z", z)
            setattr(copy, prefix + "Height", height)

    def copy_2d(src, dst, width, rows):
        copy = driver.CUDA_MEMCPY2D()
        side(copy, "src", *src)
        side(copy, "dst", *dst)
        copy.WidthInBytes, copy.Height = width, rows
        return copy

    def copy_3d(src, dst, extent):
        copy = driver.CUDA_MEMCPY3D()
        side(copy, "src", *src)
        side(copy, "dst", *dst)
        copy.WidthInBytes, copy.Height, copy.Depth = extent
        return copy

    rng = np.random.default_rng(7)
    # --- 2D: pageable host -> pitched device -> host, device -> device (unaligned), device -> pageable rows ----------
    image = rng.integers(0, 256, size=(H + 10, 1100), dtype=np.uint8)  # host rows of 1100 bytes
    a, pitch_a = pitched(W, H, 1024)
    b, pitch_b = pitched(W, H, 1152)
    check("htod 2D", driver.cuMemcpy2D(copy_2d((host, image.ctypes.data, 5, 3, 1100), (dev, a, 0, 0, pitch_a), W, H)))
    back = np.zeros((H, W), dtype=np.uint8)
    check("dtoh 2D", driver.cuMemcpy2D(copy_2d((dev, a, 0, 0, pitch_a), (host, back.ctypes.data, 0, 0, W), W, H)))
    same["2D round trip"] = bool((back == image[3:3 + H, 5:5 + W]).all())
    digests["2D round trip"] = digest(back)
    check("dtod 2D", driver.cuMemcpy2DUnaligned(copy_2d((dev, a, 8, 4, pitch_a), (dev, b, 16, 2, pitch_b),
                                                        W - 24, H - 8)))
    rows = np.full((H + 4, 1200), 0xA5, dtype=np.uint8)  # written into rows of 1200 bytes at (x 7, y 3)
    check("dtoh 2D async", driver.cuMemcpy2DAsync(copy_2d((dev, b, 16, 2, pitch_b),
                                                          (host, rows.ctypes.data, 7, 3, 1200), W - 24, H - 8), stream))
    check("sync 2D", driver.cuStreamSynchronize(stream))
    same["2D through two devices"] = bool((rows[3:3 + H - 8, 7:7 + W - 24] == image[7:7 + H - 8, 13:13 + W - 24]).all())
    digests["2D through two devices"] = digest(rows)

    # --- 3D: pageable host -> device (offsets in every dimension), device -> device, device -> host async ------------
    volume = rng.integers(0, 256, size=(D3 + 2, H3 + 3, 300), dtype=np.uint8)  # slices of 67 rows of 300 bytes
    c, pitch_c = pitched(W3, H3 * (D3 + 1), 512)
    d, pitch_d = pitched(W3, H3 * (D3 + 1), 384)
    check("htod 3D", driver.cuMemcpy3D(copy_3d((host, volume.ctypes.data, 4, 1, 300, 1, H3 + 3),
                                               (dev, c, 0, 0, pitch_c, 1, H3), (W3, H3, D3))))
    check("dtod 3D async", driver.cuMemcpy3DAsync(copy_3d((dev, c, 0, 0, pitch_c, 1, H3),
                                                          (dev, d, 0, 0, pitch_d, 0, H3), (W3, H3, D3)), stream))
    slab = np.full((D3 + 1, H3 + 5, 320), 0x3C, dtype=np.uint8)
    check("dtoh 3D async", driver.cuMemcpy3DAsync(copy_3d((dev, d, 16, 2, pitch_d, 0, H3),
                                                          (host, slab.ctypes.data, 9, 4, 320, 1, H3 + 5),
                                                          (W3 - 16, H3 - 2, D3)), stream))
    check("sync 3D", driver.cuStreamSynchronize(stream))
    window = volume[1:1 + D3, 3:3 + H3 - 2, 20:20 + W3 - 16]
    same["3D"] = bool((slab[1:1 + D3, 4:4 + H3 - 2, 9:9 + W3 - 16] == window).all())
    digests["3D"] = digest(slab)

    # --- page-locked memory: to the device and back into it; and host to host -------------------------------------
    locked = page_locked(H * 1024)
    locked[:] = rng.integers(0, 256, size=locked.size, dtype=np.uint8)
    check("htod 2D page-locked", driver.cuMemcpy2DAsync(copy_2d((host, locked.ctypes.data, 0, 0, 1024),
                                                                (dev, a, 0, 0, pitch_a), W, H), stream))
    landed = page_locked(D3 * H3 * W3)
    check("dtoh 3D page-locked", driver.cuMemcpy3DAsync(copy_3d((dev, a, 0, 0, pitch_a, 0, 8),
                                                                (host, landed.ctypes.data, 0, 0, W3, 0, 8),
                                                                (W3, 8, 4)), stream))
    check("sync page-locked", driver.cuStreamSynchronize(stream))
    expected = locked.reshape(H, 1024)[:32, :W3].reshape(4, 8, W3)
    same["page-locked"] = bool((landed[:4 * 8 * W3].reshape(4, 8, W3) == expected).all())
    digests["page-locked"] = digest(landed)
    flat = np.zeros((60, 130), dtype=np.uint8)
    check("htoh 2D", driver.cuMemcpy2D(copy_2d((host, image.ctypes.data, 100, 20, 1100),
                                               (host, flat.ctypes.data, 2, 3, 130), 120, 50)))
    same["host to host"] = bool((flat[3:53, 2:122] == image[20:70, 100:220]).all())
    digests["host to host"] = digest(flat)

    # --- refused by the driver: a device pitch below the width ------------------------------------------------------
    err, = driver.cuMemcpy2D(copy_2d((dev, a, 0, 0, pitch_a), (dev, b, 0, 0, 64), 128, 4))
    statuses["device pitch below the width"] = int(err)

    for pointer in (a, b, c, d):
        check("free", driver.cuMemFree(pointer))
    check("destroy stream", driver.cuStreamDestroy(stream))
    return out


def main():
    from cuda.bindings import driver

    print("RESULT " + json.dumps(run(driver), sort_keys=True))


if __name__ == "__main__":
    main()
