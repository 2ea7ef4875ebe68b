"""The kernel-parameter layouts this process learned from the host, asked once per function.

cuLaunchKernel's `kernelParams` is an array of pointers whose sizes only the driver knows; the guest packs
the values they point at into one buffer (kernel_params.py) at the offsets cuFuncGetParamInfo (or
cuKernelGetParamInfo, for a CUkernel) reports. Asking costs one round trip per parameter, so a function's
layout is asked of the host at its first launch and kept until a module or library is unloaded (its handles
may then name other functions). A layout the host refused is never kept: the handle may be ours later.
Launch marshalling stays in forward.py; this module only remembers.
"""
from __future__ import annotations

from collections.abc import Callable

from ivshmem.cuda_status import INVALID_VALUE, SUCCESS
from ivshmem.driver_api import CALLS
from ivshmem.record import Record

from .kernel_params import check_layout

Layout = tuple[list[tuple[int, int]], int]  # (offset, size) of each parameter, and their packed size
MAX_PARAMS = 4096  # asked no further: a bound on a host that never says "past the last parameter"
FUNCTION_QUERY, KERNEL_QUERY = CALLS["cuFuncGetParamInfo"], CALLS["cuKernelGetParamInfo"]


class ParamLayouts:
    """The layouts of this process's functions and kernels, and which of its handles are CUkernels."""

    def __init__(self, ask: Callable[..., tuple[int, Record | None]], channel: Callable[[], object | None]) -> None:
        """`ask(call, payload, fold=False)` sends one call and waits (Forwarder._call); `channel()` is None when
        there is no agent to ask (Forwarder.channel)."""
        self._ask = ask
        self._channel = channel
        self._layouts: dict[int, Layout] = {}
        self._kernels: set[int] = set()  # CUkernel handles (launchable as functions)

    def kernel_made(self, handle: int) -> None:
        """cuLibraryGetKernel gave `handle`: its layout is a kernel's query."""
        self._kernels.add(handle)

    def forget(self) -> None:
        """A module or library was unloaded: its functions' handles may be reused."""
        self._layouts.clear()

    def __contains__(self, function: int) -> bool:
        return function in self._layouts

    def layout(self, function: int) -> Layout | None:
        """(offset, size) of each kernel parameter and their packed size; None without an agent to ask."""
        if function not in self._layouts:
            query = KERNEL_QUERY if function in self._kernels else FUNCTION_QUERY
            layout: list[tuple[int, int]] = []
            status = SUCCESS
            while len(layout) < MAX_PARAMS:
                status, reply = self._ask(query, query.inputs.pack(function, len(layout)), fold=False)
                if status != SUCCESS or reply is None:
                    break  # past the last parameter the driver answers CUDA_ERROR_INVALID_VALUE
                offset, size = query.outputs.unpack(reply.payload)
                layout.append((offset, size))
            if not layout and self._channel() is None:
                return None
            known = (layout, check_layout(layout))
            if status != INVALID_VALUE:  # refused (not this session's function): the launch will say so; and
                return known  # the handle number may name one of ours later, so nothing is remembered
            self._layouts[function] = known
        return self._layouts[function]
