"""Prometheus metrics for ``GET /metrics``, with prometheus_client.

Two kinds, kept apart on purpose:

* pool gauges (vGPUs total/free per host and GPU, GPU memory, live allocations, hosts) are read from etcd at
  scrape time, so every controller on one etcd reports the same numbers and none can drift; if etcd does not
  answer they are left out (``orion_controller_etcd_up`` is 0) rather than reported wrong;
* counters (requests by route and status, allocation outcomes, errors) belong to this process and reset when
  it restarts, as Prometheus counters do.
"""
from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, disable_created_metrics, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from controller.errors import EtcdUnavailable
from controller.pool import GpuPool

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class PoolCollector(Collector):
    """Gauges computed from one etcd read of the pool."""

    def __init__(self, pool: GpuPool) -> None:
        self.pool = pool

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        conflicts = CounterMetricFamily("orion_controller_claim_conflicts",
                                        "claim transactions of this controller that failed (a race, or a stale "
                                        "pool copy) and were retried")
        conflicts.add_metric([], self.pool.conflicts)
        yield conflicts
        up = GaugeMetricFamily("orion_controller_etcd_up", "1 if etcd answered this scrape, else 0")
        try:
            view = self.pool.view()
            allocations = len(self.pool.allocations())
        except EtcdUnavailable:
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        labels = ["host", "gpu", "uuid"]
        total = GaugeMetricFamily("orion_controller_vgpus_total", "vGPUs carved from each GPU", labels=labels)
        free = GaugeMetricFamily("orion_controller_vgpus_free", "vGPUs of each GPU not claimed", labels=labels)
        mem = GaugeMetricFamily("orion_controller_gpu_memory_mib", "memory of each GPU, MiB", labels=labels)
        mem_free = GaugeMetricFamily("orion_controller_gpu_memory_free_mib", "memory of each GPU not claimed, MiB",
                                     labels=labels)
        for host in view.hosts:
            for g in host.gpus:
                lv = [host.host.name, str(g.gpu.index), g.gpu.uuid]
                total.add_metric(lv, g.gpu.vgpu_count)
                free.add_metric(lv, len(g.free_slots))
                mem.add_metric(lv, g.gpu.memory_mib)
                mem_free.add_metric(lv, g.free_memory_mib)
        yield from (total, free, mem, mem_free)
        hosts = GaugeMetricFamily("orion_controller_hosts", "registered GPU hosts")
        hosts.add_metric([], len(view.hosts))
        yield hosts
        allocs = GaugeMetricFamily("orion_controller_allocations", "live allocations (all controllers)")
        allocs.add_metric([], allocations)
        yield allocs


class Metrics:
    """This controller's registry: the pool collector plus its own counters."""

    def __init__(self, pool: GpuPool) -> None:
        disable_created_metrics()  # the *_created series only double the exposition
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(PoolCollector(pool))
        self.requests = Counter("orion_controller_requests", "HTTP requests served by this controller",
                                ["route", "method", "status"], registry=self.registry)
        self.allocation_requests = Counter("orion_controller_allocation_requests",
                                           "allocation requests by outcome (granted, or the error code)",
                                           ["result"], registry=self.registry)
        self.releases = Counter("orion_controller_releases", "allocations released explicitly",
                                registry=self.registry)
        self.errors = Counter("orion_controller_errors", "requests answered with an error, by error code",
                              ["code"], registry=self.registry)

    def render(self) -> bytes:
        """The exposition text; reads etcd, so call it off the event loop."""
        return generate_latest(self.registry)
