"""The vGPU memory quota counts what the session's process really holds on the GPU, not only cuMemAlloc*.

Through the forwarding rig (tests/forwarding_rig.py) with the fake driver and `FakeMeter`, the stand-in for
NVML (CI has none): the fake process holds `context_bytes` per context plus its allocations and module globals.
The session's first context on a GPU is its baseline, never counted; module globals, extra contexts and a
library's globals are, and a load or context that would pass the quota is undone and answered
CUDA_ERROR_OUT_OF_MEMORY. The journal's `nvml.held` entries show when the executor measured.

Also here: host_agent/session/gpu_memory.py's NVML meter against a stand-in `nvml` module.
"""
from __future__ import annotations

import ctypes
import os
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from host_agent.session import gpu_memory
from host_agent.session.executor import ExecutorOptions
from tests import forwarding_rig
from tests.fake_driver import FakeDriver, FakeMeter
from tests.forwarding_rig import GUEST_DEVICES, Guest, Rig

bounded, start = forwarding_rig.bounded, forwarding_rig.start  # the rig's fixtures

SUCCESS, OUT_OF_MEMORY = 0, 2
MIB = 1 << 20
QUOTA = 16 * MIB


def ptx_with_global(size: int, name: bytes = b"big") -> bytes:
    """A module with one kernel and one global of `size` bytes (the same text loads on a GPU: tests/gpu)."""
    return (b".version 8.0\n.target sm_90\n.address_size 64\n"
            b".visible .global .align 8 .b8 " + name + b"[%d];\n" % size +
            b".visible .entry touch()\n{\n\tret;\n}\n")


