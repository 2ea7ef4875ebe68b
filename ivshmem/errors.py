"""Exceptions of the wire layer.

Every foreign error met while opening or using a region (OSError from open/mmap, posix_ipc errors) is
translated into one of these at the boundary, with a message that names the file and says what to do.
"""


class WireError(Exception):
    """Base of every error raised by the ivshmem package."""


class RegionError(WireError):
    """A region cannot be opened or created (missing file, no permission, no device)."""


class RegionFormatError(RegionError):
    """The bytes of a region are not a valid Orion region (magic, version, geometry, size)."""


class RegionNotFormatted(RegionFormatError):
    """The region exists but holds no header yet (all zeros): the host agent has not served it."""


class ChannelError(WireError):
    """A channel cannot be claimed, or the peer stopped serving it."""


class NoFreeChannel(ChannelError):
    """Every channel of the region is held by a live client."""


class PeerGone(ChannelError):
    """The other side of a channel stopped (agent stopped, client died, session reclaimed)."""


class DeviceLost(PeerGone):
    """The session's GPU is gone in the middle of a reply, which its host could neither finish nor take back, so it
    ended the session: a relaying host lost the GPU host, or the GPU failed a copy whose success had gone out (a
    client answers CUDA_ERROR_DEVICE_UNAVAILABLE)."""


class ChannelCorrupt(ChannelError):
    """The peer broke the ring protocol (impossible indices); the session cannot continue."""


class RecordError(WireError):
    """A record or payload is malformed (bad header, truncated or overlong payload)."""

    def __init__(self, message: str, status: int = -1) -> None:
        super().__init__(message)
        self.status = status
