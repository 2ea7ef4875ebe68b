"""Graph host nodes, and host functions run as host nodes run them, as the host serves them: a mixin of
executor.CudaExecutor, registered on the host's HOST handlers (call_registry.py).

A host node's function is guest code, which this process cannot call. The guest names it by `words`: its address of
two u32 words in the session's page-locked pool that stand for one (function, data) pair (the guest's "token":
guest_runtime/native/host_functions.c). The node made here runs `trampoline` instead, with this process's address of
those words as its userData. Each run adds one to the first word (`reached`) and waits until the second (`release`)
reaches the new count; the guest's watcher sees `reached` move, runs the function and stores the count it ran up to in
`release`. So every run of every node holding the words runs the guest's function once, in the order the driver runs
the nodes, and the stream (or graph) waits for it as natively. Nothing here is per node: the words are the state.

* `words` must lie (8 bytes, 4-aligned) in one of the session's page-locked pool allocations: else INVALID_VALUE,
  before the driver (a session with no pool, a relayed one's, answers NOT_SUPPORTED; the guest refuses host nodes
  there itself). A guest that frees or rewrites its words only disturbs its own functions: the trampoline reads and
  writes nothing but those 8 bytes of the session's own pool, which stay mapped for the worker's life.
* cuGraphHostNodeGetParams answers the guest's address of the words the driver holds; a host node whose function is
  not the trampoline (none is made otherwise in a session) answers NOT_SUPPORTED.
* HOST_NODE_FUNCTION (driver_api.HOST_NODE_FUNCTION_REQUEST): cuLaunchHostFunc(stream, trampoline, words), which
  the native guest driver sends for a host function while a stream capture may be under way, so that a capture
  records a host node as the driver's would; the stream must be one the session may name (else INVALID_HANDLE).
  It calls the driver's own entry point, not cuda-bindings' wrapper (`_driver_launch_host_func` says why).

The trampoline runs on the driver's own thread and waits there, as the guest's function would natively (the driver
may run host functions of unrelated streams one after the other, natively too). It polls `release` with sleeps that
grow to POLL_MAX_S, so a waiting run costs no CPU to speak of; it holds the GIL only between sleeps (cuda-bindings
and the compiled hot path release it around driver calls, so a synchronising call waiting for the node cannot hold
it). A guest that dies with a run waiting leaves it waiting until the session's worker ends, which ends the driver's
threads with it.
"""
from __future__ import annotations

import ctypes
import threading
import time
from typing import TYPE_CHECKING, Any

from ivshmem.cuda_status import INVALID_HANDLE, INVALID_VALUE, NOT_SUPPORTED, SUCCESS
from ivshmem.driver_api import HOST_NODE_FUNCTION_REQUEST, DriverCall

from ..handler import Reply
from .call_registry import HOST

if TYPE_CHECKING:
    from collections.abc import Sequence

    from .pinned_pool import HostPool
    from .session_ledger import SessionLedger

WORDS = 8  # reached (u32), release (u32)
POLL_MAX_S = 0.001
_HOST_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_LAUNCH_HOST_FUNC = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
_counting = threading.Lock()  # runs of one node may start on several driver threads


def _run(words: int | None) -> None:
    """The host function of every node made here: one run of the guest's function (see the module docstring)."""
    if not words:
        return
    reached = ctypes.c_uint32.from_address(words)
    release = ctypes.c_uint32.from_address(words + 4)
    with _counting:
        run = (reached.value + 1) & 0xFFFFFFFF
        reached.value = run
    pause = 0.0
    while (release.value - run) & 0x80000000:  # release < run, compared cyclically (as the guest counts)
        time.sleep(pause)
        pause = min(pause * 2 or 2e-5, POLL_MAX_S)


trampoline = _HOST_FN(_run)
TRAMPOLINE_ADDRESS = ctypes.cast(trampoline, ctypes.c_void_p).value or 0