def metered(start: Callable[..., Rig], context_bytes: int = 300 * MIB, meter: Any = FakeMeter) -> Rig:
    """A rig whose sessions have a 16 MiB quota on each vGPU, measured by `meter`."""
    return start(ExecutorOptions(devices=GUEST_DEVICES, gmem_mib=QUOTA // MIB, meter=meter),
                 context_bytes=context_bytes)


def load(g: Guest, image: bytes) -> tuple[int, int]:
    return g.load_module(image + b"\0")


def load_library(g: Guest, image: bytes) -> tuple[int, int]:
    cell, text = ctypes.c_uint64(0), ctypes.create_string_buffer(image)
    status = g.fn["cuLibraryLoadData"](ctypes.addressof(cell), ctypes.addressof(text), None, None, 0, None, None, 0)
    return status, cell.value


def ctx_create(g: Guest, device: int = 0) -> tuple[int, int]:
    cell = ctypes.c_uint64(0)
    return g.fn["cuCtxCreate"](ctypes.addressof(cell), None, 0, device), cell.value


def free_memory(g: Guest) -> int:
    free, total = g.ok("cuMemGetInfo")
    assert total == QUOTA
    return int(free)


def handle(value: Any) -> int:
    return int(value[1]) if isinstance(value, list) else int(value)


# --- what counts -------------------------------------------------------------------------------------------------

def test_a_module_global_counts_and_a_module_past_the_quota_is_unloaded(start: Callable[..., Rig]) -> None:
    rig = metered(start)
    g = rig.guest()
    g.setup()
    assert free_memory(g) == QUOTA  # the first context is the baseline: not counted
    mark = rig.mark()
    status, _ = load(g, ptx_with_global(64 * MIB))
    assert status == OUT_OF_MEMORY  # 64 MiB of globals under a 16 MiB quota
    (loaded,) = rig.entries(mark, "cuModuleLoadData")
    (unloaded,) = rig.entries(mark, "cuModuleUnload")
    assert handle(unloaded["args"][0]) == handle(loaded["result"][1])  # undone
    assert free_memory(g) == QUOTA
    status, module = load(g, ptx_with_global(4 * MIB, b"small"))
    assert status == SUCCESS
    assert free_memory(g) == QUOTA - 4 * MIB
    assert g.by_name("cuModuleGetGlobal", module, b"small")[0] == SUCCESS
    assert g.call("cuMemAlloc", QUOTA - 4 * MIB + 1)[0] == OUT_OF_MEMORY
    assert g.alloc(QUOTA - 4 * MIB)
    assert free_memory(g) == 0
    g.ok("cuModuleUnload", module)  # its global goes: room for 4 MiB again
    assert free_memory(g) == 4 * MIB
    assert g.alloc(4 * MIB)


def test_a_library_past_the_quota_is_unloaded(start: Callable[..., Rig]) -> None:
    rig = metered(start)
    g = rig.guest()
    g.setup()
    mark = rig.mark()
    assert load_library(g, ptx_with_global(20 * MIB))[0] == OUT_OF_MEMORY
    (loaded,) = rig.entries(mark, "cuLibraryLoadData")
    (unloaded,) = rig.entries(mark, "cuLibraryUnload")
    assert handle(unloaded["args"][0]) == handle(loaded["result"][1])
    status, library = load_library(g, ptx_with_global(MIB))
    assert status == SUCCESS and library
    assert free_memory(g) == QUOTA - MIB


def test_extra_contexts_count_and_the_one_past_the_quota_is_destroyed(start: Callable[..., Rig]) -> None:
    rig = metered(start, context_bytes=5 * MIB)
    g = rig.guest()
    first = g.setup()
    created = []
    for _ in range(50):
        status, ctx = ctx_create(g)
        if status != SUCCESS:
            break
        created.append(ctx)
    assert status == OUT_OF_MEMORY and len(created) == 3  # 3 × 5 MiB fit in 16 MiB, a fourth does not
    (destroyed,) = rig.entries(0, "cuCtxDestroy")
    assert handle(destroyed["args"][0]) == handle(rig.entries(0, "cuCtxCreate")[-1]["result"][1])
    assert g.ok("cuCtxGetCurrent") == created[-1]  # the guest's current context: still the last one made
    mark = rig.mark()
    assert free_memory(g) == QUOTA - 15 * MIB
    assert not rig.entries(mark, "cuCtxSetCurrent")  # the host's current context is that one too
    assert g.call("cuMemAlloc", MIB + 1)[0] == OUT_OF_MEMORY
    assert g.alloc(MIB)
    g.ok("cuCtxDestroy", created.pop())
    g.ok("cuCtxSetCurrent", first)
    assert free_memory(g) == QUOTA - 10 * MIB  # measured again after the destroy; its 1 MiB went with it
    assert first


def test_a_primary_context_after_a_created_one_is_an_extra_context(start: Callable[..., Rig]) -> None:
    rig = metered(start, context_bytes=20 * MIB)
    g = rig.guest()
    g.ok("cuInit", 0)
    assert ctx_create(g)[0] == SUCCESS  # the session's first context on the GPU: the baseline
    mark = rig.mark()
    assert g.call("cuDevicePrimaryCtxRetain", 0)[0] == OUT_OF_MEMORY  # a second 20 MiB context
    assert [e["args"] for e in rig.entries(mark, "cuDevicePrimaryCtxRelease")] == [[GUEST_DEVICES[0]]]
    primary = g.ok("cuDevicePrimaryCtxRetain", 1)  # another GPU: its first context there
    assert primary and free_memory(g) == QUOTA


def test_two_vgpus_of_one_gpu_count_what_each_ones_context_made(start: Callable[..., Rig]) -> None:
    """NVML counts the process per GPU, not per context: the second vGPU's own context is its baseline, and what
    is measured after a call is laid on the vGPU whose context was current (host_agent/session/quota_usage.py)."""
    rig = start(ExecutorOptions(devices=(0, 0), gmem_mib=QUOTA // MIB, meter=FakeMeter), context_bytes=300 * MIB)
    g = rig.guest()
    first = g.setup(0)
    second = g.ok("cuDevicePrimaryCtxRetain", 1)  # a context of its own, 300 MiB: not counted
    g.ok("cuCtxSetCurrent", second)
    assert free_memory(g) == QUOTA
    status, module = load(g, ptx_with_global(4 * MIB, b"small"))
    assert status == SUCCESS and free_memory(g) == QUOTA - 4 * MIB
    assert load(g, ptx_with_global(13 * MIB))[0] == OUT_OF_MEMORY  # past vGPU 1's quota, whatever vGPU 0 has
    g.ok("cuCtxSetCurrent", first)
    assert free_memory(g) == QUOTA  # vGPU 0 has used nothing
    assert g.alloc(QUOTA)
    g.ok("cuCtxSetCurrent", second)
    g.ok("cuModuleUnload", module)  # its global goes: vGPU 1's room again
    assert free_memory(g) == QUOTA
    assert g.alloc(QUOTA)


def test_what_died_with_a_primary_context_leaves_the_quota(start: Callable[..., Rig]) -> None:
    """cudaDeviceReset (cuDevicePrimaryCtxReset) and the last release of a primary context free what was allocated
    in it, as the driver does: the quota gives it back, and the next context there is a first one again (its cost
    the baseline, not counted). Before, the quota stayed full of memory the process no longer had."""
    rig = metered(start)
    g = rig.guest()
    g.setup()
    assert g.alloc(QUOTA)
    assert g.call("cuMemAlloc", MIB)[0] == OUT_OF_MEMORY
    g.ok("cuDevicePrimaryCtxReset", 0)
    assert free_memory(g) == QUOTA
    assert g.alloc(QUOTA)
    g.ok("cuDevicePrimaryCtxRelease", 0)  # the last release: it is destroyed, and its 300 MiB go too
    g.setup()  # a new primary context: the GPU's first again, its cost not counted
    assert free_memory(g) == QUOTA
    assert g.alloc(QUOTA)


def test_what_died_with_a_second_vgpus_primary_context_leaves_its_quota(start: Callable[..., Rig]) -> None:
    """The same for a vGPU whose primary context is a stand-in (two vGPUs of one GPU: vgpu_contexts.py)."""
    rig = start(ExecutorOptions(devices=(0, 0), gmem_mib=QUOTA // MIB, meter=FakeMeter), context_bytes=300 * MIB)
    g = rig.guest()
    first = g.setup(0)
    assert g.alloc(QUOTA // 2)
    g.ok("cuCtxSetCurrent", g.ok("cuDevicePrimaryCtxRetain", 1))
    assert g.alloc(QUOTA)
    g.ok("cuDevicePrimaryCtxReset", 1)
    g.ok("cuCtxSetCurrent", g.ok("cuDevicePrimaryCtxRetain", 1))
    assert free_memory(g) == QUOTA and g.alloc(QUOTA)
    g.ok("cuCtxSetCurrent", first)
    assert free_memory(g) == QUOTA // 2  # vGPU 0's allocation lives on


def test_allocations_are_counted_without_measuring(start: Callable[..., Rig]) -> None:
    rig = metered(start)
    g = rig.guest()
    g.setup()
    status, module = load(g, ptx_with_global(MIB))
    assert status == SUCCESS
    status, (function,) = g.by_name("cuModuleGetFunction", module, b"touch")
    assert status == SUCCESS
    assert free_memory(g) == QUOTA - MIB  # measures once: the lookup may have loaded code
    mark = rig.mark()
    pointers = [g.alloc(MIB) for _ in range(10)]
    for pointer in pointers[:5]:
        g.ok("cuMemFree", pointer)
    assert free_memory(g) == QUOTA - 6 * MIB
    assert not rig.entries(mark, "nvml.held")  # the hot path: the ledger alone
    launch = g.fn["cuLaunchKernel"]
    assert launch(function, 1, 1, 1, 32, 1, 1, 0, 0, None, None) == SUCCESS
    assert g.alloc(MIB)
    assert len(rig.entries(mark, "nvml.held")) == 1  # a first launch may load code: measured at the next use
    mark = rig.mark()
    assert launch(function, 1, 1, 1, 32, 1, 1, 0, 0, None, None) == SUCCESS
    assert g.alloc(MIB)
    assert not rig.entries(mark, "nvml.held")
    assert g.call("cuMemAlloc", 9 * MIB)[0] == OUT_OF_MEMORY
    assert len(rig.entries(mark, "nvml.held")) == 1  # a refusal measures first: usage may have shrunk


def test_without_a_meter_only_allocations_count(start: Callable[..., Rig]) -> None:
    rig = metered(start, meter=lambda driver: None)  # as on a host whose NVML is unavailable
    g = rig.guest()
    g.setup()
    assert load(g, ptx_with_global(64 * MIB))[0] == SUCCESS
    assert free_memory(g) == QUOTA
    assert not rig.entries(0, "nvml.held")


def test_without_a_quota_nothing_is_measured(start: Callable[..., Rig]) -> None:
    rig = start(ExecutorOptions(devices=GUEST_DEVICES, meter=FakeMeter), context_bytes=5 * MIB)
    g = rig.guest()
    g.setup()
    assert ctx_create(g)[0] == SUCCESS
    assert load(g, ptx_with_global(64 * MIB))[0] == SUCCESS
    assert not rig.entries(0, "nvml.held")


# --- the NVML meter (host_agent/session/gpu_memory.py) against a stand-in nvml module
# -------------------------------------

class NvmlError(Exception):
    pass


def fake_nvml(processes: dict[str, list[tuple[int, int]]]) -> SimpleNamespace:
    """device_get_handle_by_uuid and device_get_compute_running_processes_v3 over {uuid: [(pid, bytes)]}."""
    def by_uuid(uuid: str) -> str:
        if uuid not in processes:
            raise NvmlError(f"no GPU {uuid}")
        return uuid

    def running(handle: str) -> list[SimpleNamespace]:
        return [SimpleNamespace(pid=pid, used_gpu_memory=used) for pid, used in processes[handle]]
    return SimpleNamespace(NvmlError=NvmlError, device_get_handle_by_uuid=by_uuid,
                           device_get_compute_running_processes_v3=running)


def test_the_nvml_meter_finds_gpus_by_uuid_and_this_process_by_pid() -> None:
    driver = FakeDriver(devices=2, initialized=True)
    uuids = [gpu_memory.uuid_text(driver.device_uuid(d)) for d in (0, 1)]
    assert uuids[0].startswith("GPU-") and len(uuids[0]) == 40
    me = os.getpid()
    nvml = fake_nvml({uuids[1]: [(me + 1, 7 * MIB), (me, 300 * MIB)], uuids[0]: [(me + 1, MIB)]})
    meter = gpu_memory.NvmlMeter(nvml, driver)
    assert meter.held(1) == 300 * MIB  # CUDA's device 1, whatever NVML's order
    assert meter.held(0) == 0  # no context of ours there
    nvml.device_get_compute_running_processes_v3 = lambda h: [SimpleNamespace(pid=me, used_gpu_memory=(1 << 64) - 1)]
    assert meter.held(1) is None  # NVML_VALUE_NOT_AVAILABLE


def test_the_nvml_meter_says_none_for_a_gpu_nvml_does_not_know() -> None:
    driver = FakeDriver(devices=2, initialized=True)
    meter = gpu_memory.NvmlMeter(fake_nvml({}), driver)
    assert meter.held(1) is None
    assert meter.held(5) is None  # cuDeviceGetUuid fails: no such device
