"""`orion-smi`: the pool's vGPUs as the Orion Controller sees them, in the shape of Orion's orion-smi.

Orion's tool (shipped with its client runtime, known from a screenshot in Orion's PyTorch blog post) prints an
nvidia-smi-like table: two rows per vGPU (host IP, then pGPU, vGPU, physical GPU name and Memory-Usage), then a
process table. Ours reads the controller's JSON API, so it
shows what the controller knows: every vGPU of every live host, and for each its reserved memory out of its
share (a claimed vGPU: the allocation's memory; a free one: 0 of the default share, GPU memory / vgpu_count).
The controller does not see processes, so the lower table lists allocations (id and client) where Orion's
listed PIDs; an allocation whose session is relayed from another host (docs/remote.md) gets a line under its
first vGPU: "relayed from IP:PORT (transport)". Live per-process memory use is not reported (`N/A` columns stay
`N/A`, as in Orion's).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

from controller.cluster_key import ClusterKeyError
from ivshmem.shared.controller_client import ControllerClient, ControllerClientError
from ivshmem.shared.ini import normal_address
from ivshmem.shared.version import version_line

from ..daemon.config import DEFAULT_PATH, ServerConfig
from ..daemon.controller_link import Member, load_member
from ..errors import ConfigurationError
from ..server_conf import ConfigError

TIMEOUT_S = 5.0
DEFAULT_PORT = 9123
CELLS = (49, 22, 22)  # the widths between Orion's '|' separators
WIDTH = sum(CELLS) + len(CELLS) + 1


def _row(*cells: str) -> str:
    return "|" + "|".join(c[:w].ljust(w) for c, w in zip(cells, CELLS, strict=True)) + "|"


def _line(text: str) -> str:
    return "| " + text[:WIDTH - 4].ljust(WIDTH - 4) + " |"


def relayed(alloc: dict[str, Any]) -> str:
    """"relayed from IP:PORT (tcp)" for an allocation whose session another host's oriond relayed to its GPU
    host (the confirm said so: docs/remote.md), "" for a local one."""
    extra = alloc.get("extra") or {}
    relay = str(extra.get("relay") or "") if isinstance(extra, dict) else ""
    if not relay:
        return ""
    transport = str(extra.get("transport") or "")
    return f"relayed from {relay}{f' ({transport})' if transport else ''}"


def render(pool: dict[str, Any], allocations: list[dict[str, Any]], now: float) -> str:
    """The table for one pool snapshot (``GET /api/v1/pool``) and its allocations (``GET /api/v1/allocations``)."""
    claimed: dict[tuple[str, int, int], tuple[dict[str, Any], int]] = {}
    for alloc in allocations:
        for v in alloc.get("vgpus", []):
            claimed[(alloc["host"], int(v["gpu"]), int(v["vgpu"]))] = (alloc, int(v["memory_mib"]))
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now))
    out = [_line(f"ORION-SMI 1.0            Time: {stamp}          CUDA Version: N/A"),
           _row(" IP                vGPU Name        Persistence-M", " Bus-Id        Disp.A ",
                " Volatile Uncorr. ECC "),
           _row(" pGPU  vGPU        Physical GPU Name", "         Memory-Usage ",
                " GPU-Util  Compute M. "),
           "|" + "+".join("=" * w for w in CELLS) + "|"]
    for host in pool.get("hosts", []):
        for gpu in host.get("gpus", []):
            share = int(gpu["memory_mib"]) // max(1, int(gpu["vgpu_count"]))
            for slot in range(int(gpu["vgpu_count"])):
                hit = claimed.get((host["host"], int(gpu["index"]), slot))
                reserved, quota = (hit[1], hit[1]) if hit else (0, share)
                out.append(_row(f" {host['address']:<17} {'Orion vGPU':<26}Off ", "  N/A             Off ",
                                f"{'N/A':>21} "))
                out.append(_row(f"  {gpu['index']:<5} {slot:<10} {gpu['name']}",
                                f" {reserved:>5}MiB / {quota:>5}MiB  ", "   N/A        Default "))
                out.append("+" + "+".join("-" * w for w in CELLS) + "+")
    if not pool.get("hosts"):
        out.append(_line("No GPU host is registered with the Orion Controller."))
    out.append(_line(f"vGPUs: {pool.get('vgpus_total', 0)} total, {pool.get('vgpus_free', 0)} free"))
    out.append("")
    out.append(_line(f"{'Allocations:':<70}{'vGPU Memory':>20}"))
    out.append(_line(f"{'IP':<16}{'pGPU':>4}  {'vGPU':>4}   {'Allocation ID':<37} {'Client':<16}{'Usage':>8}"))
    said: set[str] = set()
    for (_host, gpu_index, slot), (alloc, mib) in sorted(claimed.items()):
        client = str(alloc.get("client") or "-")
        out.append(_line(f"{alloc['address']:<16}{gpu_index:>4}  {slot:>4}   {alloc['id']:<37} {client[:16]:<16}"
                         f"{mib:>5}MiB"))
        remote = relayed(alloc)
        if remote and alloc["id"] not in said:  # once, under the allocation's first vGPU
            said.add(alloc["id"])
            out.append(_line(f"{'':<29}{remote}"))
    if not claimed:
        out.append(_line("No allocation."))
    return "\n".join(out)


class AddressError(ConfigurationError, ValueError):
    """A controller address that is not HOST:PORT; the message names where it came from."""


def _address(explicit: str | None, config_path: str) -> str:
    """--controller, else ORION_CONTROLLER, else server.conf's controller_addr, else Orion's default; checked
    here, so that a bad one is one line naming where it came from."""
    if explicit:
        return checked_address(explicit, "--controller")
    if os.environ.get("ORION_CONTROLLER"):
        where = "ORION_CONTROLLER"
    else:
        where = f"controller_addr in {config_path}"
    return checked_address(ServerConfig.load(config_path).controller_addr, where)


def _member(key_file: str | None, config_path: str) -> Member | None:
    """How orion-smi signs its read of the allocations (a member-only list: docs/security.md): with the cluster key,
    as this host's oriond does; None, with one line on stderr, when the key cannot be used (the pool is shown,
    its allocations are not)."""
    config = ServerConfig.load(config_path)
    try:
        return load_member(key_file or config.cluster_key_file, config.bind_addr or "orion-smi")
    except ClusterKeyError as exc:
        print(f"orion-smi: allocations not shown: {exc}", file=sys.stderr)
        return None


def checked_address(text: str, where: str) -> str:
    """`text` as HOST:PORT by the rule every Orion program reads a controller address with (ivshmem.shared.ini's
    host_port: an http:// in front allowed, the port required, 1-65535); AddressError naming `where` otherwise."""
    try:
        return normal_address(text)
    except ValueError as exc:
        raise AddressError(f"{where} is '{text}': {exc}; give HOST:PORT, e.g. 127.0.0.1:9123") from None


class _Parser(argparse.ArgumentParser):
    """A bad option is one line and exit 2, not a usage dump."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"{self.prog}: {message}; see '{self.prog} -h'\n")
        sys.exit(2)


def main(argv: list[str] | None = None) -> int:
    parser = _Parser(prog="orion-smi", description="Show the vGPUs of the Orion Controller's pool")
    parser.add_argument("--version", action="version", version=version_line("orion-smi"))
    parser.add_argument("--controller", metavar="HOST:PORT",
                        help="the controller (default: ORION_CONTROLLER, else controller_addr of --config)")
    parser.add_argument("--config", default=os.environ.get("ORION_SERVER_CONF", DEFAULT_PATH),
                        help="server configuration to read controller_addr from (default %(default)s)")
    parser.add_argument("--key-file", help="the cluster key, to list the allocations (default: key_file of "
                                           "--config's [cluster], else /etc/orion/cluster.key)")
    args = parser.parse_args(argv)
    try:
        address = _address(args.controller, args.config)
        member = _member(args.key_file, args.config)
        with ControllerClient(address, timeout_s=TIMEOUT_S, signer=member) as client:
            pool = client.pool()
            allocations = client.allocations() if member is not None else []
    except (ConfigError, ValueError) as exc:
        print(f"orion-smi: {exc}", file=sys.stderr)
        return 2
    except ControllerClientError as exc:
        print(f"orion-smi: {exc.reason}", file=sys.stderr)
        return 1
    print(render(pool, allocations, time.time()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
