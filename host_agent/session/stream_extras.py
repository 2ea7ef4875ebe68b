"""Stream attributes and cluster sizing as the host serves them: a mixin of executor.CudaExecutor, registered on its
HOST handlers (call_registry.py).

* cuStreamGetAttribute and cuStreamSetAttribute: a CUstreamAttrValue is CUlaunchAttributeValue's 64-byte union, and
  travels as its bytes. Only the plain-valued attribute IDs travel (driver_api.STREAM_ATTRIBUTES_PLAIN: the guest
  refuses the others, and so does this side, with CUDA_ERROR_NOT_SUPPORTED); the driver judges the rest, answering
  its own error for an ID that is not a stream's. A set hands the driver the wheel's CUstreamAttrValue over the
  request's 64 bytes; a get answers the 64 bytes the driver filled. The stream is one of the session's, or NULL. An
  access policy window's base pointer is an L2 cache hint for the work of the session's own stream, not memory the
  stream reads or writes, so it travels unchecked, as a launch's ACCESS_POLICY_WINDOW attribute does
  (launch_extras.py).
* cuOccupancyMaxPotentialClusterSize: the launch configuration as cuOccupancyMaxActiveClusters takes it
  (launch_extras.launch_config_for), with the function or kernel, the stream and any event attribute the session's.
"""
from __future__ import annotations

import ctypes
import struct
from typing import TYPE_CHECKING, Any

from ivshmem.cuda_status import INVALID_HANDLE, NOT_SUPPORTED, SUCCESS
from ivshmem.driver_api import LAUNCH_ATTRIBUTE, STREAM_ATTRIBUTES_PLAIN, DriverCall
from ivshmem.record import Status

from ..handler import Reply
from .call_registry import HOST

if TYPE_CHECKING:
    from .session_ledger import SessionLedger

# sizeof(CUstreamAttrValue), 64: CUlaunchAttributeValue's union, the value part of a CUlaunchAttribute as it travels
ATTRIBUTE_VALUE_BYTES = LAUNCH_ATTRIBUTE.size - struct.calcsize("<i4x")


class StreamExtraCalls:
    """cuStreamGetAttribute, cuStreamSetAttribute and cuOccupancyMaxPotentialClusterSize."""

    if TYPE_CHECKING:  # CudaExecutor's, which this mixes into
        driver: Any
        ledger: SessionLedger

        def _cluster_query(self, call: DriverCall, payload: bytes, ask: Any) -> Reply: ...  # launch_extras.py

    def _stream_attribute(self, stream: int, attribute: int) -> Any:
        """The wheel's CUstreamAttrID for `attribute` on `stream`, or the Reply refusing them: a stream the session
        does not own (INVALID_HANDLE); an ID that does not travel, or that this host's cuda-bindings does not know
        (NOT_SUPPORTED, as a driver older than the guest's table answers)."""
        if not self.ledger.stream_known(stream):
            return Reply(INVALID_HANDLE)
        if attribute not in STREAM_ATTRIBUTES_PLAIN:
            return Reply(NOT_SUPPORTED)
        try:
            return self.driver.CUstreamAttrID(attribute)
        except ValueError:
            return Reply(NOT_SUPPORTED)

    @HOST.serves("cuStreamGetAttribute")
    def _stream_get_attribute(self, call: DriverCall, payload: bytes) -> Reply:
        stream, attribute = call.request.decode(payload)
        identifier = self._stream_attribute(stream, attribute)
        if isinstance(identifier, Reply):
            return identifier
        err, value = self.driver.cuStreamGetAttribute(stream, identifier)
        if int(err) != SUCCESS:
            return Reply(int(err))
        return Reply(SUCCESS, call.reply.encode(ctypes.string_at(int(value.getPtr()), ATTRIBUTE_VALUE_BYTES)))

    @HOST.serves("cuStreamSetAttribute")
    def _stream_set_attribute(self, call: DriverCall, payload: bytes) -> Reply:
        stream, attribute, value = call.request.decode(payload)
        if len(value) != ATTRIBUTE_VALUE_BYTES:
            return Reply(Status.MALFORMED, f"cuStreamSetAttribute: a {len(value)}-byte value, not a "
                                           f"{ATTRIBUTE_VALUE_BYTES}-byte CUstreamAttrValue".encode())
        identifier = self._stream_attribute(stream, attribute)
        if isinstance(identifier, Reply):
            return identifier
        union = ctypes.create_string_buffer(bytes(value), ATTRIBUTE_VALUE_BYTES)  # alive until the driver returns
        (err,) = self.driver.cuStreamSetAttribute(stream, identifier,
                                                  self.driver.CUstreamAttrValue(_ptr=ctypes.addressof(union)))
        return Reply(int(err))

    @HOST.serves("cuOccupancyMaxPotentialClusterSize")
    def _max_potential_cluster_size(self, call: DriverCall, payload: bytes) -> Reply:
        return self._cluster_query(call, payload, self.driver.cuOccupancyMaxPotentialClusterSize)

