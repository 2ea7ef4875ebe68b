"""oriond's Prometheus metrics (`[server-metrics] metrics_addr`): what its session workers did, served by oriond.

Sessions run in worker processes forked from each region's supervisor, which oriond forks; so the figures are kept
with prometheus_client's multiprocess mode: each process writes its own values into files of one private directory
(PROMETHEUS_MULTIPROC_DIR, which oriond sets before it forks anything), and oriond's HTTP endpoint sums them at each
scrape. A worker that ends is marked dead by its supervisor, so a session gauge counts live sessions only.

- `orion_sessions{region, transport}`: sessions being served: those of this oriond's regions (region: the region
  file's name; transport "region", whether served here or relayed to a GPU host), and those this GPU host serves for
  relaying hosts (region "relayed"; transport "tcp" or "rdma").
- `orion_records_total{path}`: records answered, by who served them: "compiled" (the hot path, counted from its own
  counters each time it hands back to Python) or "python".
- `orion_refusals_total{reason}`: calls refused for a limit of ours: "quota" (CUDA_ERROR_OUT_OF_MEMORY past a
  vGPU's memory quota), "malformed" (a record the wire refused).
- `orion_relay_bytes_total{transport, direction}`: bytes a relay connection carried ("sent", "received"; transport
  "tcp" or "rdma"), at either end (a relaying host's session worker, a GPU host's relayed session), counted each
  second while the session runs and at its end (relay/stream_endpoint.py); on TCP the kernel's count of payload
  bytes acknowledged and received, which includes what compiled code wrote and read.
- `orion_region_faults_total`: regions whose supervisor failed (a truncated or broken region file).
- `orion_session_gpu_memory_bytes{session, gpu}` and `orion_session_gpu_quota_bytes{session, gpu}`: what a session's
  allocations hold on a physical GPU (the quota ledger's count, updated at each allocation and free) and its quota
  there.

Without metrics_addr nothing here is created or counted: each function returns at its first test. Not here: the
controller's metrics (controller/metrics.py), the HTTP server (daemon/oriond.py starts prometheus_client's).
"""
from __future__ import annotations

import os
from typing import Any

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
_metrics: dict[str, Any] | None = None


def enabled() -> bool:
    """Whether this process keeps metrics (oriond set the directory before it forked it)."""
    return bool(os.environ.get(MULTIPROC_ENV))


def _all() -> dict[str, Any] | None:
    """The metrics of this process, made at first use (prometheus_client reads the directory when imported)."""
    global _metrics
    if _metrics is None and enabled():
        from prometheus_client import Counter, Gauge

        _metrics = {
            "sessions": Gauge("orion_sessions", "Sessions being served", ["region", "transport"],
                              multiprocess_mode="livesum"),
            "records": Counter("orion_records", "Records answered, by who served them", ["path"]),
            "refusals": Counter("orion_refusals", "Calls refused for a limit of Orion vGPU's", ["reason"]),
            "relay_bytes": Counter("orion_relay_bytes", "Bytes relay connections carried", ["transport", "direction"]),
            "faults": Counter("orion_region_faults", "Regions whose supervisor failed"),
            "memory": Gauge("orion_session_gpu_memory_bytes", "GPU memory a session's allocations hold, by the "
                            "ledger's count", ["session", "gpu"], multiprocess_mode="livesum"),
            "quota": Gauge("orion_session_gpu_quota_bytes", "A session's vGPU memory quota on a GPU",
                           ["session", "gpu"], multiprocess_mode="livesum"),
        }
    return _metrics


def session_started(region: str, transport: str) -> None:
    metrics = _all()
    if metrics is not None:
        metrics["sessions"].labels(os.path.basename(region), transport or "region").inc()


def records(path: str, count: int = 1) -> None:
    metrics = _all()
    if metrics is not None and count > 0:
        metrics["records"].labels(path).inc(count)


def refused(reason: str) -> None:
    metrics = _all()
    if metrics is not None:
        metrics["refusals"].labels(reason).inc()


def session_memory(session: int, gpu: int, held: int, quota: int | None) -> None:
    """A session's GPU memory on physical GPU `gpu` now, and its quota there (None: none)."""
    metrics = _all()
    if metrics is not None and gpu >= 0:
        labels = (str(session), str(gpu))
        metrics["memory"].labels(*labels).set(held)
        if quota is not None:
            metrics["quota"].labels(*labels).set(quota)


def relay_bytes(transport: str, sent: int, received: int) -> None:
    metrics = _all()
    if metrics is not None:
        if sent > 0:
            metrics["relay_bytes"].labels(transport, "sent").inc(sent)
        if received > 0:
            metrics["relay_bytes"].labels(transport, "received").inc(received)


def region_fault() -> None:
    metrics = _all()
    if metrics is not None:
        metrics["faults"].inc()


def process_ended(pid: int) -> None:
    """A worker `pid` is gone: its live-only values (the session gauge) no longer count."""
    if enabled():
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid)
