"""The Orion wire: region layout, SPSC rings, staging arenas, the record codec; and, in ivshmem/shared/, what both
sides share besides it (Orion's INI syntax, the controller's client, the compiler lookup).

The ground floor, shared by the host agent and the guest runtime; it imports the standard library only, never
libvirt, lxml, cuda or etcd (the guest distribution carries it alone). docs/wire-protocol.md is the wire's
byte-level specification.
"""
from .channel import BufferCursor, ClientChannel, HostChannel, Streamed
from .errors import (
    ChannelCorrupt,
    ChannelError,
    NoFreeChannel,
    PeerGone,
    RecordError,
    RegionError,
    RegionFormatError,
    RegionNotFormatted,
    WireError,
)
from .record import Flag, Op, Record, Status
from .region import Region

__all__ = ["BufferCursor", "ChannelCorrupt", "ChannelError", "ClientChannel", "Flag", "HostChannel",
           "NoFreeChannel", "Op", "PeerGone", "Record", "RecordError", "Region", "RegionError", "RegionFormatError",
           "RegionNotFormatted", "Status", "Streamed", "WireError"]
