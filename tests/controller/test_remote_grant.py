"""A guest on a host without GPUs gets vGPUs of another host: its oriond relays the session there, end to end.

Real etcd, a real controller process, a GPU host (test_guest_allocation's FakeGpuHost with `listen`:
fake_gpu_agent.py --listen, the Agent, region server, executor, relay listener and ControllerLink of oriond over
tests/fake_driver.py, registered as 127.0.0.2 with its listen port) and a relay-only host: a real oriond whose
made-up GPU inventory is empty, so it registers nothing and
answers AGENT_INFO with "*" (host_agent/relay/route.py). The guest (allocating_guest.py) talks to the relay's
region only; the controller grants its vGPUs on the GPU host, the relay dials that host's registered
address:port, and the GPU host confirms the grant with the controller (docs/remote.md). Waits are bounded and
assert state, never how long it took.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.controller.oriond_proc import Oriond
from tests.controller.rig import ControllerProcess, free_port, member_client, wait_until
from tests.controller.test_guest_allocation import (  # noqa: F401 (gpu_host: a fixture)
    EXIT_LINE,
    MIB,
    NO_DEVICE,
    OUT_OF_MEMORY,
    FakeGpuHost,
    first_line,
    gpu_host,
    guest,
)
from tests.controller.test_leases import gone
from tests.processes import stop_process

pytestmark = pytest.mark.functional

GPU_HOST = "127.0.0.2"  # the GPU host's name in the pool, its bind address and where relays dial it
DEAD_HOST = "127.0.0.3"  # a registered host where nothing listens
QUOTA_MIB = 4000


class RelayHost:
    """A real oriond with a controller but no GPU (an empty test inventory): it only relays its region's sessions."""

    def __init__(self, tmp_path: Path, controller: str) -> None:
        self.oriond = Oriond(tmp_path / "relay-host", "127.0.0.1", controller, gpus=[], listen_port=free_port())
        self.region = self.oriond.shm / "orionsock0"
        with open(self.region, "wb") as f:
            f.truncate(32 * MIB)  # blank: oriond formats it
        self.oriond.start()
        wait_until("the relay-only oriond to serve its region",
                   lambda: "Using SHM" in self.log() and "No GPU registered here" in self.log(), log=self.log)

    def log(self) -> str:
        return self.oriond.log()

    def stop(self) -> None:
        self.oriond.stop()


@pytest.fixture
def relay_host(tmp_path: Path) -> Iterator[Callable[[str], RelayHost]]:
    started: list[RelayHost] = []

    def start(controller: str) -> RelayHost:
        started.append(RelayHost(tmp_path, controller))
        return started[-1]
    yield start
    for host in started:
        host.stop()


def test_a_guest_on_a_relay_only_host_gets_vgpus_of_the_gpu_host_and_gives_them_back(
        controllers: Callable[..., ControllerProcess], gpu_host: Callable[..., FakeGpuHost],  # noqa: F811
        relay_host: Callable[[str], RelayHost], tmp_path: Path) -> None:
    ctl = controllers()
    client = member_client(ctl.address, "pytest")  # a member: it lists allocations
    gpu = gpu_host(ctl.address, GPU_HOST, client, listen=True)
    relay = relay_host(ctl.address)
    assert [h["host"] for h in client.pool()["hosts"]] == [GPU_HOST]  # the relay registered nothing
    env = {"ORION_CONTROLLER": ctl.address, "ORION_VGPU": "1", "ORION_GMEM": str(QUOTA_MIB)}
    proc = guest(env, tmp_path, relay.region)
    try:
        seen = first_line(proc)
        assert seen["cuInit"] == 0 and seen["host"] == GPU_HOST, (seen, relay.log(), gpu.log())
        held = client.allocation(str(seen["id"]))
        assert held["confirmed"] is True and (held["host"], held["address"], held["port"]) == \
            (GPU_HOST, GPU_HOST, gpu.port)
        quota = QUOTA_MIB * MIB
        assert seen["count"] == 1 and seen["total"] == [quota]
        assert (seen["alloc_too_much"], seen["alloc_1mib"]) == (OUT_OF_MEMORY, 0)  # the quota, not the GPU's memory
        assert seen["mem_info"] == [quota - MIB, quota]
        wait_until("the relay to log where it relayed the session",
                   lambda: f"relayed to {GPU_HOST}:{gpu.port} " in relay.log(), log=relay.log)
        wait_until("the GPU host to log the relayed session",
                   lambda: "Resource successfully confirmed with controller" in gpu.log()
                   and "relayed over tcp" in gpu.log(), log=gpu.log)
        extra = client.allocation(str(seen["id"]))["extra"]
        assert extra["transport"] == "tcp" and extra["relay"].startswith("127.0.0.1:"), extra  # what orion-smi shows
        _, err = proc.communicate("\n", timeout=30)
        assert proc.returncode == 0, err
        assert EXIT_LINE.findall(err) == [seen["id"]], err
        assert "Traceback" not in err, err
        wait_until("the allocation to be given back",
                   lambda: gone(client, str(seen["id"])) and client.allocations() == [], log=ctl.log)
        wait_until("the GPU host's relayed session to end",
                   lambda: re.search(r"relayed session \d+ from \S+ ended", gpu.log()), log=gpu.log)
    finally:
        stop_process(proc, 5)


