"""oriond's /metrics (`[server-metrics] metrics_addr = HOST:PORT`): prometheus_client's HTTP server over the figures
its processes keep (host_agent/agent_metrics.py says which and how).

`start` makes the private directory the processes write into and names it in the environment before oriond forks
anything, then serves the sum of every process's files; `MetricsServer.stop` ends the server and removes the
directory. A port oriond cannot have is one warning, and oriond runs on without /metrics.
"""
from __future__ import annotations

import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from typing import Any

from ..agent_metrics import MULTIPROC_ENV

log = logging.getLogger(__name__)


@dataclass
class MetricsServer:
    directory: str
    server: Any

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        shutil.rmtree(self.directory, ignore_errors=True)
        os.environ.pop(MULTIPROC_ENV, None)


def start(address: str) -> MetricsServer | None:
    """Serve /metrics at `address` (HOST:PORT); None (one warning) where it cannot be served."""
    if not address:
        return None
    host, _, port = address.rpartition(":")
    directory = tempfile.mkdtemp(prefix="orion-metrics-")  # 0700: oriond's processes only
    os.environ[MULTIPROC_ENV] = directory  # before prometheus_client is imported and before anything is forked
    from prometheus_client import CollectorRegistry, multiprocess, start_http_server

    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    try:
        server, _thread = start_http_server(int(port), addr=host.strip("[]"), registry=registry)
    except OSError as exc:
        log.warning("not serving /metrics on %s (%s); set [server-metrics] metrics_addr to a free HOST:PORT",
                    address, exc.strerror or exc)
        shutil.rmtree(directory, ignore_errors=True)
        os.environ.pop(MULTIPROC_ENV, None)
        return None
    log.info("Prometheus metrics of this oriond on http://%s/metrics", address)
    return MetricsServer(directory, server)
