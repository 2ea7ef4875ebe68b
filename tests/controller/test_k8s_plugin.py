"""orion-k8s-plugin against kubelet's side of the real gRPC API, a real controller on a real etcd and a real oriond.

Kubelet cannot run here, so tests/controller/kubelet.py plays it over the real wire: it serves Registration,
dials the plugin back, watches ListAndWatch and calls Allocate as kubelet does. The node's oriond is the real
one with a made-up GPU inventory (two GPUs, vgpu_count 2: four vGPUs); it serves the regions the plugin makes
in its sealed directory. A container is made from namespaces, as tests/wire/test_container.py does, with the
mounts and environment of the plugin's Allocate answer applied as a container runtime applies them.
"""
from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from host_agent.k8s.api import pb
from ivshmem.shared.controller_client import ControllerClient
from tests.controller.kubelet import Kubelet, Plugin
from tests.controller.oriond_proc import Oriond
from tests.controller.rig import REPO, ControllerProcess, free_port, member_client, wait_until
from tests.processes import python_path

NODE = "127.0.0.31"
GPUS = [{"uuid": "GPU-5a5a5a5a-1111-2222-3333-444444444444", "name": "Tesla T4", "memory_mib": 15360},
        {"uuid": "GPU-5b5b5b5b-1111-2222-3333-444444444444", "name": "Tesla T4", "memory_mib": 15360}]
HOST_TTL_S = 2
# On the GPU machine oriond registers the real GPUs and a forwarded cuInit succeeds; here, the made-up ones, and
# oriond answers cuInit with CUDA_ERROR_NO_DEVICE (it has no CUDA driver to serve the grant with).
HAS_GPU = os.path.exists("/dev/nvidia0") or shutil.which("nvidia-smi") is not None
CUINIT_RESULT = 0 if HAS_GPU else 100


def healthy(devices: list[tuple[str, str]]) -> bool:
    return bool(devices) and all(health == "Healthy" for _, health in devices)


def unhealthy(devices: list[tuple[str, str]]) -> bool:
    return bool(devices) and all(health == "Unhealthy" for _, health in devices)


@dataclass
class Node:
    ctl: ControllerProcess
    agent: Oriond
    kubelet: Kubelet
    plugin: Plugin
    plugin_dir: str
    devices: list[str]  # the vGPUs of this host in the controller's pool, as device ids

    def logs(self) -> str:
        return f"--- plugin\n{self.plugin.log()[-3000:]}\n--- oriond\n{self.agent.log()[-3000:]}"


@pytest.fixture
def plugin_dir() -> Iterator[str]:
    """kubelet's device-plugin directory: short (a unix socket path has at most 107 bytes; tmp_path is long)."""
    directory = tempfile.mkdtemp(prefix="orion-kubelet-", dir="/tmp")
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def node(controllers: Callable[..., ControllerProcess], tmp_path: Path, plugin_dir: str) -> Iterator[Node]:
    ctl = controllers(extra=["--host-ttl", str(HOST_TTL_S)])
    agent = Oriond(tmp_path / "oriond", NODE, ctl.address, None if HAS_GPU else GPUS, vgpu_count=2,
                   listen_port=free_port())
    agent.shm.chmod(0o700)  # the sealed directory the plugin makes regions in, and oriond serves
    agent.start()
    kubelet = Kubelet(plugin_dir).start()
    plugin = Plugin(tmp_path / "plugin.log", "-controller", ctl.address, "-config", str(agent.conf),
                    "-device-plugin-dir", plugin_dir, "-pid-file", str(agent.pid_file), "-poll", "0.2").start()
    made = Node(ctl, agent, kubelet, plugin, plugin_dir, [])
    try:
        wait_until("the plugin did not register with kubelet", lambda: kubelet.registrations, log=made.logs)
        wait_until("oriond did not register", lambda: pool_devices(ctl), log=made.logs)
        made.devices = pool_devices(ctl)
        yield made
    finally:
        code = plugin.stop()
        kubelet.stop()
        agent.stop()
        assert code == 0, f"orion-k8s-plugin exited with {code}\n{made.logs()}"
    assert "Traceback" not in plugin.log(), plugin.log()


def pool_devices(ctl: ControllerProcess) -> list[str]:
    """The device ids of NODE's vGPUs as the controller's pool lists them."""
    with ControllerClient(ctl.address, timeout_s=10) as client:
        hosts = client.pool(NODE)["hosts"]
    return sorted(f"vgpu-{g['index']}-{slot}" for h in hosts for g in h["gpus"] for slot in range(g["vgpu_count"]))


