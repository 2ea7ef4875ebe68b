"""A guest's vGPUs from the controller, taken up by the host agent serving its region, end to end.

Real etcd, a real controller process, and a real host agent process (fake_gpu_agent.py: the Agent, region
server, executor and ControllerLink of oriond; only the CUDA driver is tests/fake_driver.py, two made-up GPUs
registered under their UUIDs). A guest is a separate Python process (allocating_guest.py) whose CUDA calls go
through the real Forwarder over the region. Waits are bounded and assert state, never how long it took.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from guest_runtime.native.build import build_driver
from ivshmem.channel import ClientChannel
from ivshmem.record import AGENT_INFO_REPLY, BIND_REQUEST, Op, Status
from ivshmem.region import Region
from ivshmem.shared.compiler import find_compiler
from ivshmem.shared.controller_client import ControllerClient
from tests.controller.rig import ControllerProcess, cluster_key_file, free_port, member_client, wait_until
from tests.controller.test_leases import gone, register
from tests.processes import stop_process

pytestmark = pytest.mark.functional

AGENT = Path(__file__).with_name("fake_gpu_agent.py")
GUEST = Path(__file__).with_name("allocating_guest.py")
SHARER = Path(__file__).with_name("sharing_guest.py")
NO_DEVICE, OUT_OF_MEMORY, INVALID_VALUE, DEVICE_UNAVAILABLE = 100, 2, 1, 46
COMPUTE_MODE_DEFAULT = 0  # CUcomputemode: the GPU's own (the fake's)
MIB = 1 << 20
EXIT_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \[INFO\] Client exits with allocation ID (\S+)$", re.M)


class FakeGpuHost:
    """fake_gpu_agent.py serving one region file, logging to a file the test can read; with `listen`, also taking
    relayed sessions on host:port (registered with the controller so)."""

    def __init__(self, tmp_path: Path, host: str, controller: str, listen: bool = False) -> None:
        self.region = tmp_path / f"orionsock-{host}"
        with open(self.region, "wb") as f:
            f.truncate(32 * MIB)  # blank: the region server formats it
        self.log_path = tmp_path / f"agent-{host}.log"
        self.log_file = open(self.log_path, "w")  # noqa: SIM115 - closed in stop()
        self.port = free_port() if listen else 0
        self.proc = subprocess.Popen([sys.executable, str(AGENT), str(self.region), host, controller,
                                      *(["--listen", str(self.port)] if listen else []),
                                      "--key-file", str(cluster_key_file())],
                                     stdout=self.log_file, stderr=subprocess.STDOUT, start_new_session=True)
        wait_until("the fake GPU host agent to serve its region", lambda: "Using SHM" in self.log(), log=self.log)

    def log(self) -> str:
        return self.log_path.read_text()

    def stop(self) -> None:
        stop_process(self.proc, 10)
        self.log_file.close()


@pytest.fixture
def gpu_host(tmp_path: Path) -> Iterator[Callable[..., FakeGpuHost]]:
    started: list[FakeGpuHost] = []

    def start(controller: str = "", host: str = "h1", client: ControllerClient | None = None,
              listen: bool = False) -> FakeGpuHost:
        agent = FakeGpuHost(tmp_path, host, controller, listen)
        started.append(agent)
        if client is not None:
            wait_until(f"{host} to register", lambda: host in {h["host"] for h in client.pool()["hosts"]},
                       log=agent.log)
        return agent
    yield start
    for agent in started:
        agent.stop()


def guest(env: dict[str, str], tmp_path: Path, region: Path, native: Path | None = None,
          script: Path = GUEST) -> subprocess.Popen[str]:
    """`script` (allocating_guest.py, or sharing_guest.py) with `env` over the test's environment (no ORION_* of its
    own), on the native driver `native` or the capsule path."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("ORION_")}
    full.update(HOME=str(tmp_path), ORION_SHM=str(region), ORION_NATIVE="1" if native else "0", **env)
    if native:
        full["ORION_NATIVE_LIB"] = str(native)  # the build under test, the one the start-up hook loads
    return subprocess.Popen([sys.executable, str(script), *(["--native", str(native)] if native else [])],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=full,
                            start_new_session=True)


