"""The CUDA executor: runs one client session's forwarded driver calls on the real GPU with cuda-python.

One instance lives in each session worker process (region_server.py), so a tenant's GPU context, memory and
crashes stay its own. Every handle and device pointer the client sends is checked against what this session
created before it reaches the driver (session_ledger.py keeps what it created); a call that fails the check
gets a CUDA error code, never an exception. A vGPU quota caps what the session's process holds on the GPU
(vgpu_quota.py decides, quota_usage.py counts) and is what cuMemGetInfo/cuDeviceTotalMem report. Guest device
ordinals map to the physical devices given to the session. This module decodes, dispatches and encodes; it
composes the ledger and the quota and keeps neither's state.

Calls whose parameters are all scalars, handles or pointers to them run through one generic path driven by
ivshmem.driver_api; the few that move buffers, strings or images are written out below, registered in `HOST`
by name, and decode and encode exactly the request and reply the table declares for them (the guest's
guest_runtime/forward.py encodes the same declarations). What a call creates, frees or unloads, and whether
it may change the session's GPU memory, comes from the table's effects.
"""
from __future__ import annotations

import ctypes
import logging
import os
import secrets
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ivshmem.channel import Sink, Streamed
from ivshmem.cuda_status import (
    INVALID_DEVICE,
    INVALID_HANDLE,
    INVALID_VALUE,
    NO_DEVICE,
    NOT_INITIALIZED,
    NOT_SUPPORTED,
    OUT_OF_MEMORY,
    SUCCESS,
)
from ivshmem.driver_api import (
    BY_OPCODE,
    CALLS,
    ENUMS,
    EVENTS_CREATE_MAX,
    EVENTS_CREATE_OPCODE,
    EVENTS_CREATE_REQUEST,
    HOST_NODE_FUNCTION_OPCODE,
    IMAGE_BY_DIGEST,
    IMAGE_BY_DIGEST_REQUEST,
    IMAGE_LOADS,
    IMAGE_NOT_CACHED,
    JIT_SCALAR_OPTIONS,
    LAUNCH_ATTRIBUTE,
    NVML_QUERY_OPCODE,
    PINNED_COPY,
    POINTER_ATTRIBUTE_WIDTHS,
    POINTER_CONTEXT,
    POINTER_DEVICE_ORDINAL,
    POINTER_HOST_POINTER,
    POINTER_MEMPOOL_HANDLE,
    POINTER_P2P_TOKENS,
    POOL_ATTRIBUTES_64,
    POOL_MAP_OPCODE,
    POOL_MIRROR_OPCODE,
    DriverCall,
    LaunchConfig,
    table_digest,
)
from ivshmem.errors import RecordError
from ivshmem.record import (
    AGENT_INFO_REPLY,
    BIND_REPLY,
    BIND_REQUEST,
    CUDA_OPCODE_BASE,
    GRANT_JOIN_REQUEST,
    Op,
    Record,
    Status,
)
from ivshmem.region import Region

from .. import agent_metrics
from ..diagnostics import DiagnosticsHandler
from ..handler import Reply, ReplyFailed, Session, note, refused
from ..limits import one_line
from .batch_mem_ops import BatchMemOpCalls
from .call_registry import HOST, POLICY  # the calls written out here and in the mixins
from .gpu_memory import MeterFactory
from .grant_sharing import GrantSharingCalls
from .graph_calls import GraphCalls
from .host_nodes import HostNodeCalls
from .image_cache import CacheSettings, ImageCache
from .launch_extras import MAX_LAUNCH_ATTRIBUTES, LaunchExtraCalls
from .link_calls import LinkCalls
from .mem_pool_calls import CU_MEMPOOL_ATTR_LOCATION_ID, MemPoolCalls
from .module_queries import ModuleQueryCalls
from .nvml_queries import NvmlOpener, NvmlQueries
from .pinned_pool import HostPool, answer_bookkeeping
from .pool_mirror import PoolMirror
from .session_ledger import CHECKED, SessionLedger
from .shared_handles import OPCODES as SHARING_OPCODES
from .shared_handles import SharedHandles
from .stream_extras import StreamExtraCalls
from .structured_copies import StructuredCopies
from .vgpu_contexts import PCI_DOMAIN_ID, VgpuContextCalls, VgpuContexts
from .vgpu_grant import Grant, GrantRefused, take_up
from .vgpu_quota import VgpuQuota, initial_limits
from .vmm_calls import VirtualMemoryCalls

log = logging.getLogger(__name__)

CU_LAUNCH_PARAM_END, CU_LAUNCH_PARAM_BUFFER_POINTER, CU_LAUNCH_PARAM_BUFFER_SIZE = 0, 1, 2
CU_MEMHOSTREGISTER_PORTABLE = 1
MIB = 1 << 20
RELAYED = "relay "  # a relayed session's region: "relay IP:PORT" of the relaying oriond (relay/listener.py)
# Device attributes of sharing with another process (cuda.h's CUdevice_attribute). No session can export a memory
# pool (cuMemPoolCreate with handle types answers NOT_SUPPORTED: mem_pool_calls.py) or fabric memory
# (shared_handles.py); only a local session can export cuMem memory as a POSIX file descriptor or an event by IPC.
MEMPOOL_SUPPORTED_HANDLE_TYPES, HANDLE_TYPE_FABRIC_SUPPORTED = 119, 128
HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, IPC_EVENT_SUPPORTED = 103, 125
UNSHARED_ATTRIBUTES = frozenset({MEMPOOL_SUPPORTED_HANDLE_TYPES, HANDLE_TYPE_FABRIC_SUPPORTED})
LOCAL_SHARING_ATTRIBUTES = frozenset({HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, IPC_EVENT_SUPPORTED})
CONVERTED = ENUMS | {"CUdevice"}  # input types the driver API wants as its own objects


@dataclass(frozen=True)
class ExecutorOptions:
    devices: tuple[int, ...] | None = None  # physical ordinals this session may use, in guest order
    gmem_mib: int | None = None  # memory quota of each of the session's vGPUs (MiB)
    vgpu_count: int = 1  # without gmem_mib: a vGPU's quota is its device's memory / vgpu_count (Orion)
    controller: str = ""  # the Orion Controller oriond reports to: where a guest's allocation is confirmed
    host: str = ""  # this host's name in that controller's pool
    meter: MeterFactory | None = None  # how a worker measures its GPU memory (gpu_memory.py); None: NVML
    image_cache: CacheSettings = CacheSettings()  # the per-host module image cache (image_cache.py); off by default
    nvml: NvmlOpener | None = None  # how a worker opens NVML for NVML_QUERY (nvml_queries.py); None: the host's


