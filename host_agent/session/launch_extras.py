"""Launch-related calls written out by hand on the host: cuOccupancyMaxActiveClusters (a launch configuration)
and the tensor-map family (TMA descriptors: cuTensorMapEncodeTiled, Im2col, Im2colWide, ReplaceAddress,
SetAllocationClass). A mixin of executor.CudaExecutor, registered on its HOST
handlers (call_registry.py); it also lays out the CUlaunchConfig that cuLaunchKernelEx and
cuOccupancyMaxActiveClusters both hand the driver (`launch_config_for`)."""
from __future__ import annotations

import ctypes
import struct
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from ivshmem.cuda_status import INVALID_HANDLE, INVALID_VALUE, NOT_SUPPORTED, SUCCESS
from ivshmem.driver_api import (
    LAUNCH_ATTRIBUTE,
    LAUNCH_ATTRIBUTES_EVENT,
    LAUNCH_ATTRIBUTES_PLAIN,
    DriverCall,
    LaunchConfig,
)
from ivshmem.record import Status

from ..handler import Reply
from .call_registry import HOST

if TYPE_CHECKING:
    from .session_ledger import SessionLedger

MAX_LAUNCH_ATTRIBUTES = 64
MAX_TENSOR_RANK = 5
TENSOR_MAP_BYTES = 128  # sizeof(CUtensorMap)
# Bytes per element of each CUtensorMapDataType; 0: the packed 4- and 6-bit types, not whole bytes per element.
TENSOR_ELEMENT_BYTES = (1, 2, 4, 4, 8, 8, 2, 4, 8, 2, 4, 4, 4, 0, 0, 0)
# Descriptors remembered per session (`KnownTensorMaps`): past this many, the least recently encoded or used is
# forgotten, and a replace or allocation class of it answers CUDA_ERROR_INVALID_VALUE (the program may encode it again).
KNOWN_TENSOR_MAPS = 4096
ALLOC_CLASS_LARGE = 2  # CU_TENSOR_MAP_ALLOC_CLASS_LARGE
LARGE_TENSOR_WINDOW = 128 * 1024  # the LARGE class's window (cuda.h), where the device names no minimum size


def tensor_extent(data_type: int, interleave: int, dims: list[int], strides: list[int]) -> int:
    """The bytes from a tensor map's global address that its dims and strides reach: the last element of every
    outer dimension (strides are in bytes, one per dimension past the first) plus the innermost row. Where the
    innermost row's size in bytes is not plain (packed sub-byte types, interleaved layouts) it counts 1 byte: a
    lower bound, so a valid descriptor is never refused."""
    size = TENSOR_ELEMENT_BYTES[data_type] if 0 <= data_type < len(TENSOR_ELEMENT_BYTES) else 0
    inner = dims[0] * size if size and not interleave else 1
    return inner + sum((dim - 1) * stride for dim, stride in zip(dims[1:], strides, strict=True))


class TensorMapFacts(NamedTuple):
    """What the host knows of a descriptor it encoded: its global address, the bytes its tensor reaches from there
    (`tensor_extent`) and the bytes the TMA unit may assume from there (the extent, or more under the LARGE
    allocation class)."""
    address: int
    extent: int
    reach: int


class KnownTensorMaps:
    """The descriptors the host encoded for one session: their 128 bytes -> `TensorMapFacts`, least recently used
    first, at most `limit` of them. A descriptor is opaque, so the host cannot read a map's address or extent back
    from its bytes; it can only recognise bytes it wrote itself."""

    def __init__(self, limit: int = KNOWN_TENSOR_MAPS) -> None:
        self.limit = limit
        self._facts: OrderedDict[bytes, TensorMapFacts] = OrderedDict()

    def remember(self, descriptor: bytes, facts: TensorMapFacts) -> None:
        self._facts[descriptor] = facts
        self._facts.move_to_end(descriptor)
        while len(self._facts) > self.limit:
            self._facts.popitem(last=False)

    def facts(self, descriptor: bytes) -> TensorMapFacts | None:
        """What is known of a descriptor this session was given (now the most recently used), or None."""
        facts = self._facts.get(descriptor)
        if facts is not None:
            self._facts.move_to_end(descriptor)
        return facts

    def __len__(self) -> int:
        return len(self._facts)


