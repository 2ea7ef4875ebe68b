"""An ordinary cuda.bindings program that would use more GPU memory than a small vGPU quota allows without a
single cuMemAlloc past it: a module with a 64 MiB global, then up to 50 extra contexts; then an allocation that
fits in 16 MiB and one that does not. Prints one JSON line of CUDA results, and what NVML says every process on
the GPUs holds (the program's own usage natively; forwarded, the session worker's), so the test can compare.

Natively (no quota) everything succeeds; forwarded under `oriond --gmem 16` the module and the first extra
context that do not fit fail with CUDA_ERROR_OUT_OF_MEMORY (2), as on a GPU that is full.
"""
import json
import os
import time

from cuda.bindings import driver

MIB = 1 << 20
PTX = (b".version 8.0\n.target sm_90\n.address_size 64\n"
       b".visible .global .align 8 .b8 big[%d];\n" % (64 * MIB) +
       b".visible .entry touch()\n{\n\t.reg .b64 %rd<2>;\n\t.reg .b16 %rs<2>;\n\tmov.u64 %rd1, big;\n"
       b"\tmov.u16 %rs1, 1;\n\tst.global.u8 [%rd1], %rs1;\n\tret;\n}\n\0")


def nvml_processes():
    """{pid: bytes} of every compute process on every GPU, or the reason NVML cannot say."""
    try:
        from cuda.bindings import nvml
        nvml.init_v2()
        found = {}
        for index in range(nvml.device_get_count_v2()):
            handle = nvml.device_get_handle_by_index_v2(index)
            for process in nvml.device_get_compute_running_processes_v3(handle):
                found[str(int(process.pid))] = int(process.used_gpu_memory)
        return found
    except Exception as exc:  # report, do not fail: the test decides what it needs
        return f"{type(exc).__name__}: {exc}"


def nvml_query_cost_us():
    """Microseconds per device_get_compute_running_processes_v3 (the executor's measurement), and for init."""
    try:
        from cuda.bindings import nvml
        start = time.perf_counter()
        nvml.init_v2()
        init = (time.perf_counter() - start) * 1e6
        handle = nvml.device_get_handle_by_index_v2(0)
        start = time.perf_counter()
        for _ in range(200):
            nvml.device_get_compute_running_processes_v3(handle)
        return [round(init, 1), round((time.perf_counter() - start) / 200 * 1e6, 1)]
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"


def main():
    out = {"pid": os.getpid(), "nvml_query_us": nvml_query_cost_us()}  # first: the init is this process's first
    (err,) = driver.cuInit(0)
    assert int(err) == 0, err
    dev = driver.cuDeviceGet(0)[1]
    ctx = driver.cuDevicePrimaryCtxRetain(dev)[1]
    driver.cuCtxSetCurrent(ctx)
    out["total"] = int(driver.cuDeviceTotalMem(dev)[1])
    out["nvml_after_context"] = nvml_processes()
    err, module = driver.cuModuleLoadData(PTX)
    out["big_module"] = int(err)
    if int(err) == 0:
        out["nvml_after_module"] = nvml_processes()
        driver.cuModuleUnload(module)
    contexts = []
    for _ in range(50):
        err, extra = driver.cuCtxCreate(None, 0, dev)
        if int(err) != 0:
            out["context_error"] = int(err)
            break
        contexts.append(extra)
    out["extra_contexts"] = len(contexts)
    if contexts:
        out["nvml_with_contexts"] = nvml_processes()
    for extra in contexts:
        driver.cuCtxDestroy(extra)
    driver.cuCtxSetCurrent(ctx)
    err, within = driver.cuMemAlloc(8 * MIB)
    out["alloc_8_mib"] = int(err)
    out["alloc_16_mib_more"] = int(driver.cuMemAlloc(16 * MIB)[0])
    err, free, total = driver.cuMemGetInfo()
    out["info"] = [int(free), int(total)]
    out["nvml_at_end"] = nvml_processes()
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