def _load_driver() -> Any:
    """cuda.bindings.driver, initialised; None when this host has no usable GPU or driver."""
    try:
        from cuda.bindings import driver
        (err,) = driver.cuInit(0)
    except (ImportError, RuntimeError, OSError) as exc:  # no cuda-python, or no libcuda (DynamicLibNotFound)
        log.info("no CUDA driver on this host (%s): every session answers CUDA_ERROR_NO_DEVICE", exc)
        return None
    if int(err) != SUCCESS:
        log.info("cuInit failed with %s: every session answers CUDA_ERROR_NO_DEVICE", err)
        return None
    return driver


class CudaExecutor(LinkCalls, VirtualMemoryCalls, LaunchExtraCalls, StreamExtraCalls, HostNodeCalls, BatchMemOpCalls,
                   ModuleQueryCalls, GraphCalls, MemPoolCalls, StructuredCopies, VgpuContextCalls,
                   GrantSharingCalls, DiagnosticsHandler):
    """A region_server Handler: the wire diagnostics plus every call in ivshmem.driver_api."""

    call_table = table_digest()  # what a forwarding client's HELLO must name

    def __init__(self, session: Session, options: ExecutorOptions | None = None, driver: Any = None) -> None:
        """`driver` replaces cuda.bindings.driver (tests without a GPU pass a stand-in with its API)."""
        super().__init__(session)
        self.options = options or ExecutorOptions()
        self.driver = driver if driver is not None else _load_driver()
        devices: tuple[int, ...] = ()  # physical ordinals in guest order
        if self.driver is not None:
            err, count = self.driver.cuDeviceGetCount()
            physical = tuple(range(count)) if int(err) == SUCCESS else ()
            wanted = self.options.devices if self.options.devices is not None else physical
            devices = tuple(d for d in wanted if d in physical)
        limits = initial_limits(self.driver, devices, self.options.gmem_mib, self.options.vgpu_count)
        self.contexts = VgpuContexts(self.driver, devices)  # each vGPU's primary context, each context's vGPU
        self.quota = VgpuQuota(self.driver, session.number, devices, limits, self.contexts.current_vgpu,
                               self.options.meter)
        self.ledger = SessionLedger(devices, self.quota)  # what the session created: all it may name
        # The ledger's checks and effects, bound once: the generic path and launches call them per call.
        self._check, self._record = self.ledger.check, self.ledger.record
        self._owns, self._launchable = self.ledger.owns, self.ledger.launchable
        self.grant: Grant | None = None  # the controller grant this session took up (BIND) or joined (GRANT_JOIN)
        self.grant_secret = b""  # the grant's secret: the token's with which it is shared (grant_sharing.py)
        self._said_missing: set[str | tuple[str, int]] = set()  # what the host's driver or bindings lack, said once
        self.pool: HostPool | None = None  # this session's slice of the page-locked pool (attach_channel)
        self.relayed = session.region.startswith(RELAYED)  # the relay listener's sessions: "relay IP:PORT"
        self.mirror: PoolMirror | None = None  # a relayed session's page-locked memory mirrored here (POOL_MIRROR)
        self._htod_state: tuple[int, int] | None = None
        self._to_register: tuple[int, int] | None = None  # (address, size) of the channel, until page-locked
        self._launch_params = ctypes.create_string_buffer(32768)  # the driver's parameter limit, 32764 bytes
        self._launch_size = ctypes.c_size_t(0)
        self._launch_extra = (ctypes.c_void_p * 5)(
            CU_LAUNCH_PARAM_BUFFER_POINTER, ctypes.addressof(self._launch_params),
            CU_LAUNCH_PARAM_BUFFER_SIZE, ctypes.addressof(self._launch_size), CU_LAUNCH_PARAM_END)
        self._launch_extra_at = ctypes.addressof(self._launch_extra)
        self._launch_config = LaunchConfig()
        self._launch_attributes = ctypes.create_string_buffer(MAX_LAUNCH_ATTRIBUTES * LAUNCH_ATTRIBUTE.size)
        self.images = ImageCache(self.options.image_cache)  # module images by digest, shared by the host's sessions
        self.nvml_queries = NvmlQueries(self.driver, lambda: self.ledger.devices, self.options.nvml)
        self.shared_handles = SharedHandles(self.driver, self.ledger, session.region, relayed=self.relayed)
        self._image_from_cache = False  # the load in progress got its image from the cache (not stored again)

    def attach_channel(self, region: Region, index: int) -> None:
        """Page-lock this session's channel (cuMemHostRegister), so copies between its staging chunks and
        the GPU are DMA straight from and into the shared pages, not through the driver's pageable staging.

        Copies from registered memory with cuMemcpyHtoD/DtoH return only once done, so a chunk may still be
        released right after its copy. Without a GPU, or if registration fails, copies stay pageable."""
        geometry = region.geometry
        address = ctypes.addressof(ctypes.c_char.from_buffer(region.buf, geometry.channel_base(index)))
        self._to_register = (address, geometry.channel_stride)
        self.pool = self.ledger.pool = HostPool(region, index, self.ledger.epoch)

    @property
    def allocation(self) -> str:
        """The controller allocation this session took up or joined ("": none)."""
        return self.grant.allocation if self.grant is not None else ""

    def _may_take_up(self, what: str) -> Reply | None:
        """The refusal of a BIND or GRANT_JOIN (`what`) this session may no longer make, else None."""
        if self.grant is not None:
            return refused(f"this session already took up allocation {self.grant.allocation}")
        if not self.ledger.empty:
            return refused(f"{what} must come before the session's first context or allocation")
        return None

    def _place(self, grant: Grant, secret: bytes) -> Reply:
        """The grant's vGPUs become the session's devices (which physical GPU each guest ordinal is, its place among
        its GPU's vGPUs: vgpu_contexts.py), their sizes its quotas; `secret` is the token's with which it is shared
        (grant_sharing.py). BIND's reply."""
        self.grant, self.grant_secret = grant, secret
        self.ledger.devices = grant.devices
        self.contexts.assign(grant.devices, grant.slots)
        self.quota.assign(grant.devices, tuple(m * MIB for m in grant.memory_mib))
        return Reply(0, BIND_REPLY.encode(len(grant.devices), min(grant.memory_mib)))

    def forget_freed_allocations(self) -> None:
        """After a context may have ended (destroyed; a primary one released for the last time, or reset): the
        driver freed the allocations made in it, so the ledger and the quota give them back (else a program that
        resets its device meets a quota still full of memory it no longer has). Which ones is asked of the driver:
        a pointer it no longer knows answers CUDA_ERROR_INVALID_VALUE; any other answer keeps the allocation."""
        range_size = self.driver.CUpointer_attribute.CU_POINTER_ATTRIBUTE_RANGE_SIZE
        gone = [base for base in self.ledger.allocations
                if int(self.driver.cuPointerGetAttribute(range_size, base)[0]) == INVALID_VALUE]
        for base in gone:
            self.ledger.forget_allocation(base)
        self.quota.contexts_ended()

    def _register_channel(self) -> None:
        """Page-lock the channel at the first staged copy: registration needs a current context, which the
        client has made by then (at attach time there is none: CUDA_ERROR_INVALID_CONTEXT). Tried once."""
        target, self._to_register = self._to_register, None
        if target is None or self.driver is None or not hasattr(self.driver, "cuMemHostRegister"):
            return
        (err,) = self.driver.cuMemHostRegister(target[0], target[1], CU_MEMHOSTREGISTER_PORTABLE)
        if int(err) != SUCCESS:
            log.warning("session %d: could not page-lock its channel (%s); copies stay pageable",
                        self.session.number, err)

    # --- dispatch ------------------------------------------------------------------------------------------
    def sink_for(self, opcode: int, length: int) -> Sink | None:
        call = BY_OPCODE.get(opcode)
        if call is not None and call.name in ("cuMemcpyHtoD", "cuMemcpyHtoDAsync") and self.driver is not None:
            return self._htod_sink(call, length)
        return super().sink_for(opcode, length)

    def handle(self, record: Record) -> Reply:
        if record.opcode < CUDA_OPCODE_BASE:  # HELLO and the wire diagnostics
            if record.opcode == Op.AGENT_INFO:
                if len(record.payload):
                    return Reply(Status.MALFORMED, f"AGENT_INFO carries no payload, not {len(record.payload)} "
                                                   f"bytes".encode())
                linked = bool(self.options.controller)
                return Reply(0, AGENT_INFO_REPLY.encode(self.options.host if linked else "", self.options.controller))
            if record.opcode == Op.BIND:
                return self._bind(BIND_REQUEST.decode(record.payload)[0])
            if record.opcode == Op.GRANT_SHARE:
                return self._grant_share(record.payload)
            if record.opcode == Op.GRANT_JOIN:
                return self._grant_join(GRANT_JOIN_REQUEST.decode(record.payload)[0])
            return super().handle(record)
        if record.opcode & IMAGE_BY_DIGEST:
            return self._image_by_digest(record.opcode & ~IMAGE_BY_DIGEST, bytes(record.payload))
        pinned = bool(record.opcode & PINNED_COPY)
        call = BY_OPCODE.get(record.opcode & ~PINNED_COPY)
        if record.opcode == POOL_MAP_OPCODE:
            return self._pool_map(bytes(record.payload))
        if record.opcode == POOL_MIRROR_OPCODE and self.relayed:
            return self._pool_mirror(bytes(record.payload))
        if record.opcode == HOST_NODE_FUNCTION_OPCODE and self.driver is not None:
            try:
                return self._host_node_function(bytes(record.payload))
            except RecordError as exc:
                return Reply(Status.MALFORMED, str(exc).encode())
        if call is None or (pinned and call.pinned is None):
            if record.opcode == NVML_QUERY_OPCODE:  # rare: tested only here, off the calls' path
                return self.nvml_queries.answer(bytes(record.payload)) if self.driver is not None \
                    else Reply(NOT_INITIALIZED)
            if record.opcode == EVENTS_CREATE_OPCODE:
                return self._events_create(bytes(record.payload)) if self.driver is not None \
                    else Reply(NOT_INITIALIZED)
            if record.opcode in SHARING_OPCODES:
                return self.shared_handles.answer(record.opcode, bytes(record.payload)) if self.driver is not None \
                    else Reply(NOT_INITIALIZED)
            return Reply(Status.UNKNOWN_OPCODE, f"opcode {record.opcode:#x} is not a forwarded CUDA call".encode())
        if self.driver is None:
            return Reply(NO_DEVICE if call.name == "cuInit" else NOT_INITIALIZED)
        written = HOST.by_name.get(call.name)
        if written is None and not pinned and call.answered_in_guest:  # cuMemcpy (unified addressing): never sent
            return Reply(NOT_SUPPORTED)
        try:
            if written is None and not pinned:
                return self._generic(call, bytes(record.payload))
            if pinned:
                return self._pinned_copy(call, *call.pinned.decode(record.payload))  # type: ignore[union-attr]
            return written(self, call, bytes(record.payload))  # type: ignore[misc]
        except RecordError as exc:  # not of the declared shape: the client's fault (the schema names the call)
            return Reply(Status.MALFORMED, str(exc).encode())
        except struct.error as exc:  # a hot path that unpacks the declared fixed part itself
            return Reply(Status.MALFORMED, f"{call.name}: {exc}".encode())
        except RuntimeError as exc:  # cuda-bindings has the call, the host's driver has not (an older driver)
            if not str(exc).startswith("Function ") or "not found" not in str(exc):
                raise
            if call.name not in self._said_missing:
                self._said_missing.add(call.name)
                log.info("session %d: %s answers CUDA_ERROR_NOT_SUPPORTED: this host's driver has no such entry "
                         "point (%s)", self.session.number, call.name, exc)
            return Reply(NOT_SUPPORTED)
        finally:
            self.quota.settle()

    def _generic(self, call: DriverCall, payload: bytes) -> Reply:
        try:
            args = call.inputs.unpack(payload)
        except struct.error:
            return Reply(Status.MALFORMED, f"{call.name}: {len(payload)}-byte payload does not match".encode())
        policy = POLICY.by_name.get(call.name)
        reply = policy(self, call, args) if policy is not None else None
        if reply is None and "allocates" in call.effects and not self.quota.allocation_fits(args[0]):
            reply = Reply(OUT_OF_MEMORY)  # past the vGPU's quota: as a full GPU would
            agent_metrics.refused("quota")
        if reply is not None:
            return reply
        function = getattr(self.driver, call.name, None)
        if function is None:  # a cuda-bindings older than the table (or the fake driver): as an older driver
            return Reply(NOT_SUPPORTED)
        converted = []
        for position, ctype, value in zip(call.input_positions, call.input_types, args, strict=True):
            if ctype in CHECKED:
                problem = self._check(call, position, ctype, value, args)
                if problem is not None:
                    return Reply(problem)
            try:
                converted.append(self._to_driver(ctype, value) if ctype in CONVERTED else value)
            except ValueError:  # no such enum value: what the driver itself answers for it
                return Reply(INVALID_VALUE)
        retain = "makes_context" in call.effects  # cuDevicePrimaryCtxRetain: a context counts past the first
        before = self.quota.usage_before() if retain else {}
        result = function(*converted)
        err = int(result[0])
        if err != SUCCESS:
            return Reply(err)
        if retain and self.quota.past_quota(before, args[0],
                                            lambda: self.driver.cuDevicePrimaryCtxRelease(converted[0])):
            agent_metrics.refused("quota")
            return Reply(OUT_OF_MEMORY)
        outs = [_from_driver(v) for v in result[1:]]
        if retain:
            self.contexts.made(outs[0], args[0])
        for i, ctype in enumerate(call.output_types):
            if ctype == "CUdevice":  # the guest knows devices by its own ordinals
                outs[i] = self._guest_device(call, args, outs[i])
        self._record(call, args, outs)
        if "may_end_context" in call.effects:
            self.forget_freed_allocations()
        return Reply(SUCCESS, call.outputs.pack(*outs) if outs else b"")

    def _guest_device(self, call: DriverCall, args: tuple[int, ...], physical: int) -> int:
        """The guest's ordinal of a device a call's answer names: the vGPU of the context it asked about (its
        CUcontext input, its stream's context, else the current one), which tells two vGPUs of one GPU apart."""
        context = None
        if self.contexts.shared:
            if "CUcontext" in call.input_types:
                context = args[call.input_types.index("CUcontext")] or None
            elif "CUstream" in call.input_types:
                err, got = self.driver.cuStreamGetCtx(args[call.input_types.index("CUstream")])
                context = int(got) if int(err) == SUCCESS else None
        return self.contexts.vgpu(physical, context)

    def _to_driver(self, ctype: str, value: int) -> Any:
        """An input as the driver API takes it: its enum member, or the physical GPU of a guest ordinal."""
        if ctype in ENUMS:
            return getattr(self.driver, ctype)(value)
        if ctype == "CUdevice":
            return self.ledger.devices[value]
        return value

    # --- policies: generic calls the session's vGPUs answer (vgpu_quota.py) ----------------------------------
    @POLICY.serves("cuDeviceGetCount")
    def _device_count(self, call: DriverCall, args: tuple[int, ...]) -> Reply | None:
        return _ok(call, len(self.ledger.devices))

    @POLICY.serves("cuDeviceGet")
    def _device_get(self, call: DriverCall, args: tuple[int, ...]) -> Reply | None:
        return _ok(call, args[0]) if 0 <= args[0] < len(self.ledger.devices) else Reply(INVALID_DEVICE)

    @POLICY.serves("cuMemGetInfo")
    def _mem_get_info(self, call: DriverCall, args: tuple[int, ...]) -> Reply | None:
        info = self.quota.memory_info()
        if info is None:
            return None
        err, free, total = info
        return Reply(err) if err != SUCCESS else _ok(call, free, total)

    @POLICY.serves("cuDeviceTotalMem")
    def _device_total_mem(self, call: DriverCall, args: tuple[int, ...]) -> Reply | None:
        if not 0 <= args[0] < len(self.ledger.devices):
            return Reply(INVALID_DEVICE)
        total = self.quota.total_memory(args[0])
        if total is None:
            return None
        return Reply(total[0]) if total[0] != SUCCESS else _ok(call, total[1])

    @POLICY.serves("cuDeviceGetAttribute")
    def _device_attribute(self, call: DriverCall, args: tuple[int, ...]) -> Reply | None:
        """What the session's device can share with another process, as this session can: the GPU's own answer
        where the session can do it too, else 0, what a device without the feature answers, so that a program that
        asks first (CUDA's samples, NCCL) takes another path instead of meeting NOT_SUPPORTED later. A later vGPU
        of a GPU has a PCI domain of its own (vgpu_contexts.py)."""
        attribute, device = args
        if not 0 <= device < len(self.ledger.devices):
            return None  # the generic path's INVALID_DEVICE
        if attribute in UNSHARED_ATTRIBUTES or (self.relayed and attribute in LOCAL_SHARING_ATTRIBUTES):
            return _ok(call, 0)
        if attribute == PCI_DOMAIN_ID:  # a vGPU past its GPU's first slot has a PCI address of its own
            domain = self.contexts.pci_domain(device)
            return None if domain is None else _ok(call, domain)
        return None

    # --- a controller allocation (BIND) ---------------------------------------------------------------------
    def _bind(self, allocation: str) -> Reply:
        """Take up the guest's allocation: its vGPUs become this session's devices, their sizes its quotas."""
        refusal = self._may_take_up("BIND")
        if refusal is not None:
            return refusal
        try:
            grant = take_up(self.options.controller, self.options.host, allocation, self.driver,
                            relay=self.session.region[len(RELAYED):] if self.relayed else "",
                            transport=self.session.transport if self.relayed else "",
                            relay_member=self.session.relay_member if self.relayed else "")
        except GrantRefused as exc:  # its text may quote the client's id: one bounded, escaped line
            reason = one_line(str(exc))
            log.warning("session %d: %s", self.session.number, reason)
            return refused(reason)
        note(f"allocation {allocation} {grant.session}")  # oriond gives it back when the session ends, however
        log.info("Resource successfully confirmed with controller")
        for number, device in enumerate(grant.devices):
            log.info("Registered v-GPU %d on p-GPU %d.", number, device)
        return self._place(grant, secrets.token_bytes(16))

    # --- hand-written calls ----------------------------------------------------------------------------------
    @HOST.serves("cuDeviceGetName")
    def _device_get_name(self, call: DriverCall, payload: bytes) -> Reply:
        length, dev = call.request.decode(payload)
        if not 0 <= dev < len(self.ledger.devices) or length <= 0:
            return Reply(INVALID_DEVICE if length > 0 else INVALID_VALUE)
        err, name = self.driver.cuDeviceGetName(min(length, 256), self.ledger.devices[dev])
        return _answer(call, err, lambda: (bytes(name).split(b"\0", 1)[0],))

    @HOST.serves("cuDeviceGetUuid")
    def _device_get_uuid(self, call: DriverCall, payload: bytes) -> Reply:
        (dev,) = call.request.decode(payload)
        if not 0 <= dev < len(self.ledger.devices):
            return Reply(INVALID_DEVICE)
        err, uuid = self.driver.cuDeviceGetUuid(self.ledger.devices[dev])
        return _answer(call, err, lambda: (self.contexts.uuid(dev, bytes(uuid.bytes)),))

    @HOST.serves("cuGetErrorName", "cuGetErrorString")
    def _error_text(self, call: DriverCall, payload: bytes) -> Reply:
        (code,) = call.request.decode(payload)
        try:
            value = self.driver.CUresult(code)
        except ValueError:
            return Reply(INVALID_VALUE)
        err, text = getattr(self.driver, call.name)(value)
        return _answer(call, err, lambda: (bytes(text),))

    @HOST.serves("cuCtxCreate")
    def _ctx_create(self, call: DriverCall, payload: bytes) -> Reply:
        flags, dev = call.request.decode(payload)
        if not 0 <= dev < len(self.ledger.devices):
            return Reply(INVALID_DEVICE)
        before = self.quota.usage_before()
        err, ctx = self.driver.cuCtxCreate(None, flags, self.ledger.devices[dev])
        if int(err) != SUCCESS:
            return Reply(int(err))
        if self.quota.past_quota(before, dev, lambda: self.driver.cuCtxDestroy(ctx)):
            return Reply(OUT_OF_MEMORY)  # destroyed: the context current before is current again, as in the guest
        self.contexts.made(int(ctx), dev)
        self._record(call, (flags, dev), [int(ctx)])
        return Reply(SUCCESS, call.reply.encode(int(ctx)))

    def _check_copy(self, device_pointer: int, size: int, stream: int | None) -> int:
        """A copy's stream and device range, as the ledger knows them."""
        if not self.ledger.stream_known(stream):
            return INVALID_HANDLE
        return SUCCESS if self._owns(device_pointer, max(size, 1)) else INVALID_VALUE

    def _start_copy(self, device_pointer: int, size: int, stream: int | None) -> int:
        """Check a copy; order an async copy after its stream's earlier work.

        The copy itself runs synchronously (the staging chunk is reused right after), so an async copy first
        waits for its stream: on a non-blocking stream a synchronous copy would not."""
        status = self._check_copy(device_pointer, size, stream)
        if status != SUCCESS:
            return status
        if stream is not None:
            (err,) = self.driver.cuStreamSynchronize(stream)
            if int(err) != SUCCESS:
                return int(err)
        return SUCCESS

    def _htod_sink(self, call: DriverCall, length: int) -> Sink:
        """Stream a large host-to-device copy chunk by chunk: the request's fixed part (device, size[, stream])
        leads, in the first chunk; the data, its tail, follows."""
        prefix = call.request.fixed
        self._htod_state = (INVALID_VALUE, 0)
        position = -1  # bytes of data consumed; -1 until the prefix was read

        def sink(chunk: memoryview) -> None:
            nonlocal position
            status, dst = self._htod_state  # type: ignore[misc]
            if position < 0:
                position = 0
                if len(chunk) < prefix.size:
                    return  # stays INVALID_VALUE: a copy too short to say where it goes
                fields = prefix.unpack_from(chunk, 0)
                dst, size = fields[0], fields[1]
                if length - prefix.size != size:
                    return  # carries more or fewer bytes than it declares
                status = self._start_copy(dst, size, fields[2] if len(fields) > 2 else None)
                self._htod_state = (status, dst)
                chunk = chunk[prefix.size:]
            if status == SUCCESS and len(chunk):
                err = self._copy_in(dst + position, chunk)
                if err != SUCCESS:
                    self._htod_state = (err, dst)
            position += len(chunk)
        return sink

    def _copy_in(self, dst: int, data: memoryview) -> int:
        if self._to_register is not None:
            self._register_channel()
        (err,) = self.driver.cuMemcpyHtoD(dst, data, len(data))
        return int(err)

    @HOST.serves("cuMemcpyHtoD", "cuMemcpyHtoDAsync")
    def _htod(self, call: DriverCall, payload: bytes) -> Reply:
        """A copy to the device whose bytes came in the request (a larger one was staged: _htod_sink). They are
        copied into pageable memory of this process's own, which the driver stages before it returns, as it does
        the guest's own pageable buffer: an async copy is queued in stream order without waiting for its stream,
        and the ring slot is free at once. Only a stream that may be capturing is waited for, and the copy made
        synchronously from the slot, as before (a captured copy would name our buffer, reused at once)."""
        if not payload:  # it was staged: the sink already moved the bytes
            state = self._htod_state or (INVALID_VALUE, 0)
            self._htod_state = None
            return Reply(state[0])
        *fields, data = call.request.decode(payload)
        dst, size = fields[0], fields[1]
        stream = fields[2] if len(fields) > 2 else None
        if len(data) != size:
            return Reply(INVALID_VALUE)
        status = self._check_copy(dst, size, stream)
        if status != SUCCESS or not size:
            return Reply(status)
        if stream is not None and self._capturing(stream):
            (err,) = self.driver.cuStreamSynchronize(stream)
            return Reply(int(err) if int(err) != SUCCESS else self._copy_in(dst, data))
        own = bytes(data)
        (err,) = (self.driver.cuMemcpyHtoD(dst, own, size) if stream is None
                  else self.driver.cuMemcpyHtoDAsync(dst, own, size, stream))
        return Reply(int(err))

    def _capturing(self, stream: int) -> bool:
        """Whether `stream` may be capturing (NULL and CU_STREAM_LEGACY never are; a failed query: it may)."""
        if stream in (0, 1):
            return False
        err, status = self.driver.cuStreamIsCapturing(stream)
        return int(err) != SUCCESS or int(status) != 0

    @HOST.serves("cuMemcpyDtoH", "cuMemcpyDtoHAsync")
    def _dtoh(self, call: DriverCall, payload: bytes) -> Reply:
        fields = call.request.decode(payload)
        src, size = fields[0], fields[1]
        status = self._start_copy(src, size, fields[2] if len(fields) > 2 else None)
        if status != SUCCESS:
            return Reply(status)
        driver, position = self.driver, 0
        errors: list[int] = []

        def fill(chunk: memoryview) -> None:
            nonlocal position
            (err,) = driver.cuMemcpyDtoH(chunk, src + position, len(chunk))
            if int(err) != SUCCESS:
                errors.append(int(err))
            position += len(chunk)
        if size <= 4096:  # small: one copy into a buffer, sent inline
            buffer = bytearray(size)
            fill(memoryview(buffer))
            return Reply(errors[0] if errors else SUCCESS, b"" if errors else bytes(buffer))

        def fill_or_fail(chunk: memoryview) -> None:
            fill(chunk)
            if errors:  # the reply's SUCCESS is out already: its bytes cannot be made right (handler.ReplyFailed)
                raise ReplyFailed(f"cuMemcpyDtoH answered {errors[0]} at byte {position - len(chunk)} of a "
                                  f"{size}-byte reply")
        # A streamed reply's status leaves before its bytes: surface a pending asynchronous error (a faulted
        # kernel, say) first, as the copy itself would have. cuMemcpyDtoH waits for prior work anyway.
        (err,) = driver.cuCtxSynchronize()
        if int(err) != SUCCESS:
            return Reply(int(err))
        if self._to_register is not None:
            self._register_channel()
        return Reply(SUCCESS, Streamed(size, fill_or_fail))

    @HOST.serves("cuModuleLoadData")
    def _module_load(self, call: DriverCall, payload: bytes) -> Reply:
        (image,) = call.request.decode(payload)
        before = self.quota.usage_before()
        err, module = self.driver.cuModuleLoadData(image)
        return self._loaded(call, before, err, module, "CUmodule", image)

    def _image_by_digest(self, opcode: int, payload: bytes) -> Reply:
        """A load's IMAGE_BY_DIGEST variant: the image from the host's cache, then the load as if the guest had
        sent it; IMAGE_NOT_CACHED (the guest sends it whole) when the cache does not hold exactly that image."""
        call = BY_OPCODE.get(opcode)
        if call is None or call.name not in IMAGE_LOADS:
            return Reply(Status.UNKNOWN_OPCODE, f"opcode {opcode | IMAGE_BY_DIGEST:#x} is not a forwarded CUDA "
                                                f"call".encode())
        if self.driver is None:
            return Reply(NOT_INITIALIZED)
        try:
            size, digest, head = IMAGE_BY_DIGEST_REQUEST.decode(payload)
        except RecordError as exc:
            return Reply(Status.MALFORMED, str(exc).encode())
        image = self.images.load(bytes(digest), size)
        if image is None:
            return Reply(IMAGE_NOT_CACHED)
        self._image_from_cache = True
        try:
            return HOST.by_name[call.name](self, call, bytes(head) + image)
        except RecordError as exc:  # JIT options not of the declared shape
            return Reply(Status.MALFORMED, str(exc).encode())
        finally:
            self._image_from_cache = False

    def _loaded(self, call: DriverCall, before: dict[int, int | None], err: Any, handle: Any, kind: str,
                image: bytes | memoryview) -> Reply:
        """A module or library load's reply: refused and unloaded if its globals and code pushed a GPU past the
        session's quota (the driver API allocates a module's globals at load, cuModuleLoad's documentation).
        An image the guest sent whole and the driver took is kept in the host's cache, under the digest computed
        here, for the next load of it by any session."""
        if int(err) != SUCCESS:
            return Reply(int(err))
        unload = self.driver.cuModuleUnload if kind == "CUmodule" else self.driver.cuLibraryUnload
        if self.quota.past_quota(before, None, lambda: unload(handle)):
            return Reply(OUT_OF_MEMORY)
        self._record(call, (), [int(handle)])  # the module or library handle: the call's one output
        if not self._image_from_cache:
            self.images.store(image)
        return Reply(SUCCESS, call.reply.encode(int(handle)))

    @HOST.serves("cuMemPoolGetAttribute", "cuMemPoolSetAttribute")
    def _pool_attribute(self, call: DriverCall, payload: bytes) -> Reply:
        pool, attribute, *value = call.request.decode(payload)
        if pool not in self.ledger.handles["CUmemoryPool"]:
            return Reply(INVALID_HANDLE)
        try:
            which = self.driver.CUmemPool_attribute(attribute)
        except ValueError:
            return Reply(INVALID_VALUE)
        try:
            if call.name == "cuMemPoolGetAttribute":
                err, got = self.driver.cuMemPoolGetAttribute(pool, which)
                if attribute == CU_MEMPOOL_ATTR_LOCATION_ID and int(err) == SUCCESS:  # the guest's ordinal of its GPU
                    return _answer(call, err, lambda: (self.contexts.vgpu(int(got)) & 0xFFFFFFFFFFFFFFFF,))
                return _answer(call, err, lambda: (int(got),))
            number = value[0]
            (err,) = self.driver.cuMemPoolSetAttribute(
                pool, which, self.driver.cuuint64_t(number) if attribute in POOL_ATTRIBUTES_64 else number)
        except TypeError as exc:  # cuda-bindings' own value helper knows no such attribute (13.3: MAX_POOL_SIZE...)
            if (call.name, attribute) not in self._said_missing:
                self._said_missing.add((call.name, attribute))
                log.info("session %d: %s of attribute %d answers CUDA_ERROR_NOT_SUPPORTED: this host's cuda-bindings "
                         "cannot carry it (%s)", self.session.number, call.name, attribute, exc)
            return Reply(NOT_SUPPORTED)
        return Reply(int(err))

    @HOST.serves("cuLibraryLoadData")
    def _library_load(self, call: DriverCall, payload: bytes) -> Reply:
        """As cuModuleLoadDataEx's payload: JIT options, then the image (library options stay in the guest)."""
        parsed = self._jit_options(call, payload)
        if isinstance(parsed, Reply):
            return parsed
        options, values, image = parsed
        before = self.quota.usage_before()
        err, library = self.driver.cuLibraryLoadData(image, options or None, values or None, len(options), None,
                                                     None, 0)
        return self._loaded(call, before, err, library, "CUlibrary", image)

    @HOST.serves("cuModuleGetFunction", "cuModuleGetGlobal", "cuLibraryGetKernel", "cuLibraryGetGlobal")
    def _by_name(self, call: DriverCall, payload: bytes) -> Reply:
        """cuModuleGetFunction/GetGlobal, cuLibraryGetKernel/GetGlobal: a handle and a NUL-free name."""
        owner, name = call.request.decode(payload)
        name = bytes(name)
        kind = "CUmodule" if call.name.startswith("cuModule") else "CUlibrary"
        if owner not in self.ledger.handles[kind] or b"\0" in name:
            return Reply(INVALID_HANDLE if owner not in self.ledger.handles[kind] else INVALID_VALUE)
        result = getattr(self.driver, call.name)(owner, name)
        err = int(result[0])
        if err != SUCCESS:
            return Reply(err)
        outs = [_from_driver(v) for v in result[1:]]
        # A child of its module or library; lazy loading: a function's code, a library's globals may now take
        # memory in this context (the table's effects: child, measures).
        self._record(call, (owner,), outs)
        return Reply(SUCCESS, call.outputs.pack(*outs))

    @HOST.serves("cuLaunchKernel", "cuLaunchKernelEx")
    def _launch(self, call: DriverCall, payload: bytes) -> Reply:
        """The launch configuration, cuLaunchKernelEx's attributes, then the packed parameters as the tail
        (Forwarder._launch_payload). Without attributes both are one cuLaunchKernel."""
        attributes = b""
        head: Sequence[int]
        if call.name == "cuLaunchKernelEx":
            *head, items, params = call.request.decode(payload)
            if len(items) > MAX_LAUNCH_ATTRIBUTES:
                return Reply(Status.MALFORMED, f"cuLaunchKernelEx: {len(items)} attributes, more than "
                                               f"{MAX_LAUNCH_ATTRIBUTES}".encode())
            attributes = b"".join(LAUNCH_ATTRIBUTE.pack(*item) for item in items)
            params = bytes(params)
        else:  # the hot path: the fixed part, then the tail (one copy, which memmove takes as it is)
            fixed = call.request.fixed
            head, params = fixed.unpack_from(payload, 0), payload[fixed.size:]
        f, gx, gy, gz, bx, by, bz, shmem, stream = head
        err = self._launchable(f, stream)
        if err != SUCCESS:
            return Reply(err)
        size = len(params)
        if size > len(self._launch_params):
            return Reply(INVALID_VALUE)
        # The driver copies the parameters before the launch returns, so one buffer serves every launch.
        ctypes.memmove(self._launch_params, params, size)
        self._launch_size.value = size
        if attributes:
            return Reply(self._launch_ex(f, (gx, gy, gz, bx, by, bz, shmem, stream), attributes))
        (err,) = self.driver.cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shmem, stream, None, self._launch_extra_at)
        return Reply(int(err))

    def _launch_ex(self, f: int, head: tuple[int, ...], attributes: bytes) -> int:
        """cuLaunchKernelEx with launch attributes (checked and laid out by launch_extras.launch_config_for)."""
        err, wrapped = self.launch_config_for(head, attributes)
        if err != SUCCESS:
            return err
        (err,) = self.driver.cuLaunchKernelEx(wrapped, f, None, self._launch_extra_at)
        return int(err)

    def _pointer_context(self, pointer: int) -> int | None:
        """The context a pointer's memory was made in, where two vGPUs of one GPU must be told apart (None: not
        asked, or none: cuMemCreate's memory belongs to no context)."""
        if not self.contexts.shared:
            return None
        err, context = self.driver.cuPointerGetAttribute(self.driver.CUpointer_attribute(POINTER_CONTEXT), pointer)
        return int(context) or None if int(err) == SUCCESS else None

    @HOST.serves("cuPointerGetAttribute")
    def _pointer_attribute(self, call: DriverCall, payload: bytes) -> Reply:
        """The value and its width in bytes. Only pointers into this session's own ranges."""
        attribute, pointer = call.request.decode(payload)
        if attribute == POINTER_P2P_TOKENS:
            return Reply(NOT_SUPPORTED)  # a struct, not a value: not forwarded
        width = POINTER_ATTRIBUTE_WIDTHS.get(attribute)
        if width is None:
            return Reply(INVALID_VALUE)
        try:
            which = self.driver.CUpointer_attribute(attribute)
        except ValueError:
            return Reply(INVALID_VALUE)
        host = self.pool.host_address(pointer, 1) if self.pool is not None else None  # page-locked pool memory
        if host is None and not self._owns(pointer, 1):
            return Reply(INVALID_VALUE)
        err, value = self.driver.cuPointerGetAttribute(which, pointer if host is None else host)
        if int(err) != SUCCESS:
            return Reply(int(err))
        number = int(value)
        if host is not None and attribute == POINTER_HOST_POINTER:  # in the guest's view
            number += pointer - host
        elif attribute == POINTER_DEVICE_ORDINAL:  # the guest's ordinal: the vGPU whose context made it
            number = self.contexts.vgpu(number, self._pointer_context(pointer if host is None else host))
        elif attribute == POINTER_CONTEXT and number:
            self.ledger.handles["CUcontext"].add(number)  # the context of its own memory
        elif attribute == POINTER_MEMPOOL_HANDLE and number:
            self.ledger.handles["CUmemoryPool"].add(number)  # the pool its own memory came from
        return Reply(SUCCESS, call.reply.encode(number & 0xFFFFFFFFFFFFFFFF, width))

    @HOST.serves("cuStreamGetCaptureInfo")
    def _capture_info(self, call: DriverCall, payload: bytes) -> Reply:
        """A stream's capture: status, id, graph and the nodes (with their edges' data) the next captured node will
        depend on. The graph and the nodes are the session's from then on, as if a call had made them."""
        (stream,) = call.request.decode(payload)
        if not self.ledger.stream_known(stream):
            return Reply(INVALID_HANDLE)
        err, status, ident, graph, nodes, edges, _count = self.driver.cuStreamGetCaptureInfo(stream)
        if int(err) != SUCCESS:
            return Reply(int(err))
        nodes = [int(node) for node in nodes or ()]
        if graph is not None and int(graph):
            self.ledger.handles["CUgraph"].add(int(graph))
        self.ledger.handles["CUgraphNode"].update(nodes)
        return Reply(SUCCESS, call.reply.encode(int(status), int(ident or 0), int(graph or 0), [(n,) for n in nodes],
                                                [(_edge_word(edge),) for edge in edges or ()]))

    # --- the native driver's event pool (guest_runtime/native/event_pool.c) ----------------------------------------
    def _events_create(self, payload: bytes) -> Reply:
        """EVENTS_CREATE: `count` events made as `count` cuEventCreate(`flags`) records would make them (the generic
        path: checks, ledger), stopping at the first failure; that failure's status when none was made."""
        try:
            flags, count = EVENTS_CREATE_REQUEST.decode(payload)
        except RecordError as exc:
            return Reply(Status.MALFORMED, str(exc).encode())
        if not 1 <= count <= EVENTS_CREATE_MAX:
            return Reply(Status.MALFORMED, f"EVENTS_CREATE of {count} events (1 to {EVENTS_CREATE_MAX})".encode())
        create, made = CALLS["cuEventCreate"], bytearray()
        request = create.request.encode(flags)
        for _ in range(count):
            reply = self._generic(create, request)
            if reply.status != SUCCESS:
                break
            made += bytes(reply.payload)  # type: ignore[arg-type]  # a generic reply is never Streamed
        return Reply(SUCCESS, made) if made else reply

    # --- page-locked host memory (pinned_pool.py) ----------------------------------------------------------
    def _pool_map(self, payload: bytes) -> Reply:
        """POOL_MAP: the guest's address of the slice -> the host's address and the slice's size."""
        try:
            return Reply(*answer_bookkeeping(self.pool, POOL_MAP_OPCODE, payload, self.driver))
        except RecordError as exc:
            return Reply(Status.MALFORMED, str(exc).encode())

    def _pool_mirror(self, payload: bytes) -> Reply:
        """POOL_MIRROR, a relaying oriond's (pool_mirror.py): its session's page-locked memory mirrored here."""
        if self.driver is None:
            return Reply(NOT_INITIALIZED)
        if self.mirror is None:
            self.mirror = PoolMirror(self.driver)
        try:
            return Reply(*self.mirror.answer(payload))
        except RecordError as exc:
            return Reply(Status.MALFORMED, str(exc).encode())

    @HOST.serves("cuMemAllocHost", "cuMemHostAlloc", "cuMemFreeHost", "cuMemHostGetFlags")
    def _pool_bookkeeping(self, call: DriverCall, payload: bytes) -> Reply:
        return Reply(*answer_bookkeeping(self.pool, call.opcode, payload, self.driver))

    @HOST.serves("cuMemHostGetDevicePointer")
    def _host_device_pointer(self, call: DriverCall, payload: bytes) -> Reply:
        pointer, flags = call.request.decode(payload)
        device = None if self.pool is None or flags else self.pool.device_pointer(pointer)
        return Reply(INVALID_VALUE) if device is None else Reply(SUCCESS, call.reply.encode(device))

    def _pinned_copy(self, call: DriverCall, device: int, size: int, *rest: int) -> Reply:
        """A copy whose host side is page-locked pool memory, named by its guest address (the call's pinned
        request): no bytes travel, and an async one is truly asynchronous (the pages stay valid until freed)."""
        *streams, pointer = rest
        stream = streams[0] if streams else None
        host = None if self.pool is None else self.pool.host_address(pointer, size)
        if host is None or not self._owns(device, max(size, 1)):
            return Reply(INVALID_VALUE)
        if not self.ledger.stream_known(stream):
            return Reply(INVALID_HANDLE)
        if not size:
            return Reply(SUCCESS)
        function = getattr(self.driver, call.name)
        ends = (device, host) if call.name.startswith("cuMemcpyHtoD") else (host, device)
        (err,) = function(*ends, size, stream) if stream is not None else function(*ends, size)
        return Reply(int(err))

    @HOST.serves("cuOccupancyMaxPotentialBlockSize", "cuOccupancyMaxPotentialBlockSizeWithFlags")
    def _potential_block_size(self, call: DriverCall, payload: bytes) -> Reply:
        """Only without a block-size-to-shared-memory callback (the guest runs those itself)."""
        function, *rest = call.request.decode(payload)
        if function not in self.ledger.handles["CUfunction"]:
            return Reply(INVALID_HANDLE)
        result = getattr(self.driver, call.name)(function, None, *rest)
        return _answer(call, result[0], lambda: (int(result[1]), int(result[2])))

    def _param_layout(self, function: int) -> tuple[int, list[tuple[int, int]]]:
        """(error, (offset, size) per parameter) of a function or kernel, asked of the driver once each."""
        if function in self.ledger.param_layouts:
            return SUCCESS, self.ledger.param_layouts[function]
        kernel = function in self.ledger.handles["CUkernel"] and function not in self.ledger.handles["CUfunction"]
        query = self.driver.cuKernelGetParamInfo if kernel else self.driver.cuFuncGetParamInfo
        layout: list[tuple[int, int]] = []
        while len(layout) < 4096:
            err, offset, size = query(function, len(layout))
            if int(err) == INVALID_VALUE:
                break  # past the last parameter
            if int(err) != SUCCESS:
                return int(err), []
            layout.append((int(offset), int(size)))
        self.ledger.param_layouts[function] = layout
        return SUCCESS, layout

    @HOST.serves("cuLaunchCooperativeKernel")
    def _launch_cooperative(self, call: DriverCall, payload: bytes) -> Reply:
        """cuLaunchCooperativeKernel has no `extra`: rebuild `void **kernelParams` into a copy of the packed
        parameters, at the offsets the driver reports for the function."""
        f, gx, gy, gz, bx, by, bz, shmem, stream, packed = call.request.decode(payload)
        err = self._launchable(f, stream)
        if err != SUCCESS:
            return Reply(err)
        err, layout = self._param_layout(f)
        if err != SUCCESS:
            return Reply(err)
        if len(packed) != max((o + s for o, s in layout), default=0):
            return Reply(INVALID_VALUE)  # not packed for this function's parameters
        buffer = ctypes.create_string_buffer(bytes(packed), max(len(packed), 1))
        base = ctypes.addressof(buffer)
        pointers = (ctypes.c_void_p * max(len(layout), 1))(*[base + offset for offset, _ in layout])
        params = ctypes.addressof(pointers) if layout else None
        (err,) = self.driver.cuLaunchCooperativeKernel(f, gx, gy, gz, bx, by, bz, shmem, stream, params)
        del buffer, pointers  # kept alive until the driver has copied the values (it does before returning)
        return Reply(int(err))

    def _jit_options(self, call: DriverCall, payload: bytes) -> tuple[list[Any], list[Any], memoryview] | Reply:
        """JIT options, then the image (cuModuleLoadDataEx, cuLibraryLoadData): the options as the wheel takes
        them, or the Reply that refuses them. Only scalar JIT options travel."""
        pairs, image = call.request.decode(payload)
        converted = self._jit_pairs(pairs)
        return converted if isinstance(converted, Reply) else (*converted, image)

    def _jit_pairs(self, pairs: Sequence[tuple[int, int]]) -> tuple[list[Any], list[Any]] | Reply:
        """(option, value) pairs as the wheel takes them: scalar JIT options only (else NOT_SUPPORTED), a value the
        option's enum lacks INVALID_VALUE. The module loads' and the JIT linker's (link_calls.py) one conversion."""
        options, values = [], []
        for option, value in pairs:
            if option not in JIT_SCALAR_OPTIONS:
                return Reply(NOT_SUPPORTED)
            kind, word = JIT_SCALAR_OPTIONS[option], value & 0xFFFFFFFF
            try:
                options.append(self.driver.CUjit_option(option))
                if kind == "I":
                    values.append(word)
                elif kind == "i":
                    values.append(word - (1 << 32) if word & 0x80000000 else word)
                else:  # the wheel wants its enum member
                    values.append(getattr(self.driver, kind)(word))
            except ValueError:  # no such enum value
                return Reply(INVALID_VALUE)
        return options, values

    @HOST.serves("cuModuleLoadDataEx")
    def _module_load_ex(self, call: DriverCall, payload: bytes) -> Reply:
        parsed = self._jit_options(call, payload)
        if isinstance(parsed, Reply):
            return parsed
        options, values, image = parsed
        before = self.quota.usage_before()
        if options:
            err, module = self.driver.cuModuleLoadDataEx(image, len(options), options, values)
        else:
            err, module = self.driver.cuModuleLoadData(image)
        return self._loaded(call, before, err, module, "CUmodule", image)


def _ok(call: DriverCall, *outs: int) -> Reply:
    return Reply(SUCCESS, call.outputs.pack(*outs))


def _answer(call: DriverCall, err: Any, outputs: Callable[[], tuple[Any, ...]]) -> Reply:
    """The driver's result as a reply: on success the call's declared reply, else the status alone."""
    status = int(err)
    return Reply(status, call.reply.encode(*outputs()) if status == SUCCESS else b"")


def _edge_word(edge: Any) -> int:
    """A CUgraphEdgeData (from_port, to_port, type, 5 reserved bytes) as the u64 its 8 bytes make, little-endian."""
    return int(edge.from_port) | int(edge.to_port) << 8 | int(edge.type) << 16


def _from_driver(value: Any) -> Any:
    if isinstance(value, float | int):
        return value
    return int(value)


def executor_factory(options: ExecutorOptions) -> Callable[[Session], CudaExecutor]:
    """What region_server needs: a factory from a session to its handler."""
    def make(session: Session) -> CudaExecutor:
        log.info("session %d: CUDA executor in pid %d", session.number, os.getpid())
        return CudaExecutor(session, options)
    return make
