"""NVML_QUERY: what a guest's NVML (guest_runtime/native/nvml.c) asks the GPU host's NVML about the session's GPUs.

The guest's NVML answers most of what frameworks ask from the forwarded CUDA driver. NCCL's topology also reads the
NVLinks between GPUs, which the driver does not tell: without them it takes two NVLink-joined GPUs for PCIe ones and
moves its data through host memory (docs/multi-gpu.md). These queries are answered by the host's own NVML about the
physical GPUs behind the session's guest ordinals, read-only, and for those GPUs only:

- NVML_NVLINK_STATE (link): whether the link is active;
- NVML_NVLINK_REMOTE_PCI (link): the PCI identity of what is at the link's other end (a GPU's bus ID as the guest's
  driver reports it, since cuDeviceGetPCIBusId is forwarded too);
- NVML_NVLINK_CAPABILITY (link, capability): nvmlNvLinkCapability_t's answer;
- NVML_P2P_STATUS (peer, index): nvmlDeviceGetP2PStatus between two of the session's GPUs;
- NVML_FIELD_VALUE (scope, field): one nvmlDeviceGetFieldValues value, for the fields that say what a link is
  (NVML_LINK_FIELDS: NCCL reads an NVLink's state so on sm_90 and later), never a traffic or error counter, which
  would tell one tenant of a shared GPU about another's work.

The reply carries NVML's own return code: a GPU without NVLink answers NVML_ERROR_NOT_SUPPORTED there as here, and
so does a host whose NVML cannot be opened. A guest ordinal the session does not have, a link past NVML's 18 or an
unknown query is NVML_ERROR_INVALID_ARGUMENT, as NVML answers one; a payload of another shape is MALFORMED. NVML is
opened in the session worker at the first query (never in oriond's serving process). Not here: the executor's
dispatch (executor.py), the guest's side (nvml.c).
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ivshmem.driver_api import (
    NVML_FIELD_VALUE,
    NVML_LINK_FIELDS,
    NVML_NVLINK_CAPABILITY,
    NVML_NVLINK_REMOTE_PCI,
    NVML_NVLINK_STATE,
    NVML_P2P_STATUS,
    NVML_QUERY_BUS_IDS,
    NVML_QUERY_REPLY,
    NVML_QUERY_REQUEST,
)
from ivshmem.errors import RecordError
from ivshmem.record import Status

from ..handler import Reply
from .gpu_memory import NvmlHandles, init_nvml

log = logging.getLogger(__name__)

NVML_SUCCESS, NVML_ERROR_INVALID_ARGUMENT, NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_UNKNOWN = 0, 2, 3, 999
MAX_LINKS = 18  # NVML_NVLINK_MAX_LINKS
MAX_CAPABILITY = 6  # nvmlNvLinkCapability_t's values are below NVML_NVLINK_CAP_COUNT
MAX_P2P_INDEX = 5  # NVML_P2P_CAPS_INDEX_UNKNOWN
NvmlOpener = Callable[[Any], Any]  # the session's driver -> an initialised NVML with cuda.bindings.nvml's API, or None


class NvmlQueries:
    """One session's NVML_QUERY answers: `devices()` gives the physical ordinals in guest order."""

    def __init__(self, driver: Any, devices: Callable[[], tuple[int, ...]], opener: NvmlOpener | None) -> None:
        self._driver, self._devices = driver, devices
        self._opener = opener or (lambda _driver: init_nvml())
        self._nvml: Any = None
        self._handles: NvmlHandles | None = None
        self._opened = False

    def answer(self, payload: bytes) -> Reply:
        try:
            query, device, link, which = NVML_QUERY_REQUEST.decode(payload)
        except RecordError as exc:
            return Reply(Status.MALFORMED, str(exc).encode())
        devices = self._devices()
        linked = query in (NVML_NVLINK_STATE, NVML_NVLINK_REMOTE_PCI, NVML_NVLINK_CAPABILITY, NVML_FIELD_VALUE)
        if not 0 <= device < len(devices) or not (linked or query == NVML_P2P_STATUS) or (linked and link >= MAX_LINKS):
            return self._result(NVML_ERROR_INVALID_ARGUMENT)
        if query == NVML_FIELD_VALUE and which not in NVML_LINK_FIELDS:
            return self._result(NVML_ERROR_NOT_SUPPORTED)  # as NVML says of a field a device does not have
        handles = self._open()
        if handles is None:
            return self._result(NVML_ERROR_NOT_SUPPORTED)
        nvml = self._nvml
        try:
            handle = handles.handle(devices[device])
            if query == NVML_NVLINK_STATE:
                return self._result(NVML_SUCCESS, int(nvml.device_get_nvlink_state(handle, link)))
            if query == NVML_NVLINK_CAPABILITY:
                if which >= MAX_CAPABILITY:
                    return self._result(NVML_ERROR_INVALID_ARGUMENT)
                return self._result(NVML_SUCCESS, int(nvml.device_get_nvlink_capability(handle, link, which)))
            if query == NVML_P2P_STATUS:
                if not 0 <= link < len(devices) or which > MAX_P2P_INDEX:
                    return self._result(NVML_ERROR_INVALID_ARGUMENT)
                peer = handles.handle(devices[link])
                return self._result(NVML_SUCCESS, int(nvml.device_get_p2p_status(handle, peer, which)))
            if query == NVML_FIELD_VALUE:
                return self._field(nvml, handle, which, link)
            return self._remote_pci(nvml.device_get_nvlink_remote_pci_info_v2(handle, link))
        except nvml.NvmlError as exc:
            return self._result(int(getattr(exc, "status", NVML_ERROR_UNKNOWN)))
        except LookupError as exc:  # the driver could not name the GPU
            log.debug("NVML_QUERY: %s", exc)
            return self._result(NVML_ERROR_UNKNOWN)

    def _open(self) -> NvmlHandles | None:
        """The GPUs' NVML handles, NVML opened at the first query; None where it cannot be."""
        if not self._opened:
            self._opened = True
            self._nvml = self._opener(self._driver)
            if self._nvml is not None:
                self._handles = NvmlHandles(self._nvml, self._driver)
        return self._handles

    @staticmethod
    def _result(result: int, value: int = 0, value_type: int = 0) -> Reply:
        return Reply(0, NVML_QUERY_REPLY.encode(result, value_type, value & (1 << 64) - 1, 0, 0, 0, 0, 0,
                                                bytes(NVML_QUERY_BUS_IDS)))

    @classmethod
    def _field(cls, nvml: Any, handle: Any, field: int, scope: int) -> Reply:
        """One field's value as NVML gave it: its own return code, type and 8 bytes (the union's widest view)."""
        values = nvml.FieldValue(1)
        values.field_id, values.scope_id = field, scope
        nvml.device_get_field_values(handle, values)
        return cls._result(int(values.nvml_return), int(values.value["ull_val"][0]), int(values.value_type))

    @staticmethod
    def _remote_pci(info: Any) -> Reply:
        bus_ids = _text(info.bus_id).encode()[:31].ljust(32, b"\0") + _text(info.bus_id_legacy).encode()[:15].ljust(
            16, b"\0")
        return Reply(0, NVML_QUERY_REPLY.encode(
            NVML_SUCCESS, 0, 0, int(info.domain), int(info.bus), int(info.device_), int(info.pci_device_id),
            int(info.pci_sub_system_id), bus_ids))


def _text(value: Any) -> str:
    """An NVML string field as text (the bindings give str or bytes)."""
    return value.decode(errors="replace").rstrip("\0") if isinstance(value, bytes | bytearray) else str(value)
