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


class NvmlError(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(f"NVML error {status}")
        self.status = status


class FakeNvml:
    NvmlError = NvmlError

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

    def device_get_p2p_status(self, first: tuple[str, int], second: tuple[str, int], index: int) -> int:
        return 5 if index == 4 else 0  # every pair NVLink-joined: OK, but for PCI


def open_fake_nvml(driver: Any) -> FakeNvml:
    """ExecutorOptions.nvml for a session over the fake driver."""
    return FakeNvml(driver)
