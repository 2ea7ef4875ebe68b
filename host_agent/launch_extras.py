"""Launch-related calls written out by hand on the host: cuOccupancyMaxActiveClusters (a launch configuration)
and cuTensorMapEncodeTiled (a TMA descriptor). A mixin of executor.CudaExecutor, registered on its HOST
handlers (call_handlers.py); it also lays out the CUlaunchConfig that cuLaunchKernelEx and
cuOccupancyMaxActiveClusters both hand the driver (`launch_config_for`)."""
from __future__ import annotations

import ctypes
import struct
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ivshmem.cuda_status import INVALID_HANDLE, INVALID_VALUE, NOT_SUPPORTED, SUCCESS
from ivshmem.driver_api import (
    LAUNCH_ATTRIBUTE,
    LAUNCH_ATTRIBUTES_EVENT,
    LAUNCH_ATTRIBUTES_PLAIN,
    DriverCall,
    LaunchConfig,
)
from ivshmem.record import Status

from .call_handlers import HOST
from .handler import Reply

if TYPE_CHECKING:
    from .session_ledger import SessionLedger

MAX_LAUNCH_ATTRIBUTES = 64
MAX_TENSOR_RANK = 5
TENSOR_MAP_BYTES = 128  # sizeof(CUtensorMap)
# Bytes per element of each CUtensorMapDataType; 0: the packed 4- and 6-bit types, not whole bytes per element.
TENSOR_ELEMENT_BYTES = (1, 2, 4, 4, 8, 8, 2, 4, 8, 2, 4, 4, 4, 0, 0, 0)


def tensor_extent(data_type: int, interleave: int, dims: list[int], strides: list[int]) -> int:
    """The bytes from a tensor map's global address that its dims and strides reach: the last element of every
    outer dimension (strides are in bytes, one per dimension past the first) plus the innermost row. Where the
    innermost row's size in bytes is not plain (packed sub-byte types, interleaved layouts) it counts 1 byte: a
    lower bound, so a valid descriptor is never refused."""
    size = TENSOR_ELEMENT_BYTES[data_type] if 0 <= data_type < len(TENSOR_ELEMENT_BYTES) else 0
    inner = dims[0] * size if size and not interleave else 1
    return inner + sum((dim - 1) * stride for dim, stride in zip(dims[1:], strides, strict=True))


