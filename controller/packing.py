"""Where a request for N vGPUs of M MiB goes: pure placement over a PoolView, no etcd.

Rules (docs/controller.md repeats them for users):

* All N vGPUs come from one host (Orion's rule: a request is served by one server), the named one if the
  request names it (a guest whose channel is that host's region can use no other).
* A GPU can take another vGPU while it has a free slot (it is carved into ``vgpu_count``) and the memory its
  live claims leave is at least M. Without M, a vGPU on a GPU gets that GPU's memory / vgpu_count (Orion's
  default ORION_GMEM).
* On the host, the vGPUs are packed onto as few GPUs as memory allows: two 7,500 MiB vGPUs share one 16 GB
  card, two 15,500 MiB vGPUs take two. Among placements with that fewest number of GPUs, busier GPUs are filled
  first (best fit), so whole GPUs stay free for large requests.
* Among hosts that can serve it: the one needing fewest GPUs, then the one with fewest free vGPUs (filling a
  host before starting another).
* Exact ties (equally busy GPUs or hosts) are broken by index and name, or, given a ``salt``, by a hash of
  salt and name: each controller process has its own salt, so two controllers facing an empty pool start
  filling different GPUs instead of racing for GPU 0 of the first host. Packing quality is the same either
  way; only which of several equal choices is made differs.

A request that no host can serve raises Unsatisfiable with the limit that was hit. Nothing here knows about
concurrency: pool.py makes the placement a transaction that fails if the GPUs it read have changed.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass, replace

from controller.errors import Unsatisfiable
from controller.model import GpuUsage, HostUsage, PoolView


@dataclass(frozen=True)
class Slot:
    """One vGPU slot chosen for a request."""

    gpu: GpuUsage
    vgpu: int
    memory_mib: int


@dataclass(frozen=True)
class Placement:
    host: HostUsage
    slots: tuple[Slot, ...]

    @property
    def gpu_count(self) -> int:
        return len({s.gpu.gpu.index for s in self.slots})


def vgpu_memory(gpu: GpuUsage, memory_mib: int | None) -> int:
    return memory_mib if memory_mib is not None else gpu.gpu.default_vgpu_memory_mib


def _fits_idle(gpu: GpuUsage, memory_mib: int | None) -> int:
    """How many vGPUs of this size the GPU could take with nothing claimed."""
    m = vgpu_memory(gpu, memory_mib)
    return min(gpu.gpu.vgpu_count, gpu.gpu.memory_mib // m) if m > 0 else 0


def _tiebreak(salt: str, name: str | int) -> int | str:
    return zlib.crc32(f"{salt}/{name}".encode()) if salt else name


def place_on_host(host: HostUsage, count: int, memory_mib: int | None, salt: str = "") -> Placement | None:
    """The fewest-GPU, best-fit placement of ``count`` vGPUs on this host, or None if it cannot take them."""
    room = {g.gpu.index: g.fits(vgpu_memory(g, memory_mib)) for g in host.gpus}
    candidates = [g for g in host.gpus if room[g.gpu.index] > 0]
    if sum(room[g.gpu.index] for g in candidates) < count:
        return None
    # fewest GPUs: take the roomiest until the count is covered
    by_room = sorted((room[g.gpu.index] for g in candidates), reverse=True)
    needed_gpus, covered = 0, 0
    while covered < count:
        covered += by_room[needed_gpus]
        needed_gpus += 1
    slots: list[Slot] = []
    remaining, gpus_left = count, needed_gpus
    while remaining > 0:
        # best fit: the tightest GPU that still lets the other (gpus_left - 1) GPUs cover the rest
        ordered = sorted(candidates, key=lambda g: (room[g.gpu.index], g.free_memory_mib,
                                                    _tiebreak(salt, g.gpu.index), g.gpu.index))
        for g in ordered:
            others = sorted((room[o.gpu.index] for o in candidates if o is not g), reverse=True)
            take = min(room[g.gpu.index], remaining)
            if take + sum(others[:gpus_left - 1]) >= remaining:
                break
        m = vgpu_memory(g, memory_mib)
        slots.extend(Slot(g, v, m) for v in g.free_slots[:take])
        remaining -= take
        gpus_left -= 1
        candidates.remove(g)
    return Placement(host, tuple(slots))


def place(pool: PoolView, count: int, memory_mib: int | None, salt: str = "", only_host: str = "") -> Placement:
    """Where ``count`` vGPUs of ``memory_mib`` MiB (None: each GPU's default) go, on ``only_host`` if named;
    Unsatisfiable says why not."""
    if only_host:
        hosts = [h for h in pool.hosts if h.host.name == only_host]
        if not hosts:
            raise Unsatisfiable("host_unknown", f"host {only_host} is not in the pool: its oriond is not running, "
                                                f"has no GPU, or reports to another controller (controller_addr)")
        pool = replace(pool, hosts=tuple(hosts))
    options = [p for p in (place_on_host(h, count, memory_mib, salt) for h in pool.hosts) if p is not None]
    if options:
        return min(options, key=lambda p: (p.gpu_count, p.host.vgpus_free, _tiebreak(salt, p.host.host.name),
                                           p.host.host.name))
    raise _why_not(pool, count, memory_mib)


def _why_not(pool: PoolView, count: int, memory_mib: int | None) -> Unsatisfiable:
    size = f"{memory_mib} MiB" if memory_mib is not None else "the default size"
    hosts = [h for h in pool.hosts if h.gpus]
    if not hosts:
        return Unsatisfiable("no_hosts", "no GPU host is registered with the controller: start oriond on a GPU "
                                         "host with controller_addr pointing here")
    if memory_mib is not None:
        largest = max((g for h in hosts for g in h.gpus), key=lambda g: g.gpu.memory_mib)
        if largest.gpu.memory_mib < memory_mib:
            return Unsatisfiable("memory_too_large",
                                 f"ORION_GMEM={memory_mib} MiB is more than any registered GPU has (largest: "
                                 f"{largest.gpu.memory_mib} MiB on host {largest.gpu.host}); ask for less memory")
    idle = max(hosts, key=lambda h: (sum(_fits_idle(g, memory_mib) for g in h.gpus), h.host.name))
    idle_fit = sum(_fits_idle(g, memory_mib) for g in idle.gpus)
    if idle_fit < count:
        return Unsatisfiable("too_many_vgpus",
                             f"no host can hold {count} vGPUs of {size} even when idle (most: {idle_fit} on host "
                             f"{idle.host.name}; a request is served by one host); ask for fewer or smaller vGPUs")
    best = max(hosts, key=lambda h: (sum(g.fits(vgpu_memory(g, memory_mib)) for g in h.gpus), h.host.name))
    best_fit = sum(g.fits(vgpu_memory(g, memory_mib)) for g in best.gpus)
    return Unsatisfiable("pool_exhausted",
                         f"no host has {count} free vGPUs of {size} right now (most: {best_fit} on host "
                         f"{best.host.name}); retry after other clients release theirs, or ask for fewer")
