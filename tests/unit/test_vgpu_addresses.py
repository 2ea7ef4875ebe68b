"""The PCI address and UUID each vGPU reports (host_agent/session/vgpu_contexts.py): NCCL refuses two ranks whose
devices share an address, so no two vGPUs of a host may, in any session, however the host's GPUs are numbered."""
from __future__ import annotations

from itertools import combinations

import pytest

from host_agent.session.vgpu_contexts import MAX_SLOTS, VgpuContexts

DOMAIN, BUS, DEVICE = 50, 33, 34


class Addresses:
    """A driver whose GPUs sit at the given (domain, bus, device) addresses (the attributes VgpuContexts asks)."""

    def __init__(self, gpus: list[tuple[int, int, int]]) -> None:
        self.gpus = gpus

    def cuDeviceGetCount(self) -> tuple[int, int]:  # noqa: N802 - the driver's name
        return 0, len(self.gpus)

    def CUdevice_attribute(self, value: int) -> int:  # noqa: N802
        return value

    def cuDeviceGetAttribute(self, attribute: int, device: int) -> tuple[int, int]:  # noqa: N802
        return 0, self.gpus[device][(DOMAIN, BUS, DEVICE).index(attribute)]


def address(contexts: VgpuContexts, gpus: list[tuple[int, int, int]], ordinal: int) -> tuple[int, int, int]:
    domain = contexts.pci_domain(ordinal)
    real = gpus[contexts.devices[ordinal]]
    return real if domain is None else (domain, real[1], real[2])


@pytest.mark.parametrize("gpus", [
    [(0, 0, 6), (0, 0, 7)],  # a virtual machine's GPUs on bus 0, as the H200 machine's (00:06.0, 00:07.0)
    [(0, 0x19, 0), (0, 0x3B, 0), (0, 0x4C, 0)],  # a server's, each on a bus of its own
    [(0x8F6E, 0, 0), (0x8E6E, 0, 0), (0x0F6E, 0, 0)],  # Hyper-V's: random domains, every GPU at 00:00.0
])
def test_every_slot_of_every_gpu_has_an_address_no_other_device_has(gpus: list[tuple[int, int, int]]) -> None:
    seen: dict[tuple[int, int, int], tuple[int, int]] = {gpu: (g, 0) for g, gpu in enumerate(gpus)}
    for g in range(len(gpus)):
        for slot in range(1, MAX_SLOTS):
            contexts = VgpuContexts(Addresses(gpus), (g,))  # a session given that one vGPU
            contexts.assign((g,), (slot,))
            got = address(contexts, gpus, 0)
            assert got not in seen, f"GPU {g} slot {slot} reports {got}, as {seen.get(got)} does"
            assert got[1:] == gpus[g][1:]  # its GPU's bus and device number
            seen[got] = (g, slot)


def test_a_session_reports_the_same_addresses_as_sessions_of_single_vgpus() -> None:
    gpus = [(0, 0, 6), (0, 0, 7)]
    together = VgpuContexts(Addresses(gpus), (0, 0, 1, 1))
    together.assign((0, 0, 1, 1), (0, 1, 0, 1))
    apart = []
    for device, slot in ((0, 0), (0, 1), (1, 0), (1, 1)):
        alone = VgpuContexts(Addresses(gpus), (device,))
        alone.assign((device,), (slot,))
        apart.append(address(alone, gpus, 0))
    assert [address(together, gpus, o) for o in range(4)] == apart
    assert len(set(apart)) == 4
    assert all(a != b for a, b in combinations(apart, 2))


def test_without_a_grant_a_sessions_vgpus_of_one_gpu_take_slots_in_guest_order() -> None:
    contexts = VgpuContexts(Addresses([(0, 0, 6)]), (0, 0, 0))
    assert contexts.slots == (0, 1, 2)
    uuid = bytes(range(16))
    assert [contexts.uuid(o, uuid) for o in range(3)] == [uuid] + [uuid[:15] + bytes([15 ^ slot]) for slot in (1, 2)]