def test_a_killed_guests_relayed_grant_is_given_back_by_the_gpu_host(
        controllers: Callable[..., ControllerProcess], gpu_host: Callable[..., FakeGpuHost],  # noqa: F811
        relay_host: Callable[[str], RelayHost], tmp_path: Path) -> None:
    """No release from the guest: its session ends on the relay, the relay connection with it, and the GPU host's
    listener gives the grant its relayed session took up back to the controller (not the lease: 600 s)."""
    ctl = controllers(extra=["--lease-ttl", "600"])
    client = member_client(ctl.address, "pytest")  # a member: it lists allocations
    gpu = gpu_host(ctl.address, GPU_HOST, client, listen=True)
    relay = relay_host(ctl.address)
    proc = guest({"ORION_CONTROLLER": ctl.address, "ORION_VGPU": "1"}, tmp_path, relay.region)
    try:
        seen = first_line(proc)
        assert seen["cuInit"] == 0 and seen["host"] == GPU_HOST, (seen, relay.log(), gpu.log())
        alloc_id = str(seen["id"])
        assert client.allocation(alloc_id)["confirmed"] is True
        proc.kill()
        proc.wait(10)
        released = f"Release resource with allocation ID {alloc_id}"
        wait_until("the GPU host to give the killed guest's relayed grant back",
                   lambda: gone(client, alloc_id) and released in gpu.log(), log=lambda: relay.log() + gpu.log())
        assert re.search(r"relayed session \d+ from \S+ ended", gpu.log()), gpu.log()
        assert client.allocations() == []
    finally:
        stop_process(proc, 5)


def test_a_grant_on_a_gpu_host_that_cannot_be_reached_is_one_line_and_no_device(
        controllers: Callable[..., ControllerProcess], relay_host: Callable[[str], RelayHost], tmp_path: Path) -> None:
    """The controller's only host is registered at a port where nothing listens (its oriond died, or its
    listen_port is firewalled): the relay cannot dial it, so the guest's BIND is refused with the reason, the
    grant is given back, and the program sees no device, said once."""
    ctl = controllers()
    client = member_client(ctl.address, "pytest")  # a member: it lists allocations
    dead_port = free_port()
    member_client(ctl.address, DEAD_HOST).register_host(
        DEAD_HOST, [{"uuid": "GPU-dead-0", "name": "V100", "memory_mib": 16160}], port=dead_port, address=DEAD_HOST,
        ttl_s=600)
    relay = relay_host(ctl.address)
    proc = guest({"ORION_CONTROLLER": ctl.address, "ORION_VGPU": "1", "ORION_GMEM": str(QUOTA_MIB)}, tmp_path,
                 relay.region)
    try:
        seen = first_line(proc)
        assert seen == {"cuInit": NO_DEVICE, "id": None, "host": None}, seen
        _, err = proc.communicate("\n", timeout=30)
        # Orion's line for the grant, then the one line saying why it could not be used, then Orion's exit line.
        lines = err.splitlines()
        assert len(lines) == 3, err
        granted, why, exit_line = lines
        assert "[INFO] Using Orion resource (" in granted and f": {DEAD_HOST}:{dead_port}/0/" in granted, err
        assert why.startswith("orion: no GPU through Orion: "), err
        assert f"cannot reach the GPU host's oriond at {DEAD_HOST}:{dead_port}" in why, err
        assert exit_line.endswith("[INFO] Client exits without allocation ID."), err
        assert "Traceback" not in err
        assert client.allocations() == []  # the guest gave back the grant it could not take up
        assert f"cannot reach the GPU host's oriond at {DEAD_HOST}:{dead_port}" in relay.log()
    finally:
        stop_process(proc, 5)
