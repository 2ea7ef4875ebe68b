#!/usr/bin/env python3
"""Controller benchmark: allocate+release latency and concurrent-request throughput on a real etcd. Not a test.

Everything runs on loopback in one go, with its baselines measured in the same run:
* floors: one etcd put (the cheapest durable write) and one HTTP round trip to the controller that does not
  touch etcd (``/api/v1/info``);
* allocate+release through GpuPool in this process, on the same pool (a plan on the watch-fed copy of the pool
  overlapped with the lease grant, then the claim transaction; then the lease revoke, the lease id taken from
  the copy): the controller's cost sans HTTP, and how many claims lost their transaction and were retried;
* allocate+release through the JSON API of a controller process, with a kept-alive connection: what a
  client sees (aim: p99 <= 10 ms), and the CPU time the controller and etcd spent per pair (on a 2-core machine
  that, more than the round trips, is what the latency depends on, and it is far less noisy);
* the concurrent run: two controller processes on one etcd, 500 requests for one vGPU each from 48 client
  threads alternating between them, on a pool big enough for all; throughput, latency under load, and how
  many claim transactions lost a race and were retried.
No result check (bench/verify.py): it times control-plane calls that move no data.

Run: ``.venv/bin/python bench/controller_bench.py [--iterations N]``. Needs /usr/bin/etcd.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from controller.keys import Keys  # noqa: E402
from controller.pool import GpuPool, GpuSpec  # noqa: E402
from controller.store import EtcdStore  # noqa: E402
from ivshmem.shared.controller_client import ControllerClient  # noqa: E402
from tests.controller.rig import ControllerProcess, EtcdServer, call, etcd_binary, member_client  # noqa: E402

CONCURRENT_REQUESTS = 500
HOSTS, GPUS_PER_HOST = 16, 8  # 512 vGPUs: every concurrent request can be met
CLIENT_THREADS = 48


def percentiles(samples_s: list[float]) -> str:
    ms = sorted(s * 1000 for s in samples_s)
    p99 = ms[min(len(ms) - 1, int(len(ms) * 0.99))]
    return f"p50 {statistics.median(ms):6.2f} ms   p99 {p99:6.2f} ms   (n={len(ms)})"


WARMUP = 50


def timed(n: int, fn: Callable[[int], object], warmup: int = WARMUP) -> list[float]:
    for i in range(warmup):
        fn(i)
    out = []
    for i in range(n):
        t = time.perf_counter()
        fn(i)
        out.append(time.perf_counter() - t)
    return out


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine() -> str:
    etcd_version = subprocess.run(["etcd", "--version"], capture_output=True, text=True).stdout.split("\n")[0]
    return (f"{platform.node()}: {os.cpu_count()} CPUs, Linux {platform.release()}, Python "
            f"{platform.python_version()}, {etcd_version}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iterations", type=int, default=1000)
    args = parser.parse_args()
    if etcd_binary() is None:
        print("controller_bench: etcd is not installed (apt-get install etcd-server)", file=sys.stderr)
        return 1
    n = args.iterations
    print(machine())
    print(f"pool: {HOSTS} hosts x {GPUS_PER_HOST} GPUs x 4 vGPUs; each request is 1 vGPU of 1000 MiB")
    with tempfile.TemporaryDirectory(prefix="orion-bench-") as tmp:
        etcd = EtcdServer(etcd_binary() or "etcd", Path(tmp) / "etcd")
        etcd.start()
        started: list[ControllerProcess] = []
        try:
            store = EtcdStore(etcd.url, 5.0)
            raw = store._client  # the floor is pyetcd itself, without our wrapper
            print(f"floor  etcd put                          {percentiles(timed(n, lambda i: raw.put('/b/k', 'v')))}")

            pool = GpuPool(store, Keys("/bench-pool/"), lease_ttl_s=10, host_ttl_s=600)
            for h in range(HOSTS):
                pool.register_host(f"host-{h}", "127.0.0.1", 9960, 4,
                                   [GpuSpec(g, f"GPU-{h}-{g}", "V100", 16160) for g in range(GPUS_PER_HOST)])
            alloc_t: list[float] = []
            release_t: list[float] = []

            def pool_pair(_: int) -> None:
                t0 = time.perf_counter()
                alloc = pool.allocate(1, 1000)
                t1 = time.perf_counter()
                pool.release(alloc.id)
                alloc_t.append(t1 - t0)
                release_t.append(time.perf_counter() - t1)

            pairs = timed(n, pool_pair)
            print(f"pool   allocate+release (no HTTP)        {percentiles(pairs)}")
            print(f"         allocate                        {percentiles(alloc_t[-n:])}")
            print(f"         release                         {percentiles(release_t[-n:])}")
            print(f"         claims retried                  {pool.conflicts}")

            a = ControllerProcess(etcd.url, "/bench-http/", Path(tmp) / "a.log")
            b = ControllerProcess(etcd.url, "/bench-http/", Path(tmp) / "b.log")
            started += [a.start(), b.start()]
            client = ControllerClient(a.address)
            print(f"floor  HTTP GET /api/v1/info             {percentiles(timed(n, lambda i: client.info()))}")
            for h in range(HOSTS):  # each host registers itself, signed as the member it is (docs/security.md)
                with member_client(a.address, f"host-{h}") as member:
                    member.register_host(f"host-{h}", [{"uuid": f"GPU-{h}-{g}", "name": "V100", "memory_mib": 16160}
                                                       for g in range(GPUS_PER_HOST)], ttl_s=600)

            def http_pair(_: int) -> None:
                client.release(client.allocate(1, 1000)["id"])

            assert a.proc is not None and etcd.proc is not None
            pids = (a.proc.pid, etcd.proc.pid)
            cpu_before = [cpu_s(p) for p in pids]
            print(f"http   allocate+release (one client)     {percentiles(timed(n, http_pair))}")
            ctl_ms, etcd_ms = ((cpu_s(p) - c) * 1000 / (n + WARMUP) for p, c in zip(pids, cpu_before, strict=True))
            print(f"         CPU per pair                    controller {ctl_ms:.2f} ms, etcd {etcd_ms:.2f} ms")

            local = threading.local()
            latencies: list[float] = []

            def request(i: int) -> str:
                clients = getattr(local, "clients", None)
                if clients is None:
                    clients = local.clients = (ControllerClient(a.address, 30), ControllerClient(b.address, 30))
                t = time.perf_counter()
                alloc = clients[i % 2].allocate(1, 1000, ttl_s=60)
                latencies.append(time.perf_counter() - t)
                return str(alloc["id"])

            before = sum(conflicts(c) for c in (a, b))
            t0 = time.perf_counter()
            with ThreadPoolExecutor(CLIENT_THREADS) as ex:
                ids = list(ex.map(request, range(CONCURRENT_REQUESTS)))
            wall = time.perf_counter() - t0
            retried = sum(conflicts(c) for c in (a, b)) - before
            print(f"concurrent {CONCURRENT_REQUESTS} allocations, 2 controllers, {CLIENT_THREADS} threads: "
                  f"{wall:.2f} s, {CONCURRENT_REQUESTS / wall:.0f} allocations/s, {retried} claims retried")
            print(f"         latency under load              {percentiles(latencies)}")
            assert len(set(ids)) == CONCURRENT_REQUESTS
            t0 = time.perf_counter()
            with ThreadPoolExecutor(CLIENT_THREADS) as ex:
                list(ex.map(lambda i: ControllerClient((a, b)[i % 2].address).release(ids[i]),
                            range(len(ids))))
            wall = time.perf_counter() - t0
            print(f"concurrent {len(ids)} releases: {wall:.2f} s, {len(ids) / wall:.0f} releases/s")
            store.close()
        finally:
            for c in started:
                c.stop()
            etcd.stop()
    return 0


def conflicts(ctl: ControllerProcess) -> int:
    text = call(ctl, "GET", "/metrics")[1]
    return int(float(next(line.split()[1] for line in text.splitlines()
                          if line.startswith("orion_controller_claim_conflicts_total"))))


if __name__ == "__main__":
    sys.exit(main())