def test_the_plugin_registers_and_lists_exactly_the_hosts_vgpus(node: Node) -> None:
    request = node.kubelet.registrations[0]
    assert (request.version, request.endpoint, request.resource_name) == (
        "v1beta1", "orion-vgpu.sock", "virtaitech.com/gpu")
    assert stat.S_ISSOCK(os.stat(os.path.join(node.plugin_dir, request.endpoint)).st_mode)
    devices = node.kubelet.next_list(healthy)
    assert sorted(device for device, _ in devices) == node.devices
    if not HAS_GPU:
        assert node.devices == ["vgpu-0-0", "vgpu-0-1", "vgpu-1-0", "vgpu-1-1"]  # two GPUs, vgpu_count 2
    options = node.kubelet.plugin().GetDevicePluginOptions(pb.Empty(), timeout=5)
    assert (options.pre_start_required, options.get_preferred_allocation_available) == (False, False)


def test_the_device_list_follows_the_pool(node: Node) -> None:
    node.kubelet.next_list(healthy)
    with member_client(node.ctl.address, NODE) as client:  # the host's GPUs as its oriond re-registers them
        client.register_host(NODE, GPUS[:1], vgpu_count=3, address=NODE)
    devices = node.kubelet.next_list(lambda d: healthy(d) and len(d) == 3)
    assert sorted(d for d, _ in devices) == ["vgpu-0-0", "vgpu-0-1", "vgpu-0-2"]


def test_devices_go_unhealthy_when_oriond_or_the_controller_is_gone_and_come_back(node: Node) -> None:
    node.kubelet.next_list(healthy)
    node.agent.stop()  # a clean stop unregisters the host at once
    assert sorted(d for d, _ in node.kubelet.next_list(unhealthy)) == node.devices  # listed, not usable
    assert f"host {NODE} is not in the pool" in node.plugin.log()
    with pytest.raises(grpc.RpcError) as refused:
        node.kubelet.allocate(["vgpu-0-0"])
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE and "Unhealthy" in refused.value.details()

    node.agent.start()
    assert sorted(d for d, _ in node.kubelet.next_list(healthy)) == node.devices

    node.ctl.kill()  # a controller outage: unhealthy, never a crash
    node.kubelet.next_list(unhealthy)
    assert "cannot reach the Orion Controller" in node.plugin.log()
    node.ctl.start()
    node.kubelet.next_list(healthy)
    assert node.plugin.alive()


def test_the_plugin_registers_again_when_kubelet_restarts(node: Node) -> None:
    node.kubelet.next_list(healthy)
    node.kubelet.restart()  # deletes the plugin's socket and makes a new kubelet.sock
    wait_until("no second registration", lambda: len(node.kubelet.registrations) == 2, log=node.logs)
    assert sorted(d for d, _ in node.kubelet.next_list(healthy)) == node.devices  # a stream on the new socket
    answer = node.kubelet.allocate(node.devices[-1:])
    assert answer.container_responses[0].envs["ORION_VGPU"] == "1"
    assert "serving it again" in node.plugin.log()
    socket = Path(node.plugin_dir) / node.kubelet.registrations[-1].endpoint
    assert stat.S_IMODE(socket.stat().st_mode) == 0o600  # only kubelet's user may call it

    region = Path(answer.container_responses[0].mounts[0].host_path)
    assert node.plugin.stop() == 0  # the plugin itself restarts (a new DaemonSet pod): it registers again ...
    node.plugin.start()
    wait_until("no registration after the plugin's restart", lambda: len(node.kubelet.registrations) == 3,
               log=node.logs)
    assert sorted(d for d, _ in node.kubelet.next_list(healthy)) == node.devices
    assert region.exists()  # ... and leaves the running containers' regions alone


def test_the_plugin_waits_for_a_kubelet_that_is_down_and_registers_when_it_is_back(node: Node) -> None:
    node.kubelet.next_list(healthy)
    node.kubelet.stop()
    Path(node.kubelet.socket).unlink(missing_ok=True)  # kubelet down for a while: no kubelet.sock
    wait_until("the plugin did not notice kubelet's absence", lambda: "kubelet stopped" in node.plugin.log(),
               log=node.logs)
    assert len(node.kubelet.registrations) == 1 and node.plugin.alive()
    node.kubelet.start()
    wait_until("no registration once kubelet is back", lambda: len(node.kubelet.registrations) == 2,
               log=node.logs)
    assert sorted(d for d, _ in node.kubelet.next_list(healthy)) == node.devices


def test_bad_requests_are_refused_with_grpc_errors_and_make_nothing(node: Node) -> None:
    node.kubelet.next_list(healthy)
    count = len(node.devices)
    cases = {
        "unknown": (["vgpu-7-0"], "unknown device id"),
        "too many": (node.devices + ["vgpu-9-0"], f"asks for {count + 1} devices; this node has {count}"),
        "repeated": (["vgpu-0-0", "vgpu-0-0"], "named twice"),
        "none": ([], "names no device"),
    }
    for name, (ids, words) in cases.items():
        with pytest.raises(grpc.RpcError) as refused:
            node.kubelet.allocate(ids)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, name
        assert words in refused.value.details(), (name, refused.value.details())
    with pytest.raises(grpc.RpcError) as refused:  # one device for two containers of one pod
        node.kubelet.allocate(["vgpu-0-0"], ["vgpu-0-0", "vgpu-0-1"])
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert sorted(os.listdir(node.agent.shm)) == []  # no region was made for any of them
    assert node.plugin.alive()


