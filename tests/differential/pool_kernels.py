"""A kernel given page-locked memory, as XLA's autotuner and zero-copy programs do (docs/remote.md, "Kernels given
page-locked memory"): one fixed program whose transcript must be the same on the fake driver called directly, on
a local region and relayed (tests/differential/test_differential.py), and on the GPU with a real kernel
(tests/gpu/test_differential_gpu.py).

Each step is one of the coherence points a program can observe: the CPU writes pinned words and a kernel adds to
them (the kernel sees the CPU's bytes); the kernel's writes are in the CPU's memory after a stream, event or
context synchronisation; the CPU and the kernel write different words of one allocation between two
synchronisations (both writes stay); a copy into pinned memory is followed, in stream order, by a kernel that
reads it; a kernel writes pinned words and a copy to the device, async in stream order or synchronous, reads them
from there (it must copy the kernel's bytes, not what the CPU last saw); kernels on device memory alone come between
CPU writes to pinned words and the kernel that reads them; a synchronous copy uses the pinned buffer
as device memory after a kernel wrote it; the buffer is freed
and a new one is given to the next kernel. The kernel is `orion_fake_add_u32(u32 *words, u32 count, u32 value)`:
words[i] += value, which the fake driver runs (tests/fake_driver.py ADD_KERNEL) and ADD_PTX compiles on a GPU.
"""
from __future__ import annotations

import ctypes
from typing import Any

from tests.differential.corpus import NON_BLOCKING, SUCCESS, Table

ADD_PTX = b"""
.version 7.0
.target sm_70
.address_size 64
.visible .entry orion_fake_add_u32(.param .u64 words, .param .u32 count, .param .u32 value)
{
    .reg .pred %p;
    .reg .b32 %r<6>;
    .reg .b64 %rd<4>;
    ld.param.u64 %rd1, [words];
    ld.param.u32 %r1, [count];
    ld.param.u32 %r2, [value];
    mov.u32 %r3, %tid.x;
    setp.ge.u32 %p, %r3, %r1;
    @%p bra DONE;
    mul.wide.u32 %rd2, %r3, 4;
    add.s64 %rd3, %rd1, %rd2;
    ld.volatile.u32 %r4, [%rd3];
    add.u32 %r5, %r4, %r2;
    st.volatile.u32 [%rd3], %r5;
DONE:
    ret;
}
\0"""
UVA_STEP = "kernel, then a copy from pinned as device memory"
WORDS = 64  # the words of each pinned buffer the transcript shows
PINNED_BYTES = 3 * 4096  # several pages: a mirror is page-granular
U32, U64 = ctypes.c_uint32, ctypes.c_uint64
P, SZ = ctypes.c_void_p, ctypes.c_size_t
UI = ctypes.c_uint
# What the program calls besides corpus.PROTOTYPES (ctypes argument types, for a C driver library).
PROTOTYPES: dict[str, list[Any]] = {
    "cuModuleLoadData": [P, P], "cuModuleGetFunction": [P, U64, ctypes.c_char_p],
    "cuLaunchKernel": [U64, UI, UI, UI, UI, UI, UI, UI, U64, P, P],
    "cuEventCreate": [P, UI], "cuEventRecord": [U64, U64], "cuEventSynchronize": [U64],
}


