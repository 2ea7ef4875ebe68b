#!/usr/bin/env python3
"""orion-k8s-plugin benchmark: how long a container waits for its region, against making one by hand. Not a test.

Everything is real and on this machine: etcd, a controller, oriond (a made-up GPU inventory unless a GPU is
here), orion-k8s-plugin, and kubelet's side of the gRPC API (tests/controller/kubelet.py). Per iteration:
* baseline: the container recipe by hand (docs/containers.md): `orion-shm create` in-process (shm_admin.create),
  SIGHUP to oriond, then a client claims a channel of the new region as soon as oriond serves it;
* the plugin: kubelet's Allocate for one device (the plugin removes the device's old region, makes a new one
  and wakes oriond), then the same claim on the region Allocate named.
It prints the Allocate round trip, the time until the region serves a client for both paths and their ratio,
and how long the plugin takes to tell kubelet of an oriond that stopped (bounded by its poll period).
No result check (bench/verify.py): it times control-plane calls (Allocate, a channel's claim) that move no data.

Run: ``.venv/bin/python bench/k8s_bench.py [--iterations N]``. Needs /usr/bin/etcd and root (the regions).
"""
from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from host_agent import shm_admin  # noqa: E402
from host_agent.daemon import pidfile  # noqa: E402
from ivshmem.channel import ClientChannel  # noqa: E402
from ivshmem.errors import WireError  # noqa: E402
from ivshmem.region import Region  # noqa: E402
from tests.controller.kubelet import Kubelet, Plugin  # noqa: E402
from tests.controller.oriond_proc import Oriond  # noqa: E402
from tests.controller.rig import ControllerProcess, EtcdServer, etcd_binary, free_port, wait_until  # noqa: E402

NODE = "127.0.0.41"
GPUS = [{"uuid": f"GPU-{uuid.uuid4()}", "name": "made-up", "memory_mib": 16384}]


def served_after(path: str, since: float, timeout_s: float = 10.0) -> float:
    """Seconds from `since` until a client can claim a channel of the region at `path`."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with Region.open(path) as region:
                ClientChannel.claim(region, accept_timeout=timeout_s).close()
            return time.perf_counter() - since
        except WireError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.001)


def ms(samples: list[float]) -> str:
    return f"p50 {statistics.median(samples) * 1000:7.1f} ms   max {max(samples) * 1000:7.1f} ms"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iterations", type=int, default=20)
    args = parser.parse_args()
    binary = etcd_binary()
    if binary is None:
        sys.exit("k8s_bench: etcd is not installed (apt-get install etcd-server)")
    work = Path(tempfile.mkdtemp(prefix="orion-k8s-bench-"))
    kubelet_dir = tempfile.mkdtemp(prefix="orion-kubelet-", dir="/tmp")
    etcd = EtcdServer(binary, work / "etcd")
    etcd.start()
    ctl = ControllerProcess(etcd.url, f"/orion-bench-{uuid.uuid4().hex[:8]}/", work / "controller.log").start()
    agent = Oriond(work / "oriond", NODE, ctl.address, GPUS, vgpu_count=4, listen_port=free_port())
    agent.shm.chmod(0o700)
    agent.start()
    kubelet = Kubelet(kubelet_dir).start()
    started = time.perf_counter()
    plugin = Plugin(work / "plugin.log", "-controller", ctl.address, "-config", str(agent.conf),
                    "-device-plugin-dir", kubelet_dir, "-pid-file", str(agent.pid_file)).start()
    try:
        wait_until("no registration", lambda: kubelet.registrations, log=plugin.log)
        registered = time.perf_counter() - started
        kubelet.next_list(lambda d: len(d) == 4 and all(h == "Healthy" for _, h in d))
        hand, rpc, allocated = [], [], []
        for i in range(args.iterations):
            since = time.perf_counter()
            made = shm_admin.create(900 + i, 128, str(agent.shm), mode=0o600, owner=str(os.geteuid()))
            pidfile.notify(str(agent.pid_file))
            hand.append(served_after(made.path, since))
            since = time.perf_counter()
            answer = kubelet.allocate([f"vgpu-0-{i % 4}"])
            rpc.append(time.perf_counter() - since)
            allocated.append(served_after(answer.container_responses[0].mounts[0].host_path, since))
        since = time.perf_counter()
        agent.stop()
        kubelet.next_list(lambda d: bool(d) and all(h == "Unhealthy" for _, h in d))
        unhealthy = time.perf_counter() - since
    finally:
        plugin.stop()
        kubelet.stop()
        agent.stop()
        ctl.stop()
        etcd.stop()
        shutil.rmtree(kubelet_dir, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    print(f"k8s_bench on {platform.node()} ({os.cpu_count()} cores), {time.strftime('%Y-%m-%d %H:%M')}, "
          f"{args.iterations} iterations, 128 MiB regions")
    print(f"plugin start to kubelet registration        {registered * 1000:7.1f} ms")
    print(f"Allocate round trip (region made)           {ms(rpc)}")
    print(f"region served, by hand (orion-shm create)   {ms(hand)}")
    print(f"region served, through Allocate             {ms(allocated)}")
    print(f"ratio Allocate / by hand (p50)              {statistics.median(allocated) / statistics.median(hand):7.2f}x")
    print(f"oriond stopped to devices Unhealthy         {unhealthy * 1000:7.1f} ms (poll period 2 s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