@pytest.fixture(scope="module")
def native_driver(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if find_compiler() is None:
        pytest.skip("no C compiler (setup.sh installs gcc)")
    return build_driver(tmp_path_factory.mktemp("native") / "libcuda.so.1")


def first_line(proc: subprocess.Popen[str]) -> dict[str, object]:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        proc.wait(10)
        raise AssertionError(proc.stderr.read() if proc.stderr else "no output")
    return dict(json.loads(line))


def test_a_guest_gets_vgpus_of_its_host_with_their_quota_and_releases_them_at_exit(
        controllers: Callable[..., ControllerProcess], gpu_host: Callable[..., FakeGpuHost], tmp_path: Path) -> None:
    ctl = controllers()
    client = ControllerClient(ctl.address)
    agent = gpu_host(ctl.address, client=client)
    register(client, "h2")
    client.allocate(1, 1000, host="h2")  # h2 is now the busier host: an unconstrained request would go there
    free = client.pool()["vgpus_free"]
    # 13,000 MiB vGPUs: one on each fake GPU (16 and 24 GiB), so each guest device has its own quota
    proc = guest({"ORION_CONTROLLER": ctl.address, "ORION_VGPU": "2", "ORION_GMEM": "13000"}, tmp_path, agent.region)
    try:
        seen = first_line(proc)
        assert seen["cuInit"] == 0 and seen["host"] == "h1", seen
        held = client.allocation(str(seen["id"]))
        assert held["confirmed"] is True and len(held["vgpus"]) == 2
        assert sorted(v["gpu"] for v in held["vgpus"]) == [0, 1]
        quota = 13000 * MIB
        assert seen["count"] == 2 and seen["total"] == [quota, quota]
        assert (seen["alloc_too_much"], seen["alloc_1mib"]) == (OUT_OF_MEMORY, 0)  # the quota, not the GPU's memory
        assert seen["mem_info"] == [quota - MIB, quota]
        assert client.pool()["vgpus_free"] == free - 2
        out, err = proc.communicate("\n", timeout=30)
        assert proc.returncode == 0, err
        assert "[INFO] Using Orion resource (" in err and f") {seen['id']} : {held['address']}:{held['port']}/" in err
        assert EXIT_LINE.findall(err) == [seen["id"]]
        assert gone(client, str(seen["id"])) and client.pool()["vgpus_free"] == free
        log = agent.log()
        assert "Resource successfully confirmed with controller" in log and "Registered v-GPU 1 on p-GPU" in log
        assert "exceeds <vgpu 0, pgpu" in log
    finally:
        stop_process(proc, 5)


def test_a_native_driver_guest_gets_its_vgpus_and_its_lease_helper_releases_them_at_exit(
        controllers: Callable[..., ControllerProcess], gpu_host: Callable[..., FakeGpuHost], tmp_path: Path,
        native_driver: Path) -> None:
    """The same through the native guest driver: its lease helper (guest_runtime/vgpu_lease.py) asks the controller
    on the host AGENT_INFO names, the driver BINDs the grant, and the helper's end of file releases it."""
    ctl = controllers()
    client = member_client(ctl.address, "pytest")  # a member: it lists allocations
    agent = gpu_host(ctl.address, client=client)
    free = client.pool()["vgpus_free"]
    env = {"ORION_CONTROLLER": ctl.address, "ORION_VGPU": "2", "ORION_GMEM": "13000"}
    proc = guest(env, tmp_path, agent.region, native_driver)
    try:
        seen = first_line(proc)
        assert seen["cuInit"] == 0, seen
        (held,) = client.allocations()
        assert held["confirmed"] is True and held["host"] == "h1" and len(held["vgpus"]) == 2
        quota = 13000 * MIB
        assert seen["count"] == 2 and seen["total"] == [quota, quota]
        assert (seen["alloc_too_much"], seen["alloc_1mib"]) == (OUT_OF_MEMORY, 0)
        assert seen["mem_info"] == [quota - MIB, quota]
        assert seen["helper_holds_inherited_fd"] == [], seen  # only stdin, stdout, stderr reach the helper
        _, err = proc.communicate("\n", timeout=30)  # (the helper shares the guest's stderr: its exit line too)
        assert proc.returncode == 0, err
        assert "[INFO] Using Orion resource (" in err and EXIT_LINE.findall(err) == [held["id"]], err
        wait_until("the lease to be given back", lambda: gone(client, str(held["id"])))
        assert client.pool()["vgpus_free"] == free
    finally:
        stop_process(proc, 5)


@pytest.mark.parametrize("path", ["capsule", "native"])
def test_four_vgpus_on_two_gpus_are_four_devices_each_with_its_context_and_quota(
        controllers: Callable[..., ControllerProcess], gpu_host: Callable[..., FakeGpuHost], tmp_path: Path,
        native_driver: Path, path: str) -> None:
    """Orion's guide: ORION_VGPU=4 on a host of two GPUs puts two vGPUs on a GPU. Each is a device of its own, as
    natively: its own primary context, which cuCtxGetDevice names as that device, and its own quota."""
    ctl = controllers()
    client = member_client(ctl.address, "pytest")
    agent = gpu_host(ctl.address, client=client)
    env = {"ORION_CONTROLLER": ctl.address, "ORION_VGPU": "4", "ORION_GMEM": "4000"}
    proc = guest(env, tmp_path, agent.region, native_driver if path == "native" else None)
    try:
        seen = first_line(proc)
        assert seen["cuInit"] == 0, seen
        (held,) = client.allocations()
        gpus = [v["gpu"] for v in held["vgpus"]]
        assert len(gpus) == 4 and len(set(gpus)) < 4, held  # two vGPUs (at least) share a GPU
        quota = 4000 * MIB
        assert seen["count"] == 4 and seen["total"] == [quota] * 4
        assert (seen["alloc_too_much"], seen["alloc_1mib"]) == (OUT_OF_MEMORY, 0)
        contexts = seen["contexts"]
        assert len({c[0] for c in contexts}) == 4, contexts  # four primary contexts
        assert [c[1] for c in contexts] == [0, 1, 2, 3], contexts  # each names its own device
        assert [c[2:] for c in contexts] == [[quota - MIB, quota]] + [[quota, quota]] * 3, contexts
        _, err = proc.communicate("\n", timeout=30)
        assert proc.returncode == 0, err
    finally:
        stop_process(proc, 5)


def test_two_guests_given_vgpus_of_one_gpu_see_two_devices_with_their_own_addresses(
        controllers: Callable[..., ControllerProcess], gpu_host: Callable[..., FakeGpuHost], tmp_path: Path,
        native_driver: Path) -> None:
    """Two ranks of a job, each a process with ORION_VGPU=1, may get two vGPUs of one GPU: each reports the PCI
    address and UUID of its vGPU's slot (slot 0 the GPU's own), so NCCL does not take the two for one device."""
    ctl = controllers()
    client = member_client(ctl.address, "pytest")
    agent = gpu_host(ctl.address, client=client)
    env = {"ORION_CONTROLLER": ctl.address, "ORION_VGPU": "1", "ORION_GMEM": "1000"}
    procs = [guest(env, tmp_path / str(n), agent.region, native_driver) for n in range(2)]
    try:
        seen = [first_line(proc) for proc in procs]
        assert all(s["cuInit"] == 0 and s["count"] == 1 for s in seen), seen
        held = client.allocations()
        slots = sorted((v["gpu"], v["vgpu"]) for allocation in held for v in allocation["vgpus"])
        assert len(slots) == 2 and slots[0][0] == slots[1][0] and slots[0][1] != slots[1][1], held  # one GPU
        addresses = [tuple(s["addresses"][0]) for s in seen]
        uuids = [s["uuids"][0] for s in seen]
        assert addresses[0] != addresses[1] and addresses[0][1:] == addresses[1][1:], addresses  # one GPU's
        assert uuids[0] != uuids[1] and uuids[0][:30] == uuids[1][:30], uuids
        for proc in procs:
            _, err = proc.communicate("\n", timeout=30)
            assert proc.returncode == 0, err
    finally:
        for proc in procs:
            stop_process(proc, 5)


def ask(proc: subprocess.Popen[str], command: str) -> Any:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(command + "\n")
    proc.stdin.flush()
    line = proc.stdout.readline()
    if not line:
        proc.wait(10)
        raise AssertionError(proc.stderr.read() if proc.stderr else "no output")
    return json.loads(line)


@pytest.mark.parametrize("path", ["capsule", "native"])
def test_the_processes_a_vgpu_holder_starts_share_its_grant_and_its_quotas(
        controllers: Callable[..., ControllerProcess], gpu_host: Callable[..., FakeGpuHost], tmp_path: Path,
        native_driver: Path, path: str) -> None:
    """Orion's guide: ORION_VGPU=4 and one rank per device, each rank a process the first one started. The holder's
    token (ORION_GRANT) lets them join its grant instead of asking the controller (grant_sharing.py); each may use
    every vGPU, as processes share a GPU natively (PyTorch's ranks all touch device 0), and a vGPU's quota bounds
    what they hold on it together (grant_usage.py: a process that ends counts nothing); a token no holder gives is
    said once and the process asks for its own; and when the holder ends, the processes that joined it lose their
    vGPUs (an error, never a session outliving its grant)."""
    ctl = controllers()
    client = member_client(ctl.address, "pytest")
    agent = gpu_host(ctl.address, client=client)
    native = native_driver if path == "native" else None
    env = {"ORION_CONTROLLER": ctl.address, "ORION_VGPU": "2", "ORION_GMEM": "100"}
    holder = guest(env, tmp_path, agent.region, native, SHARER)
    joined: list[subprocess.Popen[str]] = []
    try:
        seen = ask(holder, "init")
        assert (seen["cuInit"], seen["count"], seen["compute_mode"]) == (0, 2, COMPUTE_MODE_DEFAULT), seen
        token = seen["grant"]
        assert re.fullmatch(r"[0-9]+-[0-9a-f]{32}", token), seen
        (held,) = client.allocations()
        child = ask(holder, "spawn")  # started by the holder: its environment, ORION_GRANT included
        assert child["returncode"] == 0, child
        first, retained = child["lines"]
        assert (first["cuInit"], first["count"], first["grant"]) == (0, 2, token), child
        assert retained == [0, 0, 0, [100 * MIB, 100 * MIB]], child
        assert "Using Orion resource" not in child["stderr"], child  # it asked the controller for nothing
        assert [a["id"] for a in client.allocations()] == [held["id"]]

        a, b = (guest({**env, "ORION_GRANT": token}, tmp_path, agent.region, native, SHARER) for _ in range(2))
        joined += [a, b]
        assert ask(a, "init")["cuInit"] == 0 and ask(b, "init")["cuInit"] == 0
        assert ask(a, "retain 0") == [0, 0, 0, [100 * MIB, 100 * MIB]]
        assert ask(a, "alloc 60") == 0
        assert ask(b, "retain 0") == [0, 0, 0, [40 * MIB, 100 * MIB]]  # a's 60 MiB count on vGPU 0 for b too
        assert ask(b, "alloc 60") == OUT_OF_MEMORY  # together past vGPU 0's quota
        assert ask(b, "alloc 30") == 0
        assert ask(holder, "retain 0")[3] == [10 * MIB, 100 * MIB]
        assert ask(a, "pitch 8 3") == INVALID_VALUE  # within the room, refused by the driver: its room given back
        assert ask(holder, "retain 0")[3] == [10 * MIB, 100 * MIB]
        assert ask(b, "retain 1")[2:] == [1, [100 * MIB, 100 * MIB]]  # vGPU 1's quota is its own
        assert [a["id"] for a in client.allocations()] == [held["id"]]
        a.communicate("", timeout=30)  # its session ends: its 60 MiB count no more
        wait_until("an ended session's bytes to leave the grant's count",
                   lambda: ask(b, "retain 0")[3] == [70 * MIB, 100 * MIB], log=agent.log)
        assert ask(b, "alloc 60") == 0

        stranger = guest({**env, "ORION_GRANT": token[:-8] + "00000000"}, tmp_path, agent.region, native, SHARER)
        seen = ask(stranger, "init")
        assert seen["cuInit"] == 0 and seen["grant"] not in ("", token), seen  # its own grant, shared in turn
        assert len(client.allocations()) == 2
        _, err = stranger.communicate("", timeout=30)
        assert err.count("did not join the vGPUs of the process that shared them") == 1, err

        _, err = holder.communicate("", timeout=30)
        assert holder.returncode == 0, err
        wait_until("the joined sessions to end with the holder", lambda: ask(b, "retain 0")[0] == DEVICE_UNAVAILABLE,
                   log=agent.log)
        wait_until("the holder's grant to be given back", lambda: gone(client, str(held["id"])))
        assert "the process whose vGPUs this session joined ended" in agent.log()
    finally:
        for proc in [holder, *joined]:
            stop_process(proc, 5)


def test_a_native_driver_guest_refused_vgpus_is_one_line_and_no_device(
        controllers: Callable[..., ControllerProcess], gpu_host: Callable[..., FakeGpuHost], tmp_path: Path,
        native_driver: Path) -> None:
    ctl = controllers()
    client = member_client(ctl.address, "pytest")  # a member: it lists allocations
    agent = gpu_host(ctl.address, client=client)
    env = {"ORION_CONTROLLER": ctl.address, "ORION_VGPU": "3", "ORION_GMEM": "99999"}
    proc = guest(env, tmp_path, agent.region, native_driver)
    try:
        assert first_line(proc)["cuInit"] == NO_DEVICE
        _, err = proc.communicate("\n", timeout=30)
        lines = err.splitlines()
        assert lines[0].startswith("orion: no GPU through Orion: ") and "Fail to get resource from controller" in \
            lines[0], err
        assert lines[1].endswith("[INFO] Client exits without allocation ID.") and len(lines) == 2, err
        assert client.allocations() == []
    finally:
        stop_process(proc, 5)


def test_the_controller_in_the_users_client_conf_is_used(controllers: Callable[..., ControllerProcess],
                                                         gpu_host: Callable[..., FakeGpuHost], tmp_path: Path) -> None:
    ctl = controllers()
    client = ControllerClient(ctl.address)
    agent = gpu_host(ctl.address, client=client)
    (tmp_path / ".orion").mkdir()
    (tmp_path / ".orion" / "client.conf").write_text(f"[controller]\n    controller_addr = {ctl.address}\n")
    proc = guest({"ORION_VGPU": "1"}, tmp_path, agent.region)
    try:
        seen = first_line(proc)
        assert seen["cuInit"] == 0 and client.allocation(str(seen["id"]))["id"] == seen["id"]
        assert seen["total"] == [16384 * MIB // 4]  # no ORION_GMEM: the GPU's memory / vgpu_count
        _, err = proc.communicate("\n", timeout=30)
        assert EXIT_LINE.findall(err) == [seen["id"]]
    finally:
        stop_process(proc, 5)


def test_a_killed_guest_is_given_back_by_its_host_agent(controllers: Callable[..., ControllerProcess],
                                                        gpu_host: Callable[..., FakeGpuHost], tmp_path: Path) -> None:
    ctl = controllers(extra=["--lease-ttl", "600"])  # not the lease: the agent's release is what frees it
    client = ControllerClient(ctl.address)
    agent = gpu_host(ctl.address, client=client)
    proc = guest({"ORION_CONTROLLER": ctl.address, "ORION_VGPU": "1"}, tmp_path, agent.region)
    try:
        alloc_id = str(first_line(proc)["id"])
        assert client.allocation(alloc_id)["confirmed"] is True
        proc.kill()
        proc.wait(10)
        released = f"Release resource with allocation ID {alloc_id}"
        # The agent logs the line once the controller has answered, so the log may trail the pool by a moment.
        wait_until("the host agent to give the killed guest's vGPUs back",
                   lambda: gone(client, alloc_id) and released in agent.log(), log=agent.log)
        assert client.pool()["vgpus_free"] == 8
    finally:
        stop_process(proc, 5)


@pytest.mark.parametrize(("env", "expected"), [
    ({"ORION_VGPU": "3", "ORION_GMEM": "99999"}, "Fail to get resource from controller"),
    ({"ORION_VGPU": "many"}, "ORION_VGPU='many' is not a positive whole number of vGPUs"),
])
def test_a_refused_request_is_one_line_and_no_device(controllers: Callable[..., ControllerProcess],
                                                     gpu_host: Callable[..., FakeGpuHost], tmp_path: Path,
                                                     env: dict[str, str], expected: str) -> None:
    ctl = controllers()
    client = member_client(ctl.address, "pytest")  # a member: it lists allocations
    agent = gpu_host(ctl.address, client=client)
    proc = guest({"ORION_CONTROLLER": ctl.address, **env}, tmp_path, agent.region)
    try:
        seen = first_line(proc)
        assert seen == {"cuInit": NO_DEVICE, "id": None, "host": None}
        _, err = proc.communicate("\n", timeout=30)
        lines = err.splitlines()
        assert lines[0].startswith("orion: no GPU through Orion: ") and expected in lines[0], err
        assert lines[1].endswith("[INFO] Client exits without allocation ID.") and len(lines) == 2, err
        assert "Traceback" not in err and client.allocations() == []
    finally:
        stop_process(proc, 5)


@pytest.mark.parametrize("linked", [True, False])
def test_no_controller_or_an_unlinked_agent_is_one_line_and_no_device(
        controllers: Callable[..., ControllerProcess], gpu_host: Callable[..., FakeGpuHost], tmp_path: Path,
        linked: bool) -> None:
    if linked:  # the agent has a controller, the guest's ORION_CONTROLLER answers nothing
        ctl = controllers()
        agent = gpu_host(ctl.address, client=ControllerClient(ctl.address))
        expected = "cannot reach the Orion Controller at 127.0.0.1:"
    else:
        agent = gpu_host("")
        expected = "is not linked to an Orion Controller, so it cannot take up vGPUs: set controller_addr"
    proc = guest({"ORION_CONTROLLER": f"127.0.0.1:{free_port()}", "ORION_VGPU": "1"}, tmp_path, agent.region)
    try:
        assert first_line(proc)["cuInit"] == NO_DEVICE
        _, err = proc.communicate("\n", timeout=30)
        assert expected in err.splitlines()[0], err
        assert "Traceback" not in err
    finally:
        stop_process(proc, 5)


def test_a_hostile_bind_is_refused_with_a_reason_and_the_agent_keeps_serving(
        controllers: Callable[..., ControllerProcess], gpu_host: Callable[..., FakeGpuHost], tmp_path: Path) -> None:
    ctl = controllers()
    client = ControllerClient(ctl.address)
    agent = gpu_host(ctl.address, client=client)
    register(client, "h2")
    elsewhere = client.allocate(1, 1000, host="h2")["id"]
    mine = client.allocate(1, 1000, host="h1")["id"]
    region = Region.open(str(agent.region))
    try:
        with ClientChannel.claim(region) as channel:
            info = channel.call(Op.AGENT_INFO)
            assert AGENT_INFO_REPLY.decode(info.payload) == ("h1", ctl.address)
            for allocation, reason in [(elsewhere, "granted on host h2, not h1"), ("no-such-id", "does not exist"),
                                       ("bad/../../id", "is not a valid allocation id")]:
                reply = channel.call(Op.BIND, BIND_REQUEST.encode(allocation))
                assert reply.status == Status.REFUSED and reason in bytes(reply.payload).decode(), reply
            assert channel.call(Op.BIND, b"\xff").status == Status.MALFORMED
            assert client.allocation(elsewhere)["confirmed"] is False
            assert channel.call(Op.BIND, BIND_REQUEST.encode(mine)).ok
            again = channel.call(Op.BIND, BIND_REQUEST.encode(mine))
            assert again.status == Status.REFUSED and b"already took up" in bytes(again.payload)
        wait_until("the released session's allocation to be given back", lambda: gone(client, mine), log=agent.log)
        assert not gone(client, elsewhere)
    finally:
        region.close()
    proc = guest({"ORION_CONTROLLER": ctl.address, "ORION_VGPU": "1"}, tmp_path, agent.region)
    try:
        assert first_line(proc)["cuInit"] == 0  # the agent still serves
    finally:
        stop_process(proc, 5)
