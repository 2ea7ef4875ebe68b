"""Every etcd key the controller reads or writes, spelled here and nowhere else.

The whole state of the pool lives in etcd under one root (default ``/orion/``); controllers keep nothing that
another controller would need. Layout (``<gpu>`` is the GPU's index on its host, four digits; ``<vgpu>`` the
slot on that GPU, three digits, so keys sort in index order):

| key | value (JSON) | bound to |
|---|---|---|
| ``hosts/<host>`` | address, data port, default vgpu_count, registration time | the host's lease |
| ``gpus/<host>/<gpu>`` | uuid, name, memory_mib, vgpu_count | the host's lease |
| ``claims/<host>/<gpu>/<vgpu>`` | allocation id, memory_mib of this vGPU | the allocation's lease |
| ``allocations/<id>`` | host, port, the claimed vGPUs, lease id, confirmed flag | the allocation's lease |
| ``placed/<host>/<id>`` | lease id, confirmed flag (for the host's heartbeat) | the allocation's lease |

A lease that expires (a host that stops heartbeating, a client that vanished) takes its keys with it; that is
the only garbage collection there is. Which keys a transaction compares, and why, is pool.py's business.
Host names and allocation ids never contain ``/`` (validated at the API), so a trailing ``/`` on a prefix
cannot match a longer name.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

DEFAULT_ROOT = "/orion/"

# fullmatch, not match with ``$``: ``$`` also matches before a final newline, and a name ending in one would
# split Orion's plain-text answers and the log lines that name it
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,252}")


def valid_name(name: str) -> bool:
    """A host name or allocation id usable as one key segment (letters, digits, ``. _ : -``; no ``/``)."""
    return _NAME.fullmatch(name) is not None


@dataclass(frozen=True)
class Keys:
    """The key spelling for one root; tests give each case its own root on a shared etcd."""

    root: str = DEFAULT_ROOT

    def __post_init__(self) -> None:
        if not self.root.startswith("/") or not self.root.endswith("/"):
            raise ValueError(f"etcd key root must start and end with '/', got {self.root!r}")

    # hosts and their GPUs (host lease)
    @property
    def hosts_prefix(self) -> str:
        return f"{self.root}hosts/"

    def host(self, host: str) -> str:
        return f"{self.root}hosts/{host}"

    @property
    def gpus_prefix(self) -> str:
        return f"{self.root}gpus/"

    def host_gpus_prefix(self, host: str) -> str:
        return f"{self.root}gpus/{host}/"

    def gpu(self, host: str, index: int) -> str:
        return f"{self.root}gpus/{host}/{index:04d}"

    # claims (allocation lease)
    @property
    def claims_prefix(self) -> str:
        return f"{self.root}claims/"

    def gpu_claims_prefix(self, host: str, index: int) -> str:
        return f"{self.root}claims/{host}/{index:04d}/"

    def claim(self, host: str, index: int, vgpu: int) -> str:
        return f"{self.root}claims/{host}/{index:04d}/{vgpu:03d}"

    def parse_claim(self, key: str) -> tuple[str, int, int]:
        """(host, gpu index, vGPU slot) from a claim key."""
        host, gpu, vgpu = key[len(self.claims_prefix):].split("/")
        return host, int(gpu), int(vgpu)

    def parse_gpu(self, key: str) -> tuple[str, int]:
        """(host, gpu index) from a GPU key."""
        host, gpu = key[len(self.gpus_prefix):].split("/")
        return host, int(gpu)

    # allocations (allocation lease)
    @property
    def allocations_prefix(self) -> str:
        return f"{self.root}allocations/"

    def allocation(self, alloc_id: str) -> str:
        return f"{self.root}allocations/{alloc_id}"

    def host_placed_prefix(self, host: str) -> str:
        return f"{self.root}placed/{host}/"

    def placed(self, host: str, alloc_id: str) -> str:
        return f"{self.root}placed/{host}/{alloc_id}"
