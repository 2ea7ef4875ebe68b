"""The JIT linker as the host serves it: a mixin of executor.CudaExecutor, registered on the host's HOST and POLICY
handlers (call_registry.py).

A link state is a handle of the session (the ledger records cuLinkCreate's output, and cuLinkDestroy, generic with
effect `destroys`, gives it back); a state the session did not create answers CUDA_ERROR_INVALID_HANDLE before the
driver sees it. The driver's state dies with the session's worker process, as its contexts do.

* cuLinkCreate and cuLinkAddData take scalar JIT options as cuModuleLoadDataEx does (driver_api.JIT_SCALAR_OPTIONS;
  the guest keeps the log and wall-time ones and answers them with empty logs); any other option that reaches the
  host answers CUDA_ERROR_NOT_SUPPORTED.
* cuLinkAddData's input is its bytes (the request's tail) and its name; every CUjitInputType (cubin, PTX, fatbin,
  object, library archive, NVVM) is bytes in memory for the driver, which judges the type and the bytes.
* cuLinkComplete's request names the guest's buffer (`capacity`): the cubin the driver made comes back whole if it
  fits, else only its size, and the guest's next cuLinkComplete of that state is answered from the cubin the driver
  still holds (it owns it until cuLinkDestroy), without linking again.
"""
from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ivshmem.cuda_status import INVALID_HANDLE, INVALID_VALUE, OUT_OF_MEMORY, SUCCESS
from ivshmem.driver_api import DriverCall

from ..handler import Reply
from .call_registry import HOST, POLICY
from .session_ledger import SessionLedger

MAX_CUBIN = 1 << 30  # the largest reply the record and its staging carry (1 GiB)
INPUT_TYPES = range(6)  # CUjitInputType: CUBIN, PTX, FATBINARY, OBJECT, LIBRARY, NVVM (all bytes in memory)


class LinkCalls:
    """cuLinkCreate, cuLinkAddData, cuLinkComplete; cuLinkDestroy's policy (the held cubin goes with its state)."""

    # CudaExecutor's, set in its __init__
    driver: Any
    ledger: SessionLedger

    if TYPE_CHECKING:  # CudaExecutor's: the JIT options' one conversion
        def _jit_pairs(self, pairs: Sequence[tuple[int, int]]) -> tuple[list[Any], list[Any]] | Reply: ...

    def _linked(self) -> dict[int, tuple[int, int]]:
        """state -> (address, size) of a cubin the driver made whose bytes the guest has not been sent yet."""
        held: dict[int, tuple[int, int]] | None = self.__dict__.get("_link_held")
        if held is None:
            held = self.__dict__["_link_held"] = {}
        return held

    def _link_state(self, state: int) -> int | None:
        """CUDA_ERROR_INVALID_HANDLE unless `state` is one of the session's link states."""
        return None if state in self.ledger.handles["CUlinkState"] else INVALID_HANDLE

    @HOST.serves("cuLinkCreate")
    def _link_create(self, call: DriverCall, payload: bytes) -> Reply:
        (pairs,) = call.request.decode(payload)
        converted = self._jit_pairs(pairs)
        if isinstance(converted, Reply):
            return converted
        options, values = converted
        err, state = self.driver.cuLinkCreate(len(options), options or None, values or None)
        if int(err) != SUCCESS:
            return Reply(int(err))
        self.ledger.record(call, (), [int(state)])
        return Reply(SUCCESS, call.reply.encode(int(state)))

    @HOST.serves("cuLinkAddData")
    def _link_add_data(self, call: DriverCall, payload: bytes) -> Reply:
        state, input_type, pairs, name, data = call.request.decode(payload)
        refused = self._link_state(state)
        if refused is not None:
            return Reply(refused)
        name = bytes(name)
        if input_type not in INPUT_TYPES or b"\0" in name:
            return Reply(INVALID_VALUE)
        converted = self._jit_pairs(pairs)
        if isinstance(converted, Reply):
            return converted
        options, values = converted
        (err,) = self.driver.cuLinkAddData(state, self.driver.CUjitInputType(input_type), data, len(data), name,
                                           len(options), options or None, values or None)
        return Reply(int(err))

    @HOST.serves("cuLinkComplete")
    def _link_complete(self, call: DriverCall, payload: bytes) -> Reply:
        state, capacity = call.request.decode(payload)
        refused = self._link_state(state)
        if refused is not None:
            return Reply(refused)
        held = self._linked()
        made = held.pop(state, None)  # the guest's second ask, for a cubin larger than its first buffer
        if made is None:
            err, cubin, size = self.driver.cuLinkComplete(state)
            if int(err) != SUCCESS:
                return Reply(int(err))
            made = (int(cubin), int(size))
        address, size = made
        if size > MAX_CUBIN:
            return Reply(OUT_OF_MEMORY)
        if size > capacity:
            held[state] = made
            return Reply(SUCCESS, call.reply.encode(size, b""))
        return Reply(SUCCESS, call.reply.encode(size, ctypes.string_at(address, size) if size else b""))

    @POLICY.serves("cuLinkDestroy")
    def _link_destroy(self, call: DriverCall, args: tuple[int, ...]) -> Reply | None:
        if args[0] in self.ledger.handles["CUlinkState"]:
            self._linked().pop(args[0], None)
        return None  # then the generic path: checked, destroyed, recorded
