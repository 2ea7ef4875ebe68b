"""Which transport a relay connection uses, RDMA or TCP, and why (docs/remote.md, "Transports").

Both ends decide it during the handshake, each for itself and then together: an end offers RDMA only when its
enable_rdma is on and an RDMA device carries the address its end of the TCP connection uses (ibverbs_device
names the device, or any one that has that address). The relay's RELAY_HELLO carries its offer (empty: TCP); the
GPU host answers RELAY_ACCEPT with "rdma" and its own offer only when it can too, else with "tcp" and the reason.
Each end then says in its log which transport the session uses and, for TCP, why RDMA was not used.
"""
from __future__ import annotations

import logging
import socket
from dataclasses import dataclass
from pathlib import Path

from .rdma_stream import SYSFS, RdmaLink, RdmaStream, RdmaUnavailable, device_names, find_port

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RdmaSettings:
    enabled: bool = False  # [server] enable_rdma (or -r / -i)
    device: str = ""  # [server] ibverbs_device: only this device; "" : the device that has the connection's address

    def startup_line(self, sysfs: Path = SYSFS) -> str:
        """What oriond says at start about relay transports."""
        if not self.enabled:
            return "relayed sessions use TCP (enable_rdma is false)"
        names = device_names(sysfs)
        if not names:
            return "enable_rdma is true, but this host has no RDMA device: relayed sessions use TCP"
        if self.device and self.device not in names:
            return (f"ibverbs_device {self.device} is not an RDMA device here (there are: {', '.join(names)}): "
                    "relayed sessions use TCP")
        return f"relayed sessions use RDMA where both hosts have it (devices: {self.device or ', '.join(names)})"


TCP_ONLY = RdmaSettings()


def prepare(sock: socket.socket, settings: RdmaSettings, sysfs: Path = SYSFS) -> tuple[RdmaLink | None, str]:
    """This end's RDMA link for the connection on `sock`, ready to offer; or None and why not."""
    if not settings.enabled:
        return None, "enable_rdma is false here"
    try:
        return RdmaLink(find_port(sock.getsockname()[0], settings.device, sysfs)), ""
    except RdmaUnavailable as exc:
        return None, str(exc)


def connect(link: RdmaLink, peer_offer: bytes | bytearray, sock: socket.socket) -> RdmaStream:
    """The connection's records over RDMA from now on; RdmaUnavailable (the link closed) when that cannot be."""
    try:
        peer = link.connect(peer_offer)
    except RdmaUnavailable:
        link.close()
        raise
    return RdmaStream(link, peer, sock)


def describe(link: RdmaLink) -> str:
    port = link.port
    return f"{port.device} port {port.port}, GID index {port.gid_index}"
