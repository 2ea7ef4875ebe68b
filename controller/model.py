"""The pool's records as frozen dataclasses, and their JSON form in etcd.

These are plain values: no etcd, no HTTP. ``from_json`` is lenient about extra fields (a newer controller may
add some) and strict about missing ones (a record we cannot read is a bug, not a free GPU).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any


def dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), sort_keys=True)


@dataclass(frozen=True)
class Host:
    """A registered GPU host: where clients reach its oriond, and the lease its registration lives under."""

    name: str
    address: str
    port: int
    vgpu_count: int
    lease: int
    registered_at: float

    def to_json(self) -> str:
        return dumps(asdict(self))

    @classmethod
    def from_json(cls, raw: bytes | str) -> Host:
        d = json.loads(raw)
        return cls(name=d["name"], address=d["address"], port=int(d["port"]), vgpu_count=int(d["vgpu_count"]),
                   lease=int(d["lease"]), registered_at=float(d["registered_at"]))


@dataclass(frozen=True)
class Gpu:
    """One physical GPU of a host, carved into ``vgpu_count`` vGPUs that share its ``memory_mib``."""

    host: str
    index: int
    uuid: str
    name: str
    memory_mib: int
    vgpu_count: int

    def to_json(self) -> str:
        return dumps(asdict(self))

    @classmethod
    def from_json(cls, raw: bytes | str) -> Gpu:
        d = json.loads(raw)
        return cls(host=d["host"], index=int(d["index"]), uuid=d["uuid"], name=d["name"],
                   memory_mib=int(d["memory_mib"]), vgpu_count=int(d["vgpu_count"]))

    @property
    def default_vgpu_memory_mib(self) -> int:
        """Orion's default ORION_GMEM: the GPU's memory divided by its vgpu_count."""
        return self.memory_mib // self.vgpu_count


@dataclass(frozen=True)
class Claim:
    """One vGPU slot held by an allocation, with the memory it takes from its GPU."""

    host: str
    gpu: int
    vgpu: int
    alloc_id: str
    memory_mib: int

    def value_json(self) -> str:
        return dumps({"alloc_id": self.alloc_id, "memory_mib": self.memory_mib})


@dataclass(frozen=True)
class VgpuGrant:
    """One vGPU handed to a client: which GPU, which slot, how much memory."""

    gpu: int
    vgpu: int
    uuid: str
    memory_mib: int


@dataclass(frozen=True)
class Allocation:
    """N vGPUs on one host, held under one lease until released or expired.

    ``origin`` is the host the allocation was asked from or for (the request's ``origin``, else its ``host``; ""
    when it named neither): only a session of that host (local there, or relayed by that member) may take it up.
    ``bound_to`` is the one session that took it up (``host``, ``session``, ``relay_member``), {} until then:
    one grant backs exactly one session (docs/security.md)."""

    id: str
    host: str
    address: str
    port: int
    vgpus: tuple[VgpuGrant, ...]
    lease: int
    ttl_s: int
    created_at: float
    client: str = ""
    group_id: str = ""
    confirmed: bool = False
    extra: dict[str, str] = field(default_factory=dict)
    origin: str = ""
    bound_to: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["vgpus"] = [asdict(v) for v in self.vgpus]
        return d

    def to_json(self) -> str:
        return dumps(self.to_dict())

    @classmethod
    def from_json(cls, raw: bytes | str) -> Allocation:
        d = json.loads(raw)
        return cls(id=d["id"], host=d["host"], address=d["address"], port=int(d["port"]),
                   vgpus=tuple(VgpuGrant(int(v["gpu"]), int(v["vgpu"]), v["uuid"], int(v["memory_mib"]))
                               for v in d["vgpus"]),
                   lease=int(d["lease"]), ttl_s=int(d["ttl_s"]), created_at=float(d["created_at"]),
                   client=d.get("client", ""), group_id=d.get("group_id", ""),
                   confirmed=bool(d.get("confirmed", False)), extra=dict(d.get("extra", {})),
                   origin=d.get("origin", ""), bound_to=dict(d.get("bound_to", {})))

    def orion_resource(self) -> str:
        """Orion's ``/service`` answer: ``<alloc-id>,<ip>:<port>/<pgpu>/<vgpu>[,...]``."""
        return ",".join([self.id, *(f"{self.address}:{self.port}/{v.gpu}/{v.vgpu}" for v in self.vgpus)])


@dataclass(frozen=True)
class GpuUsage:
    """A GPU with what its live claims take from it (derived, never stored)."""

    gpu: Gpu
    used_slots: frozenset[int]
    used_memory_mib: int

    @property
    def free_slots(self) -> list[int]:
        return [s for s in range(self.gpu.vgpu_count) if s not in self.used_slots]

    @property
    def free_memory_mib(self) -> int:
        return max(0, self.gpu.memory_mib - self.used_memory_mib)

    def fits(self, memory_mib: int) -> int:
        """How many more vGPUs of ``memory_mib`` this GPU can take (slots and memory both)."""
        if memory_mib <= 0:
            return 0
        return min(len(self.free_slots), self.free_memory_mib // memory_mib)


@dataclass(frozen=True)
class HostUsage:
    host: Host
    gpus: tuple[GpuUsage, ...]

    @property
    def vgpus_total(self) -> int:
        return sum(g.gpu.vgpu_count for g in self.gpus)

    @property
    def vgpus_free(self) -> int:
        return sum(len(g.free_slots) for g in self.gpus)


@dataclass(frozen=True)
class PoolView:
    """The pool as read at one etcd revision: hosts, their GPUs and what is claimed."""

    revision: int
    hosts: tuple[HostUsage, ...]
    # mod revision of each host and GPU key as read, so a claim can insist they did not change
    host_mod: dict[str, int]
    gpu_mod: dict[tuple[str, int], int]

    @property
    def vgpus_total(self) -> int:
        return sum(h.vgpus_total for h in self.hosts)

    @property
    def vgpus_free(self) -> int:
        return sum(h.vgpus_free for h in self.hosts)

    def host(self, name: str) -> HostUsage | None:
        return next((h for h in self.hosts if h.host.name == name), None)