class LaunchExtraCalls:
    """cuOccupancyMaxActiveClusters and the tensor-map family; the launch configuration both launches use."""

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

    @property
    def tensor_maps(self) -> KnownTensorMaps:
        """The descriptors encoded for this session (created on first use: one executor serves one session)."""
        known: KnownTensorMaps | None = self.__dict__.get("_tensor_maps")
        if known is None:
            known = self.__dict__["_tensor_maps"] = KnownTensorMaps()
        return known

    def _tensor_enums(self, data_type: int, interleave: int, swizzle: int, l2_promotion: int,
                      oob_fill: int) -> tuple[Any, ...] | None:
        """The wheel's enums for a map's modes, or None for a value the enum lacks (the driver's INVALID_VALUE)."""
        d = self.driver
        try:
            return (d.CUtensorMapDataType(data_type), d.CUtensorMapInterleave(interleave),
                    d.CUtensorMapSwizzle(swizzle), d.CUtensorMapL2promotion(l2_promotion),
                    d.CUtensorMapFloatOOBfill(oob_fill))
        except ValueError:
            return None

    def _tensor_geometry(self, data_type: int, rank: int, address: int, interleave: int, dims: list[int],
                         strides: list[int], lengths: tuple[int, ...], expected: tuple[int, ...]) -> int | None:
        """The extent of a map about to be encoded, or None where it must be refused before the driver: a rank
        outside 1-5, lists of other lengths than the rank gives, a zero dim, memory past the session's."""
        if not 1 <= rank <= MAX_TENSOR_RANK or lengths != expected or not all(dims):
            return None
        extent = tensor_extent(data_type, interleave, dims, strides)
        return extent if self.ledger.owns(address, extent) else None

    def _encoded(self, call: DriverCall, err: Any, tensor_map: Any, facts: TensorMapFacts) -> Reply:
        """The reply to an encode or a replace: the new descriptor's bytes, remembered with `facts`."""
        if int(err) != SUCCESS:
            return Reply(int(err))
        descriptor = ctypes.string_at(tensor_map.getPtr(), TENSOR_MAP_BYTES)
        self.tensor_maps.remember(descriptor, facts)
        return Reply(SUCCESS, call.reply.encode(descriptor))

    def _known_map(self, descriptor: bytes) -> tuple[Any, TensorMapFacts] | None:
        """A copy of a descriptor this session was given, as the wheel's CUtensorMap, and its facts; or None."""
        facts = self.tensor_maps.facts(bytes(descriptor)) if len(descriptor) == TENSOR_MAP_BYTES else None
        if facts is None:
            return None
        tensor_map = self.driver.CUtensorMap()
        ctypes.memmove(tensor_map.getPtr(), bytes(descriptor), TENSOR_MAP_BYTES)
        return tensor_map, facts

    def _large_tensor_min_size(self) -> int | None:
        """CU_DEVICE_ATTRIBUTE_TENSOR_MAP_LARGE_TENSOR_MIN_SIZE of the current context's device, or None where the
        wheel or the driver cannot say (0: the device names none)."""
        d = self.driver
        attribute = getattr(d.CUdevice_attribute, "CU_DEVICE_ATTRIBUTE_TENSOR_MAP_LARGE_TENSOR_MIN_SIZE", None)
        if attribute is None:
            return None
        err, device = d.cuCtxGetDevice()
        if int(err) != SUCCESS:
            return None
        err, value = d.cuDeviceGetAttribute(attribute, device)
        return int(value) if int(err) == SUCCESS else None

    @HOST.serves("cuTensorMapEncodeTiled")
    def _tensor_map_tiled(self, call: DriverCall, payload: bytes) -> Reply:
        """The descriptor's 128 bytes. The lists must have the lengths the rank gives (strides one fewer) and the
        global memory the dims and strides reach must lie in one of the session's ranges (`tensor_extent`): the
        descriptor is the TMA unit's licence to read and write there, so it is checked as a copy's range is; the
        driver checks the rest (alignment, box and stride limits) and answers its own INVALID_VALUE. The bytes are
        remembered with that extent (`KnownTensorMaps`), for cuTensorMapReplaceAddress."""
        (data_type, rank, address, interleave, swizzle, l2_promotion, oob_fill,
         dims_items, strides_items, box_items, steps_items) = call.request.decode(payload)
        dims, strides = [d for (d,) in dims_items], [s for (s,) in strides_items]
        box, steps = [b for (b,) in box_items], [e for (e,) in steps_items]
        extent = self._tensor_geometry(data_type, rank, address, interleave, dims, strides,
                                       (len(dims), len(strides), len(box), len(steps)), (rank, rank - 1, rank, rank))
        enums = self._tensor_enums(data_type, interleave, swizzle, l2_promotion, oob_fill)
        if extent is None or enums is None:
            return Reply(INVALID_VALUE)
        d = self.driver
        err, tensor_map = d.cuTensorMapEncodeTiled(
            enums[0], rank, address, [d.cuuint64_t(v) for v in dims], [d.cuuint64_t(v) for v in strides],
            [d.cuuint32_t(v) for v in box], [d.cuuint32_t(v) for v in steps], *enums[1:])
        return self._encoded(call, err, tensor_map, TensorMapFacts(address, extent, extent))

    @HOST.serves("cuTensorMapEncodeIm2col")
    def _tensor_map_im2col(self, call: DriverCall, payload: bytes) -> Reply:
        """As a tiled map, with the pixel box's corners (rank - 2 ints each) in place of the box: the same lengths
        and extent checks (the corners only place the box within the tensor the dims bound)."""
        (data_type, rank, address, interleave, swizzle, l2_promotion, oob_fill, channels, pixels,
         dims_items, strides_items, lower_items, upper_items, steps_items) = call.request.decode(payload)
        dims, strides = [d for (d,) in dims_items], [s for (s,) in strides_items]
        lower, upper, steps = [v for (v,) in lower_items], [v for (v,) in upper_items], [e for (e,) in steps_items]
        extent = self._tensor_geometry(data_type, rank, address, interleave, dims, strides,
                                       (len(dims), len(strides), len(lower), len(upper), len(steps)),
                                       (rank, rank - 1, max(rank - 2, 0), max(rank - 2, 0), rank))
        enums = self._tensor_enums(data_type, interleave, swizzle, l2_promotion, oob_fill)
        if extent is None or enums is None or rank < 3:  # cuda.h: im2col maps have rank 3-5
            return Reply(INVALID_VALUE)
        d = self.driver
        err, tensor_map = d.cuTensorMapEncodeIm2col(
            enums[0], rank, address, [d.cuuint64_t(v) for v in dims], [d.cuuint64_t(v) for v in strides],
            lower, upper, channels, pixels, [d.cuuint32_t(v) for v in steps], *enums[1:])
        return self._encoded(call, err, tensor_map, TensorMapFacts(address, extent, extent))

    @HOST.serves("cuTensorMapEncodeIm2colWide")
    def _tensor_map_im2col_wide(self, call: DriverCall, payload: bytes) -> Reply:
        """As cuTensorMapEncodeIm2col, with the box's two corner widths and the wide mode."""
        (data_type, rank, address, interleave, mode, swizzle, l2_promotion, oob_fill, lower, upper, channels, pixels,
         dims_items, strides_items, steps_items) = call.request.decode(payload)
        dims, strides, steps = [d for (d,) in dims_items], [s for (s,) in strides_items], [e for (e,) in steps_items]
        extent = self._tensor_geometry(data_type, rank, address, interleave, dims, strides,
                                       (len(dims), len(strides), len(steps)), (rank, rank - 1, rank))
        enums = self._tensor_enums(data_type, interleave, swizzle, l2_promotion, oob_fill)
        d = self.driver
        if extent is None or enums is None or rank < 3:
            return Reply(INVALID_VALUE)
        try:
            wide_mode = d.CUtensorMapIm2ColWideMode(mode)
        except ValueError:
            return Reply(INVALID_VALUE)
        err, tensor_map = d.cuTensorMapEncodeIm2colWide(
            enums[0], rank, address, [d.cuuint64_t(v) for v in dims], [d.cuuint64_t(v) for v in strides],
            lower, upper, channels, pixels, [d.cuuint32_t(v) for v in steps], enums[1], wide_mode, *enums[2:])
        return self._encoded(call, err, tensor_map, TensorMapFacts(address, extent, extent))

    @HOST.serves("cuTensorMapReplaceAddress")
    def _tensor_map_replace(self, call: DriverCall, payload: bytes) -> Reply:
        """A descriptor this session was given (`KnownTensorMaps`), pointed at `address`: what it may reach from
        there (its extent, more under the LARGE class) must lie in the session's memory, as at encoding. An unknown
        descriptor (one the guest built or edited itself, or one forgotten past KNOWN_TENSOR_MAPS) cannot be
        checked: INVALID_VALUE, before the driver."""
        address, descriptor = call.request.decode(payload)
        known = self._known_map(descriptor)
        if known is None or not self.ledger.owns(address, known[1].reach):
            return Reply(INVALID_VALUE)
        tensor_map, facts = known
        (err,) = self.driver.cuTensorMapReplaceAddress(tensor_map, address)
        return self._encoded(call, err, tensor_map, facts._replace(address=address))

    @HOST.serves("cuTensorMapSetAllocationClass")
    def _tensor_map_allocation_class(self, call: DriverCall, payload: bytes) -> Reply:
        """A descriptor this session was given with its allocation class set (cuda.h: an edit of its bytes, no
        re-encoding), on the host's copy; the class in effect comes back with the new bytes. Under the LARGE class
        the TMA unit may assume CU_DEVICE_ATTRIBUTE_TENSOR_MAP_LARGE_TENSOR_MIN_SIZE contiguous bytes from the map's
        address (cuda.h: undefined behaviour otherwise; LARGE_TENSOR_WINDOW where the device answers no size), so
        where LARGE comes into effect (asked for, or chosen under AUTO) the session must own that much from there,
        or INVALID_VALUE and the copy is dropped; the map keeps that reach for a later replace."""
        alloc_class, descriptor = call.request.decode(payload)
        known = self._known_map(descriptor)
        if known is None:
            return Reply(INVALID_VALUE)
        tensor_map, facts = known
        d = self.driver
        try:
            requested = d.CUtensorMapAllocClass(alloc_class)
        except ValueError:
            return Reply(INVALID_VALUE)
        err, effective = d.cuTensorMapSetAllocationClass(tensor_map, requested)
        if int(err) != SUCCESS:
            return Reply(int(err))
        reach = facts.extent
        if int(effective) == ALLOC_CLASS_LARGE:
            reach = max(facts.extent, self._large_tensor_min_size() or LARGE_TENSOR_WINDOW)
            if not self.ledger.owns(facts.address, reach):
                return Reply(INVALID_VALUE)
        descriptor = ctypes.string_at(tensor_map.getPtr(), TENSOR_MAP_BYTES)
        self.tensor_maps.remember(descriptor, facts._replace(reach=reach))
        return Reply(SUCCESS, call.reply.encode(int(effective), descriptor))