class LaunchExtraCalls:
    """cuOccupancyMaxActiveClusters and cuTensorMapEncodeTiled; the launch configuration both launches use."""

    if TYPE_CHECKING:  # CudaExecutor's, which this mixes into
        driver: Any
        ledger: SessionLedger
        _launch_config: LaunchConfig
        _launch_attributes: ctypes.Array[ctypes.c_char]

    def launch_config_for(self, head: tuple[int, ...] | list[int], attributes: bytes) -> tuple[int, Any]:
        """(CUresult, the wheel's CUlaunchConfig) for grid xyz, block xyz, shared bytes, stream and packed
        attributes: only the kinds driver_api lists travel (NOT_SUPPORTED otherwise), an event attribute only with
        one of the session's events (INVALID_HANDLE). The struct and its attributes are the executor's one
        buffer, valid until the next launch or query (the driver reads them during the call)."""
        for identifier, value in LAUNCH_ATTRIBUTE.iter_unpack(attributes):
            if identifier in LAUNCH_ATTRIBUTES_EVENT:
                if struct.unpack_from("<Q", value)[0] not in self.ledger.handles["CUevent"]:
                    return INVALID_HANDLE, None
            elif identifier not in LAUNCH_ATTRIBUTES_PLAIN:
                return NOT_SUPPORTED, None
        count = len(attributes) // LAUNCH_ATTRIBUTE.size
        ctypes.memmove(self._launch_attributes, attributes, len(attributes))
        config = self._launch_config
        (config.gridDimX, config.gridDimY, config.gridDimZ, config.blockDimX, config.blockDimY, config.blockDimZ,
         config.sharedMemBytes, config.hStream) = head
        config.attrs, config.numAttrs = ctypes.addressof(self._launch_attributes), count
        # The wheel's CUlaunchConfig over our own struct: its C call reads `attrs` from there
        return SUCCESS, self.driver.CUlaunchConfig(_ptr=ctypes.addressof(config))

    @HOST.serves("cuOccupancyMaxActiveClusters")
    def _max_active_clusters(self, call: DriverCall, payload: bytes) -> Reply:
        return self._cluster_query(call, payload, self.driver.cuOccupancyMaxActiveClusters)

    def _cluster_query(self, call: DriverCall, payload: bytes, ask: Callable[..., tuple[Any, ...]]) -> Reply:
        """A query of a function (or kernel) under a launch configuration as cuLaunchKernelEx sends it (no
        parameters): the function and the stream the session's, attributes as a launch takes them; its one int
        (cuOccupancyMaxActiveClusters here, cuOccupancyMaxPotentialClusterSize in stream_extras.py)."""
        function, *head, items = call.request.decode(payload)
        if len(items) > MAX_LAUNCH_ATTRIBUTES:
            return Reply(Status.MALFORMED, f"{call.name}: {len(items)} attributes, more than "
                                           f"{MAX_LAUNCH_ATTRIBUTES}".encode())
        handles = self.ledger.handles
        if function not in handles["CUfunction"] and function not in handles["CUkernel"]:
            return Reply(INVALID_HANDLE)
        if not self.ledger.stream_known(head[-1]):
            return Reply(INVALID_HANDLE)
        err, config = self.launch_config_for(head, b"".join(LAUNCH_ATTRIBUTE.pack(*item) for item in items))
        if err != SUCCESS:
            return Reply(err)
        err, answer = ask(function, config)
        if int(err) != SUCCESS:
            return Reply(int(err))
        return Reply(SUCCESS, call.reply.encode(int(answer)))

    @HOST.serves("cuTensorMapEncodeTiled")
    def _tensor_map_tiled(self, call: DriverCall, payload: bytes) -> Reply:
        """The descriptor's 128 bytes. The lists must have the lengths the rank gives (strides one fewer) and the
        global memory the dims and strides reach must lie in one of the session's ranges (`tensor_extent`): the
        descriptor is the TMA unit's licence to read and write there, so it is checked as a copy's range is; the
        driver checks the rest (alignment, box and stride limits) and answers its own INVALID_VALUE."""
        (data_type, rank, address, interleave, swizzle, l2_promotion, oob_fill,
         dims_items, strides_items, box_items, steps_items) = call.request.decode(payload)
        dims, strides = [d for (d,) in dims_items], [s for (s,) in strides_items]
        box, steps = [b for (b,) in box_items], [e for (e,) in steps_items]
        if not 1 <= rank <= MAX_TENSOR_RANK or (len(dims), len(strides), len(box), len(steps)) != (
                rank, rank - 1, rank, rank):
            return Reply(INVALID_VALUE)
        if not all(dims) or not self.ledger.owns(address, tensor_extent(data_type, interleave, dims, strides)):
            return Reply(INVALID_VALUE)
        d = self.driver
        try:
            enums = (d.CUtensorMapDataType(data_type), d.CUtensorMapInterleave(interleave),
                     d.CUtensorMapSwizzle(swizzle), d.CUtensorMapL2promotion(l2_promotion),
                     d.CUtensorMapFloatOOBfill(oob_fill))
        except ValueError:  # no such enum value: what the driver itself answers for it
            return Reply(INVALID_VALUE)
        err, tensor_map = d.cuTensorMapEncodeTiled(
            enums[0], rank, address, [d.cuuint64_t(v) for v in dims], [d.cuuint64_t(v) for v in strides],
            [d.cuuint32_t(v) for v in box], [d.cuuint32_t(v) for v in steps], *enums[1:])
        if int(err) != SUCCESS:
            return Reply(int(err))
        return Reply(SUCCESS, call.reply.encode(ctypes.string_at(tensor_map.getPtr(), TENSOR_MAP_BYTES)))
