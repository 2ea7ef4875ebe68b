"""oriond's /metrics (`[server-metrics] metrics_addr`, issue 31): prometheus_client's exposition, summed over
oriond's processes (host_agent/agent_metrics.py), parses with prometheus_client's own parser, and its figures move
under a workload: a session shows while it is served and is gone once it ends, and its records are counted."""
from __future__ import annotations

import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from ivshmem.channel import ClientChannel
from ivshmem.record import Op
from ivshmem.region import Region
from tests.controller.rig import free_port
from tests.wire.oriond_rig import oriond_over, until

REGION = "orionsock3"


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the exposition, by (name, labels)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def sessions(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float]) -> float:
    return samples.get(("orion_sessions", (("region", REGION), ("transport", "region"))), 0.0)


def python_records(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float]) -> float:
    return samples.get(("orion_records_total", (("path", "python"),)), 0.0)


def test_metrics_parse_and_move_under_a_session(tmp_path: Path) -> None:
    port = free_port()
    sections = f"[server-metrics]\n    metrics_addr = 127.0.0.1:{port}\n"
    with oriond_over({REGION: (16 << 20, 0o600)}, tmp_path / "oriond.out", sections) as (agent, directory):
        agent.wait_served(directory / REGION)
        before = scrape(port)  # (nothing counted yet: no figures at all)
        assert sessions(before) == 0
        with Region.open(directory / REGION) as region, ClientChannel.claim(region, accept_timeout=10) as client:
            for _ in range(50):
                assert client.call(Op.ECHO, b"x").ok
            during = scrape(port)
        assert sessions(during) == 1, during
        assert python_records(during) - python_records(before) >= 50, during
        agent.wait_no_workers()
        until(lambda: sessions(scrape(port)) == 0 or None, "the ended session gone from orion_sessions")
        assert "Prometheus metrics of this oriond on http://127.0.0.1" in agent.log()


MEMORY = r"""
import sys
from prometheus_client import CollectorRegistry, generate_latest, multiprocess
from host_agent.session.vgpu_quota import VgpuQuota
from tests.fake_driver import FakeDriver

driver = FakeDriver(devices=2)
driver.cuInit(0)
quota = VgpuQuota(driver, 5, (1,), (256 << 20,), lambda: 0, meter=lambda _driver: None)
quota.allocated(3 << 20, 0)  # for vGPU 0, which is GPU 1
quota.allocated(1 << 20, 0)
quota.freed(0, 1 << 20)
registry = CollectorRegistry()
multiprocess.MultiProcessCollector(registry)
sys.stdout.write(generate_latest(registry).decode())
"""


def test_a_sessions_gpu_memory_and_quota_follow_its_allocations(tmp_path: Path) -> None:
    """The quota ledger's count of a session's allocations (session 5, vGPU on GPU 1, a 256 MiB quota), as a worker
    with oriond's metrics on reports it."""
    import os
    import subprocess
    import sys

    from tests.processes import REPO, python_path

    env = {"PYTHONPATH": python_path(), "PATH": os.environ["PATH"], "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", MEMORY], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(done.stdout) for s in family.samples}
    labels = (("gpu", "1"), ("session", "5"))
    assert samples[("orion_session_gpu_memory_bytes", labels)] == 3 << 20
    assert samples[("orion_session_gpu_quota_bytes", labels)] == 256 << 20
