"""An unmodified CUDA Python program: nothing in it knows about Orion.

Run in the libvirt test guest by cuda_guest.py, where the installed orion-guest .pth hook forwards its calls,
and on the GPU machine natively and forwarded (tests/gpu). It needs only cuda.bindings and the standard
library (the guest has no numpy and no NVRTC): the kernel is PTX, JIT-compiled by the host's driver.
Prints one line: `CUDA-PROGRAM init=<name>(<code>)`, and when cuInit succeeded (a host with a GPU)
` devices=<n> name=<device 0> kernel=<ok|wrong> n=<elements>`: a kernel wrote out[i] = 3*i + 1 on device 0.
"""
import ctypes

from cuda.bindings import driver

FILL_PTX = b"""
.version 7.0
.target sm_52
.address_size 64
.visible .entry fill(.param .u64 out, .param .u32 n)
{
    .reg .pred %p;
    .reg .b32 %r<7>;
    .reg .b64 %rd<4>;
    ld.param.u64 %rd1, [out];
    ld.param.u32 %r1, [n];
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mov.u32 %r4, %tid.x;
    mad.lo.s32 %r5, %r2, %r3, %r4;
    setp.ge.u32 %p, %r5, %r1;
    @%p bra DONE;
    cvta.to.global.u64 %rd2, %rd1;
    mul.wide.u32 %rd3, %r5, 4;
    add.s64 %rd2, %rd2, %rd3;
    mad.lo.s32 %r6, %r5, 3, 1;
    st.global.u32 [%rd2], %r6;
DONE:
    ret;
}
\0"""
N = 4096


def check(result):
    err, *rest = result
    if err != driver.CUresult.CUDA_SUCCESS:
        raise SystemExit(f"CUDA-PROGRAM failed: {err.name}")
    return rest[0] if len(rest) == 1 else tuple(rest)


def run_kernel(device):
    """Launch `fill` on device 0's primary context; True if every element came back right."""
    context = check(driver.cuDevicePrimaryCtxRetain(device))
    check(driver.cuCtxSetCurrent(context))
    module = check(driver.cuModuleLoadData(FILL_PTX))
    kernel = check(driver.cuModuleGetFunction(module, b"fill"))
    out = check(driver.cuMemAlloc(N * 4))
    check(driver.cuLaunchKernel(kernel, (N + 255) // 256, 1, 1, 256, 1, 1, 0, driver.CUstream(0),
                                ((out, N), (None, ctypes.c_uint)), 0))
    host = (ctypes.c_uint32 * N)()
    check(driver.cuMemcpyDtoH(host, out, N * 4))
    check(driver.cuMemFree(out))
    check(driver.cuModuleUnload(module))
    check(driver.cuDevicePrimaryCtxRelease(device))
    return all(value == 3 * i + 1 for i, value in enumerate(host))


err, = driver.cuInit(0)
line = f"CUDA-PROGRAM init={err.name}({int(err)})"
if err == driver.CUresult.CUDA_SUCCESS:
    count = check(driver.cuDeviceGetCount())
    device = check(driver.cuDeviceGet(0))
    name = check(driver.cuDeviceGetName(64, device)).split(b"\0", 1)[0].decode()
    line += f" devices={count} name={name} kernel={'ok' if run_kernel(device) else 'wrong'} n={N}"
print(line, flush=True)
