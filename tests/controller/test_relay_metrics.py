"""A relayed session in oriond's /metrics and logs (issue 31), at both ends: the relaying oriond's /metrics counts
the bytes its relay connection carried; the GPU host counts the session it serves for the relaying host in
orion_sessions (region "relayed", its transport) while it runs and not after, the bytes its end carried, and gives
it a session log beside server.log. The GPU host is fake_gpu_agent.py (oriond's listener, workers and executor over
the stand-in driver), whose figures are read from the multiprocess directory as oriond's endpoint reads them."""
from __future__ import annotations

import os
import urllib.request
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest, multiprocess
from prometheus_client.parser import text_string_to_metric_families

from tests.controller.rig import free_port
from tests.forwarding_rig import Guest
from tests.guest.rdma_guest import Hosts
from tests.wire.oriond_rig import until

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
COPY = 4 << 20


def parse(text: str) -> Samples:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def relay_scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        return parse(answer.read().decode())


def gpu_host_figures(directory: Path) -> Samples:
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=str(directory))
    return parse(generate_latest(registry).decode())


def relay_bytes(samples: Samples, direction: str) -> float:
    return samples.get(("orion_relay_bytes_total", (("direction", direction), ("transport", "tcp"))), 0.0)


def relayed_sessions(samples: Samples) -> float:
    return samples.get(("orion_sessions", (("region", "relayed"), ("transport", "tcp"))), 0.0)


def test_a_relayed_session_is_counted_and_logged_at_both_ends(tmp_path: Path) -> None:
    port, figures, logs = free_port(), tmp_path / "gpu-metrics", tmp_path / "gpu-log"
    figures.mkdir()
    hosts = Hosts(tmp_path / "hosts", "any", relay_sections=f"[server-metrics]\n    metrics_addr = 127.0.0.1:{port}\n",
                  gpu_args=("--log-dir", str(logs)), gpu_env={"PROMETHEUS_MULTIPROC_DIR": str(figures)})
    try:
        guest = Guest(str(hosts.relay_region))
        try:
            guest.setup()
            pointer = guest.alloc(COPY)
            data = os.urandom(COPY)
            assert guest.htod(pointer, data) == 0 and guest.dtoh(pointer, COPY) == (0, data)
            # Counted each second while the session runs: the copy both ways, and a little more (records, beats).
            until(lambda: relay_bytes(relay_scrape(port), "sent") > COPY or None, "the relay's sent bytes counted",
                  detail=lambda: str(relay_scrape(port)))
            relayed = relay_scrape(port)
            assert relay_bytes(relayed, "received") > COPY, relayed
            served = until(lambda: (lambda s: s if relay_bytes(s, "received") > COPY else None)(
                gpu_host_figures(figures)), "the GPU host's received bytes counted")
            assert relayed_sessions(served) == 1 and relay_bytes(served, "sent") > COPY, served
            assert relay_bytes(served, "sent") < 2 * COPY and relay_bytes(relayed, "sent") < 2 * COPY  # not doubled
        finally:
            guest.close()
        until(lambda: relayed_sessions(gpu_host_figures(figures)) == 0 or None, "the ended session uncounted",
              detail=lambda: str(gpu_host_figures(figures)))
    finally:
        hosts.stop()
    (session_log,) = (logs / "session").glob("*-relay-1.log")
    assert "relayed over tcp" in session_log.read_text(), session_log.read_text()
    assert "relayed over tcp" in (logs / "server.log").read_text()