# Inside the container's namespaces: its own /dev/shm, each of Allocate's mounts bound in as the runtime binds it,
# then the program as an unprivileged uid, with Allocate's environment plus the pod spec's ORION_GMEM.
CONTAINER = r"""
set -e
mount -t tmpfs -o size=4m tmpfs /dev/shm
printf '%s\n' "$MOUNTS" | while read -r host inside; do touch "$inside"; mount --bind "$host" "$inside"; done
echo "CONTAINER shm=$(ls /dev/shm)"
exec setpriv --reuid 5151 --regid 5151 --clear-groups "$PYTHON" -c "$PROGRAM"
"""
CUINIT = ("import guest_runtime.activate as orion; orion.activate(); from cuda.bindings import driver; "
          "print('CUINIT', int(driver.cuInit(0)[0]), flush=True)")


def run_container(answer: Any, gmem_mib: int) -> subprocess.CompletedProcess[str]:
    mounts = "\n".join(f"{m.host_path} {m.container_path}" for m in answer.mounts)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORION_")}
    env.update(dict(answer.envs), ORION_GMEM=str(gmem_mib), ORION_NATIVE="0", MOUNTS=mounts, PYTHON=sys.executable,
               PROGRAM=CUINIT, PYTHONPATH=python_path(), PYTHONDONTWRITEBYTECODE="1", HOME="/tmp")
    return subprocess.run(["unshare", "--mount", "--ipc", "--pid", "--fork", "--mount-proc", "--kill-child",
                           "sh", "-c", CONTAINER], env=env, cwd="/", capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("setpriv") is None,
                    reason="needs root, util-linux unshare and setpriv to make the container")
def test_a_container_set_up_by_allocate_reaches_oriond_through_its_own_region(node: Node) -> None:
    node.kubelet.next_list(healthy)
    first, second = node.devices[-2:]
    answer = node.kubelet.allocate([second, first])
    (container,) = answer.container_responses
    gpu, slot = (int(n) for n in first.split("-")[1:])
    name = f"orionsock{gpu * 100 + slot}"  # named after the container's first device
    region = node.agent.shm / name
    assert dict(container.envs) == {"ORION_SHM": f"/dev/shm/{name}", "ORION_VGPU": "2",
                                    "ORION_CONTROLLER": node.ctl.address}
    assert [(m.host_path, m.container_path, m.read_only) for m in container.mounts] == [
        (str(region), f"/dev/shm/{name}", False)]
    st = region.stat()
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o666)  # any uid the container runs as can open it
    wait_until("oriond does not serve the new region", lambda: f"Using SHM {name}:" in node.agent.log(), log=node.logs)
    assert "writable by every local user" not in node.agent.log()  # its directory is sealed

    done = run_container(container, gmem_mib=2048)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out + node.logs()
    assert f"CONTAINER shm={name}" in out  # its own /dev/shm, holding its region only
    assert f"CUINIT {CUINIT_RESULT}" in out.splitlines(), out  # answered by oriond
    assert "Using Orion resource" in out and f"{NODE}:" in out, out  # two vGPUs granted on this node
    assert "Creating session" in node.agent.log()

    # A user of the host, the same uid, is kept out by the sealed directory, whatever the file's mode.
    outside = subprocess.run(["setpriv", "--reuid", "5151", "--regid", "5151", "--clear-groups", sys.executable,
                              "-c", f"open({str(region)!r}, 'rb')"], capture_output=True, text=True, timeout=30)
    assert outside.returncode != 0 and "Permission denied" in outside.stderr, outside.stderr

    # The device's next container gets a new region: nothing of this one's sessions.
    before = region.stat().st_ino
    node.kubelet.allocate([first])
    assert region.stat().st_ino != before


def test_the_plugin_refuses_a_region_directory_others_can_enter(tmp_path: Path, plugin_dir: str) -> None:
    shm = tmp_path / "regions"
    shm.mkdir(mode=0o755)
    shm.chmod(0o755)
    conf = tmp_path / "server.conf"
    conf.write_text(f'[server-shm]\n    shm_path_base = "{shm}/"\n')
    done = subprocess.run([sys.executable, "-m", "host_agent.k8s.cli", "-config", str(conf), "-device-plugin-dir",
                           plugin_dir, "-controller", f"127.0.0.1:{free_port()}"], cwd=REPO,
                          env={**os.environ, "PYTHONPATH": python_path()}, capture_output=True, text=True, timeout=30)
    assert done.returncode == 1, done.stderr
    assert f"{shm} (the containers' region directory) has mode 0755" in done.stderr, done.stderr
    assert "chmod 0700" in done.stderr and "shm_path_base" in done.stderr and "Traceback" not in done.stderr
    assert os.listdir(plugin_dir) == []