class HostNodeCalls:
    """cuGraphAddHostNode, its parameters asked and set, and HOST_NODE_FUNCTION (see the module docstring)."""

    if TYPE_CHECKING:  # CudaExecutor's and GraphCalls', which this mixes into
        driver: Any
        ledger: SessionLedger
        pool: HostPool | None

        def _owned(self, kind: str, handle: int) -> bool: ...
        def _dependencies(self, call: DriverCall, nodes: Sequence[tuple[int]]) -> list[Any] | Reply: ...
        def _made(self, call: DriverCall, err: Any, node: Any, graph: int = 0) -> Reply: ...
        def _exec_node_refused(self, graph_exec: int, node: int) -> Reply | None: ...

    def _host_words(self, words: int) -> int | Reply:
        """This process's address of the guest's `words`, or the Reply refusing them."""
        if self.pool is None:
            return Reply(NOT_SUPPORTED)
        host = self.pool.host_address(words, WORDS) if words % 4 == 0 else None
        return Reply(INVALID_VALUE) if host is None else host

    def _trampoline_params(self, words: int) -> Any:
        """The wheel's CUDA_HOST_NODE_PARAMS running the trampoline for `words`, or the Reply refusing them."""
        host = self._host_words(words)
        if isinstance(host, Reply):
            return host
        params = self.driver.CUDA_HOST_NODE_PARAMS()
        params.fn = self.driver.CUhostFn(TRAMPOLINE_ADDRESS)
        params.userData = host
        return params

    @HOST.serves("cuGraphAddHostNode")
    def _add_host_node(self, call: DriverCall, payload: bytes) -> Reply:
        graph, words, deps = call.request.decode(payload)
        if not self._owned("CUgraph", graph):
            return Reply(INVALID_VALUE)
        nodes = self._dependencies(call, deps)
        if isinstance(nodes, Reply):
            return nodes
        params = self._trampoline_params(words)
        if isinstance(params, Reply):
            return params
        err, node = self.driver.cuGraphAddHostNode(graph, nodes or None, len(nodes), params)
        return self._made(call, err, node, graph)

    @HOST.serves("cuGraphHostNodeGetParams")
    def _host_node_get(self, call: DriverCall, payload: bytes) -> Reply:
        (node,) = call.request.decode(payload)
        if not self._owned("CUgraphNode", node):
            return Reply(INVALID_VALUE)
        err, params = self.driver.cuGraphHostNodeGetParams(node)
        if int(err) != SUCCESS:
            return Reply(int(err))
        guest = self.pool.guest_address(int(params.userData or 0)) if self.pool is not None else None
        if int(params.fn or 0) != TRAMPOLINE_ADDRESS or guest is None:
            return Reply(NOT_SUPPORTED)
        return Reply(SUCCESS, call.reply.encode(guest))

    @HOST.serves("cuGraphHostNodeSetParams")
    def _host_node_set(self, call: DriverCall, payload: bytes) -> Reply:
        node, words = call.request.decode(payload)
        if not self._owned("CUgraphNode", node):
            return Reply(INVALID_VALUE)
        params = self._trampoline_params(words)
        if isinstance(params, Reply):
            return params
        (err,) = self.driver.cuGraphHostNodeSetParams(node, params)
        return Reply(int(err))

    @HOST.serves("cuGraphExecHostNodeSetParams")
    def _exec_host_node_set(self, call: DriverCall, payload: bytes) -> Reply:
        graph_exec, node, words = call.request.decode(payload)
        if (refused := self._exec_node_refused(graph_exec, node)) is not None:
            return refused
        params = self._trampoline_params(words)
        if isinstance(params, Reply):
            return params
        (err,) = self.driver.cuGraphExecHostNodeSetParams(graph_exec, node, params)
        return Reply(int(err))

    def _host_node_function(self, payload: bytes) -> Reply:
        """HOST_NODE_FUNCTION: the guest's function on `stream` as a host node runs it."""
        stream, words = HOST_NODE_FUNCTION_REQUEST.decode(payload)
        if not self.ledger.stream_known(stream):
            return Reply(INVALID_HANDLE)
        host = self._host_words(words)
        if isinstance(host, Reply):
            return host
        launch = self._driver_launch_host_func()
        if launch is not None:
            return Reply(int(launch(stream, TRAMPOLINE_ADDRESS, host)))
        (err,) = self.driver.cuLaunchHostFunc(stream, self.driver.CUhostFn(TRAMPOLINE_ADDRESS), host)
        return Reply(int(err))

    def _driver_launch_host_func(self) -> Any:
        """The driver's own cuLaunchHostFunc (CUDA 12's ABI), called through ctypes (which drops the GIL around
        it): cuda-bindings' wrapper hands the driver a trampoline of its own with data it frees after the first
        call, so a graph captured from it crashes at its second replay (seen on the H200, cuda-bindings 13.3). None
        where the driver object has no cuGetProcAddress (the CPU tests' fake, which models the driver's entry)."""
        cached = getattr(self, "_launch_host_func", False)
        if cached is not False:
            return cached
        found = None
        lookup = getattr(self.driver, "cuGetProcAddress", None)
        if lookup is not None:
            err, address, _status = lookup(b"cuLaunchHostFunc", 12000, 0)
            if int(err) == SUCCESS and int(address or 0):
                found = _LAUNCH_HOST_FUNC(int(address))
        self._launch_host_func = found
        return found