class PoolKernelProgram:
    """Runs the program against a driver `table` that has corpus.PROTOTYPES and PROTOTYPES above."""

    def __init__(self, table: Table, uva_copies: bool = True) -> None:
        """`uva_copies`: include the step that copies from the pinned buffer as device memory (the fake driver
        serves no copy whose device side is host memory, so the CPU tests leave it out)."""
        self.t, self.uva_copies = table, uva_copies
        self.cell = U64()
        self.image = ctypes.create_string_buffer(ADD_PTX, len(ADD_PTX))

    def _out(self, name: str, *args: Any) -> int:
        status = self.t[name](ctypes.addressof(self.cell), *args)
        if status != SUCCESS:
            raise RuntimeError(f"pool kernel program: {name} answered {status}")
        return self.cell.value

    def _words(self, pointer: int) -> list[int]:
        return list((U32 * WORDS).from_address(pointer))

    def _add(self, words: int, count: int, value: int, stream: int) -> int:
        cells = (U64(words), U32(count), U32(value))
        params = (ctypes.c_void_p * 3)(*[ctypes.addressof(c) for c in cells])
        return int(self.t["cuLaunchKernel"](self.function, 1, 1, 1, count, 1, 1, 0, stream,
                                            ctypes.addressof(params), None))

    def run(self) -> list[list[Any]]:
        t = self.t
        device = ctypes.c_int()
        t["cuInit"](0)
        t["cuDeviceGet"](ctypes.addressof(device), 0)
        context = self._out("cuDevicePrimaryCtxRetain", device.value)
        t["cuCtxSetCurrent"](context)
        module = self._out("cuModuleLoadData", ctypes.addressof(self.image))
        self.function = self._out("cuModuleGetFunction", module, b"orion_fake_add_u32")
        blocking = self._out("cuStreamCreate", 0)
        non_blocking = self._out("cuStreamCreate", NON_BLOCKING)
        event = self._out("cuEventCreate", 0)
        device_words = self._out("cuMemAlloc", 4096)
        pinned = self._out("cuMemAllocHost", PINNED_BYTES)
        pageable = (U32 * WORDS)()
        words = (U32 * WORDS).from_address(pinned)
        out: list[list[Any]] = []

        def note(step: str, *statuses: int) -> None:
            out.append([step, list(statuses), self._words(pinned)])

        for i in range(WORDS):
            words[i] = i
        note("cpu writes, kernel adds, stream sync", self._add(pinned, 16, 5, blocking),
             t["cuStreamSynchronize"](blocking))
        words[0] = 100
        note("non-blocking stream, context sync", self._add(pinned, 1, 1, non_blocking), t["cuCtxSynchronize"]())
        words[40] = 7  # outside what the kernel writes: both writes stay
        launched = self._add(pinned + 8 * 4, 4, 2, non_blocking)
        words[41] = 9
        note("cpu and kernel write different words, event sync", launched,
             t["cuEventRecord"](event, non_blocking), t["cuEventSynchronize"](event))
        note("memset, copy into pinned, kernel in stream order, sync",
             t["cuMemsetD32"](device_words, 1000, 4),
             t["cuMemcpyDtoHAsync"](pinned + 48 * 4, device_words, 16, blocking),
             self._add(pinned + 48 * 4, 4, 1, blocking), t["cuStreamSynchronize"](blocking))
        for name, stream, value in (("cuMemcpyHtoDAsync", blocking, 9), ("cuMemcpyHtoD", 0, 11)):
            tail = (stream,) if name.endswith("Async") else ()
            added = self._add(pinned + 56 * 4, 4, value, stream)
            copied = t[name](device_words, pinned + 56 * 4, 16, *tail)  # reads what the kernel wrote, in order
            read = t["cuMemcpyDtoH"](ctypes.addressof(pageable), device_words, 16)
            out.append([f"kernel adds, {name} from pinned in stream order", [added, copied, read],
                        list(pageable)[:4]])
        filled = t["cuMemsetD32"](device_words + 64, 2024, 4)
        landed = t["cuMemcpyDtoHAsync"](pinned + 60 * 4, device_words + 64, 16, blocking)  # the memset's words...
        copied = t["cuMemcpyHtoD"](device_words + 128, pinned + 60 * 4, 16)  # ...and on, after it in stream order
        read = t["cuMemcpyDtoH"](ctypes.addressof(pageable), device_words + 128, 16)
        out.append(["copy into pinned, then from it to the device in stream order", [filled, landed, copied, read],
                    list(pageable)[:4]])
        if self.uva_copies:
            status = self._add(pinned + 20 * 4, 2, 3, 0)
            copied = t["cuMemcpyDtoH"](ctypes.addressof(pageable), pinned, 4 * WORDS)  # pinned as device memory
            undone = self._add(pinned + 20 * 4, 2, (1 << 32) - 3, 0)  # later steps as without this one
            out.append([UVA_STEP, [status, copied, undone, t["cuCtxSynchronize"]()], list(pageable)])
        # A kernel that names no pinned memory: a relay's pump forwards it while the CPU changed no mirrored byte
        # (the first), and pushes the CPU's bytes to the mirror first when it did (the second).
        statuses = [t["cuMemsetD32"](device_words + 256, 7, 4), self._add(device_words + 256, 4, 1, blocking)]
        words[30] = 300
        statuses.append(self._add(device_words + 256, 4, 1, blocking))
        words[31] = 301
        statuses += [self._add(pinned + 30 * 4, 2, 1, blocking), t["cuStreamSynchronize"](blocking),
                     t["cuMemcpyDtoH"](ctypes.addressof(pageable), device_words + 256, 16)]
        out.append(["kernels on device memory between cpu writes, then one on pinned", statuses,
                    self._words(pinned)[30:32] + list(pageable)[:4]])
        second = self._out("cuMemAllocHost", 4096)
        again = (U32 * 4).from_address(second)
        for i in range(4):
            again[i] = 50 + i
        out.append(["a second buffer", [self._add(second, 4, 10, blocking), t["cuStreamSynchronize"](blocking)],
                    list(again)])
        t["cuMemFreeHost"](second)
        note("after the second is freed", self._add(pinned, 2, 1, blocking), t["cuCtxSynchronize"]())
        t["cuMemFreeHost"](pinned)
        t["cuMemFree"](device_words)
        return out


def fake_table_with_kernels(driver: Any, table: Table) -> Table:
    """corpus.fake_table's table plus what this program calls, over the same FakeDriver; its page-locked memory
    registered with the fake, so that the fake's kernel reaches it as a GPU reaches cuMemAllocHost memory."""
    kept = table["_kept"]  # type: ignore[index]

    def alloc_host(address: int, size: int) -> int:
        kept.append(ctypes.create_string_buffer(size))
        pointer = ctypes.addressof(kept[-1])
        status = int(driver.cuMemHostRegister(pointer, size, 2)[0])
        if status == SUCCESS:
            U64.from_address(address).value = pointer
        return status

    def with_out(name: str, *fixed: Any) -> Any:
        def call(address: int, *args: Any) -> int:
            status, *values = getattr(driver, name)(*args)
            if int(status) == SUCCESS:
                U64.from_address(address).value = int(values[0])
            return int(status)
        return call

    def load(address: int, image: int) -> int:
        return with_out("cuModuleLoadData")(address, ctypes.string_at(image))

    def free_host(pointer: int) -> int:
        return int(driver.cuMemHostUnregister(pointer)[0])

    table.update({
        "cuMemAllocHost": alloc_host, "cuMemFreeHost": free_host, "cuModuleLoadData": load,
        "cuModuleGetFunction": with_out("cuModuleGetFunction"), "cuEventCreate": with_out("cuEventCreate"),
        "cuLaunchKernel": lambda *args: int(driver.cuLaunchKernel(*args)[0]),
        "cuEventRecord": lambda *args: int(driver.cuEventRecord(*args)[0]),
        "cuEventSynchronize": lambda *args: int(driver.cuEventSynchronize(*args)[0]),
    })
    return table
