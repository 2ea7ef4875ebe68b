"""An ordinary cuda.bindings program (nothing Orion in it): TMA descriptors encoded by the driver (a tiled map, an
im2col map and, where the driver has it, a wide im2col map) on one allocation, each pointed at a second allocation
with cuTensorMapReplaceAddress, and an allocation class set. A descriptor's bytes embed addresses that differ
between runs, so it prints only the CUresults and address-independent properties within one run: that a replaced
map's bytes are those of the same map encoded directly at the new address, and the class in effect. Prints one JSON
line, so the same program can be run natively and forwarded and the two outputs compared. It launches no kernel, so
it also runs against tests/fake_driver.py through the native driver (tests/wire/test_native_tensor_maps.py)."""
import ctypes
import json

from cuda.bindings import driver

MIB = 1 << 20
FP32 = driver.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT32
NONE = (driver.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        driver.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_NONE,
        driver.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_NONE,
        driver.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
DIMS, STRIDES, STEPS = [16, 8, 8, 2], [64, 512, 4096], [1, 1, 1, 1]  # NHWC floats, 8 KiB


def check(result):
    err, *rest = result
    if int(err) != 0:
        raise SystemExit(f"CUDA error {err!r}")
    return rest[0] if len(rest) == 1 else tuple(rest)


def u64(values):
    return [driver.cuuint64_t(v) for v in values]


def u32(values):
    return [driver.cuuint32_t(v) for v in values]


def raw(tensor_map):
    return ctypes.string_at(tensor_map.getPtr(), 128)


def tiled(address):
    return driver.cuTensorMapEncodeTiled(FP32, 2, address, u64([64, 32]), u64([256]), u32([16, 8]), u32([1, 1]),
                                         *NONE)


def im2col(address):
    return driver.cuTensorMapEncodeIm2col(FP32, 4, address, u64(DIMS), u64(STRIDES), [-1, -1], [1, 1], 16, 32,
                                          u32(STEPS), *NONE)


def wide(address):
    mode = driver.CUtensorMapIm2ColWideMode.CU_TENSOR_MAP_IM2COL_WIDE_MODE_W
    return driver.cuTensorMapEncodeIm2colWide(FP32, 4, address, u64(DIMS), u64(STRIDES), -1, 1, 16, 32, u32(STEPS),
                                              NONE[0], mode, *NONE[1:])


def replaced_equals_direct(encode, first, second):
    """[encode's CUresult at `first`, the replace's CUresult, whether the replaced bytes are those encoded directly
    at `second`] (the later entries None where an earlier step failed)."""
    err, tensor_map = encode(first)
    if int(err) != 0:
        return [int(err), None, None]
    (replace_err,) = driver.cuTensorMapReplaceAddress(tensor_map, second)
    if int(replace_err) != 0:
        return [0, int(replace_err), None]
    direct_err, direct = encode(second)
    return [0, 0, int(direct_err) == 0 and raw(tensor_map) == raw(direct)]


def main():
    check(driver.cuInit(0))
    device = check(driver.cuDeviceGet(0))
    ctx = check(driver.cuDevicePrimaryCtxRetain(device))
    check(driver.cuCtxSetCurrent(ctx))
    first, second = check(driver.cuMemAlloc(MIB)), check(driver.cuMemAlloc(MIB))
    out = {"tiled": replaced_equals_direct(tiled, first, second),
           "im2col": replaced_equals_direct(im2col, first, int(second) + 4096)}
    if hasattr(driver, "cuTensorMapEncodeIm2colWide"):
        out["wide"] = replaced_equals_direct(wide, first, second)
    err, tensor_map = tiled(first)
    if int(err) == 0 and hasattr(driver, "cuTensorMapSetAllocationClass"):
        small = driver.CUtensorMapAllocClass.CU_TENSOR_MAP_ALLOC_CLASS_SMALL
        err, effective = driver.cuTensorMapSetAllocationClass(tensor_map, small)
        out["class_small"] = [int(err), int(effective)]
        (err,) = driver.cuTensorMapReplaceAddress(tensor_map, second)
        out["replace_after_class"] = int(err)
    for pointer in (first, second):
        check(driver.cuMemFree(pointer))
    check(driver.cuDevicePrimaryCtxRelease(device))
    print("RESULT " + json.dumps(out, sort_keys=True))


if __name__ == "__main__":
    main()
