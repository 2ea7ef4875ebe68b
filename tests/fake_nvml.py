"""A stand-in for cuda.bindings.nvml's API where the GPU host's NVML answers NVML_QUERY (host_agent/session/
nvml_queries.py), over a FakeDriver's devices, as an NVSwitch-less NVLink machine would: GPU i's link k (k < count - 1)
is active and leads to GPU (i + 1 + k) % count, a P2P-capable peer; a link past those is NVML_ERROR_NOT_SUPPORTED.
Handles are found by the device UUIDs the fake driver reports (NVML's order need not be CUDA's). CPU only: the real
NVML's answers are compared with the machine's on the GPU machine (tests/gpu/test_multi_gpu.py)."""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from host_agent.session.gpu_memory import uuid_text
from tests.fake_driver import FakeDriver

NOT_SUPPORTED, INVALID_ARGUMENT = 3, 2
LINK_COUNT, LINK_STATE = 91, 165  # NVML_FI_DEV_NVLINK_LINK_COUNT, NVML_FI_DEV_NVLINK_GET_STATE
UNSIGNED_INT = 1  # NVML_VALUE_TYPE_UNSIGNED_INT


class NvmlError(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(f"NVML error {status}")
        self.status = status


class FieldValue:
    """cuda.bindings.nvml.FieldValue(1)'s attributes, as NvmlQueries reads them."""

    def __init__(self, count: int) -> None:
        assert count == 1
        self.field_id = self.scope_id = self.value_type = self.nvml_return = 0
        self.value = {"ull_val": [0]}


class FakeNvml:
    NvmlError = NvmlError
    FieldValue = FieldValue

    def __init__(self, driver: FakeDriver) -> None:
        self.count = len(driver.total_mem)
        self.by_uuid = {uuid_text(driver.device_uuid(d)): d for d in range(self.count)}
        self.pci = {d: driver.pci_location(d) for d in range(self.count)}
        self.asked: list[tuple[Any, ...]] = []

    def device_get_handle_by_uuid(self, uuid: str) -> tuple[str, int]:
        if uuid not in self.by_uuid:
            raise NvmlError(6)  # NOT_FOUND
        return ("handle", self.by_uuid[uuid])

    def _far_end(self, handle: tuple[str, int], link: int) -> int:
        self.asked.append((handle[1], link))
        if link >= self.count - 1:
            raise NvmlError(NOT_SUPPORTED)
        return (handle[1] + 1 + link) % self.count

    def device_get_nvlink_state(self, handle: tuple[str, int], link: int) -> int:
        self._far_end(handle, link)
        return 1

    def device_get_nvlink_capability(self, handle: tuple[str, int], link: int, capability: int) -> int:
        self._far_end(handle, link)
        return 1 if capability in (0, 2) else 0  # P2P_SUPPORTED, P2P_ATOMICS

    def device_get_nvlink_remote_pci_info_v2(self, handle: tuple[str, int], link: int) -> SimpleNamespace:
        domain, bus, device = self.pci[self._far_end(handle, link)]
        return SimpleNamespace(bus_id=f"{domain:08x}:{bus:02x}:{device:02x}.0", domain=domain, bus=bus,
                               bus_id_legacy=f"{domain:04x}:{bus:02x}:{device:02x}.0", device_=device,
                               pci_device_id=0x233510DE, pci_sub_system_id=0)

    def device_get_field_values(self, handle: tuple[str, int], values: FieldValue) -> None:
        """A link's state (active where _far_end has one) and the link count; every other field NOT_SUPPORTED."""
        self.asked.append(("field", handle[1], values.field_id, values.scope_id))
        values.nvml_return, values.value_type = NOT_SUPPORTED, 0
        if values.field_id == LINK_COUNT:
            values.nvml_return, values.value_type, values.value["ull_val"][0] = 0, UNSIGNED_INT, self.count - 1
        elif values.field_id == LINK_STATE and values.scope_id < self.count - 1:
            values.nvml_return, values.value_type, values.value["ull_val"][0] = 0, UNSIGNED_INT, 1

    def device_get_p2p_status(self, first: tuple[str, int], second: tuple[str, int], index: int) -> int:
        return 5 if index == 4 else 0  # every pair NVLink-joined: OK, but for PCI


def open_fake_nvml(driver: Any) -> FakeNvml:
    """ExecutorOptions.nvml for a session over the fake driver."""
    return FakeNvml(driver)
