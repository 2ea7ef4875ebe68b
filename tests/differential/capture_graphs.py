"""Stream capture and CUDA graphs, as CUDA-graph programs (PyTorch's CUDA graphs, JAX's command buffers) use them:
one fixed program whose transcript must be the same on the fake driver called directly and through every
forwarding path (tests/differential/test_capture_graphs.py: the capsule path and the native `libcuda.so.1`, each
on a local region and relayed).

The program captures, on a non-blocking stream, a memset, two launches of `orion_fake_add_u32` (the kernel the
fake driver runs: tests/fake_driver.py ADD_KERNEL; ADD_PTX compiles it on a GPU), a device-to-device copy,
optionally copies between the device and page-locked memory, and an event record with CU_EVENT_RECORD_EXTERNAL;
ends the capture, checks that nothing ran, instantiates the graph and a clone, launches the graph twice and the
clone once, and reads the memory back: every word shows how many replays ran, in capture order. Around it:
cuStreamIsCapturing before, during and after; cuThreadExchangeStreamCaptureMode there and back; the stream's
flags, priority and ids; an event recorded with flags and queried; and the ways a capture goes wrong: a stream
synchronize, a context synchronize and (thread mode GLOBAL, not RELAXED) a cuMemAlloc during the capture each
answer CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED (900), after which cuStreamEndCapture answers
CUDA_ERROR_STREAM_CAPTURE_INVALIDATED (901) and the memory shows the captured work never ran.

Handles are never compared between paths (each driver gives its own): the transcript holds statuses, the words of
memory and facts about handles (non-zero, equal to another, distinct).

Two parts are behind switches, each for a reason outside this program:

* `capture_info`: cuStreamGetCaptureInfo after each captured call (the capture's status, id and graph, one
  dependency, and that node's type by cuGraphNodeGetType). Both guest paths forward it and run with it; the switch
  stays for a driver that would answer it CUDA_ERROR_NOT_SUPPORTED (the fake's own test runs both ways).
* `pinned_copies`: captured copies between device memory and page-locked memory (cuMemAllocHost), whose replays
  must read and write the host memory as it is when the graph runs (the relayed paths run without them: a gap,
  held by a strict xfail).

Run in a process of its own with a C driver library (the native guest driver, ORION_SHM set; or the real libcuda
on a GPU):

    python -m tests.differential.capture_graphs LIBRARY [capture-info] [pinned-copies] [instantiate-by-api-name]

prints one JSON object: {"transcript": [...], "libcuda": [the libcuda files mapped]}. The library's functions are
looked up as a program built against CUDA 13's cuda.h names them (cuGraphInstantiateWithFlags,
cuStreamGetCaptureInfo_v3, cuStreamBeginCapture_v2...); `instantiate-by-api-name` looks up cuGraphInstantiate
instead, which only the native guest library answers with that ABI (the real libcuda's plain cuGraphInstantiate
symbol keeps the CUDA 10 ABI: never pass it there).
"""
from __future__ import annotations

import ctypes
import json
import sys
from typing import Any

from tests.differential import pool_kernels
from tests.differential.corpus import NON_BLOCKING, SUCCESS, Table, ctypes_table
from tests.differential.pool_kernels import ADD_PTX

WORDS = 16  # the words of each device buffer the program uses and shows
NOT_SUPPORTED = 801
GLOBAL, THREAD_LOCAL, RELAXED = 0, 1, 2  # CUstreamCaptureMode
CU_EVENT_RECORD_EXTERNAL = 1
PRIORITY = -1  # of the capturing stream (an H100's range is [-5, 0])

U32, U64, I32 = ctypes.c_uint32, ctypes.c_uint64, ctypes.c_int
P, UI, INT = ctypes.c_void_p, ctypes.c_uint, ctypes.c_int
# What the program calls besides corpus.PROTOTYPES and pool_kernels.PROTOTYPES: name -> ctypes argument types.
PROTOTYPES: dict[str, list[Any]] = {
    "cuStreamCreateWithPriority": [P, UI, INT], "cuStreamGetFlags": [U64, P], "cuStreamGetPriority": [U64, P],
    "cuStreamGetId": [U64, P], "cuStreamBeginCapture": [U64, INT], "cuStreamEndCapture": [U64, P],
    "cuStreamIsCapturing": [U64, P], "cuStreamGetCaptureInfo": [U64, P, P, P, P, P, P],
    "cuThreadExchangeStreamCaptureMode": [P], "cuGraphClone": [P, U64], "cuGraphInstantiate": [P, U64, U64],
    "cuGraphLaunch": [U64, U64], "cuGraphUpload": [U64, U64], "cuGraphExecDestroy": [U64], "cuGraphDestroy": [U64],
    "cuGraphNodeGetType": [U64, P], "cuEventRecordWithFlags": [U64, U64, UI], "cuEventQuery": [U64],
    "cuEventDestroy": [U64], "cuCtxSynchronize_v2": [U64],
}
# The symbol a program built against CUDA 13's cuda.h calls for each (its macros), where it is not the API name
# or name_v2 (corpus.ctypes_table's rule): the library's plain symbols keep older ABIs.
CUDA_H_SYMBOLS = {"cuGraphInstantiate": "cuGraphInstantiateWithFlags",
                  "cuStreamGetCaptureInfo": "cuStreamGetCaptureInfo_v3"}


def library_table(library: ctypes.CDLL, by_api_name: tuple[str, ...] = ()) -> Table:
    """Every function the program calls, from a C driver library, by cuda.h's names (those in `by_api_name` by
    their API name instead)."""
    symbols = {k: v for k, v in CUDA_H_SYMBOLS.items() if k not in by_api_name}
    table = ctypes_table(library, {**pool_kernels.PROTOTYPES,
                                   **{k: v for k, v in PROTOTYPES.items() if k not in symbols}})
    for name, symbol in symbols.items():
        function = getattr(library, symbol)
        function.argtypes, function.restype = PROTOTYPES[name], ctypes.c_int
        table[name] = function
    return table


def read_words(table: Table, pointer: int) -> list[Any]:
    """The WORDS u32 words at device `pointer`, or why they could not be read (a step's value, compared)."""
    cells = (U32 * WORDS)()
    status = table["cuMemcpyDtoH"](ctypes.addressof(cells), pointer, 4 * WORDS)
    return list(cells) if status == SUCCESS else [f"read failed: {status}"]


class CaptureGraphProgram:
    """Runs the program against a C-ABI driver `table` that has corpus.PROTOTYPES, pool_kernels.PROTOTYPES and
    PROTOTYPES above (see the module docstring for `capture_info` and `pinned_copies`)."""

    def __init__(self, table: Table, capture_info: bool = False, pinned_copies: bool = True) -> None:
        self.t, self.capture_info, self.pinned_copies = table, capture_info, pinned_copies
        self.image = ctypes.create_string_buffer(ADD_PTX, len(ADD_PTX))
        self.out: list[list[Any]] = []
        # what cuStreamGetCaptureInfo said last (capture id, graph), and the capture's id the first time
        self.last_id: int | None = None
        self.last_graph: int | None = None
        self.first_id: int | None = None

    # --- helpers --------------------------------------------------------------------------------------------------
    def _out(self, name: str, *args: Any, cell: Any = None) -> int:
        """A call whose first parameter is its output (a u64 cell unless `cell` says): the output; raises unless
        it succeeds (the program's own set-up)."""
        cell = cell if cell is not None else U64()
        status = self.t[name](ctypes.addressof(cell), *args)
        if status != SUCCESS:
            raise RuntimeError(f"capture program: {name} answered {status}")
        return int(cell.value)

    def _query(self, name: str, handle: int, cell_type: Any = U64) -> tuple[int, int | None]:
        """(status, output) of a call taking a handle and one output."""
        cell = cell_type(0x5A5A5A5A)
        status = int(self.t[name](handle, ctypes.addressof(cell)))
        return status, (int(cell.value) if status == SUCCESS else None)

    def note(self, step: str, statuses: list[Any], values: Any = None) -> None:
        self.out.append([step, [int(s) for s in statuses], values])

    def _add(self, words: int, value: int, stream: int) -> int:
        cells = (U64(words), U32(WORDS), U32(value))
        params = (ctypes.c_void_p * 3)(*[ctypes.addressof(c) for c in cells])
        return int(self.t["cuLaunchKernel"](self.function, 1, 1, 1, WORDS, 1, 1, 0, stream,
                                            ctypes.addressof(params), None))

    def _read(self, pointer: int) -> list[Any]:
        return read_words(self.t, pointer)

    def _memory(self) -> dict[str, list[Any]]:
        found = {name: self._read(pointer) for name, pointer in self.buffers.items()}
        if self.pinned_copies:
            found["pinned_out"] = list(self.pinned_out)
        return found

    def _capturing(self, stream: int) -> list[int]:
        status, value = self._query("cuStreamIsCapturing", stream, I32)
        return [status, value] if value is not None else [status]

    def _exchange(self, mode: int) -> tuple[int, int]:
        cell = I32(mode)
        status = int(self.t["cuThreadExchangeStreamCaptureMode"](ctypes.addressof(cell)))
        return status, int(cell.value)

    def _info(self, stream: int) -> list[Any]:
        """cuStreamGetCaptureInfo: [status, capture status, id non-zero, graph non-zero, count, the type of each
        dependency]; the id and graph kept to compare with later ones."""
        status, ident, graph, count = I32(-1), U64(0), U64(0), ctypes.c_size_t(0)
        nodes, edges = ctypes.c_void_p(0), ctypes.c_void_p(0)
        result = int(self.t["cuStreamGetCaptureInfo"](stream, *[ctypes.addressof(c) for c in (
            status, ident, graph, nodes, edges, count)]))
        if result != SUCCESS:
            return [result]
        self.last_id, self.last_graph = ident.value, graph.value
        types = []
        if count.value and nodes.value:
            for node in (U64 * count.value).from_address(nodes.value):
                types.append(list(self._query("cuGraphNodeGetType", node, I32)))
        return [result, status.value, ident.value != 0, graph.value != 0, count.value, types]

    def _captured(self, step: str, status: int, stream: int) -> None:
        """A call made on the capturing stream: its status, then (capture_info) what the capture says."""
        info = self._info(stream) if self.capture_info else None
        if info is not None:
            info.append(self.last_id == self.first_id)  # the same capture all along
        self.note(step, [status], info)

    # --- the program ----------------------------------------------------------------------------------------------
    def run(self) -> list[list[Any]]:
        t = self.t
        device = ctypes.c_int()
        t["cuInit"](0)
        t["cuDeviceGet"](ctypes.addressof(device), 0)
        self.context = context = self._out("cuDevicePrimaryCtxRetain", device.value)
        t["cuCtxSetCurrent"](context)
        module = self._out("cuModuleLoadData", ctypes.addressof(self.image))
        self.function = self._out("cuModuleGetFunction", module, b"orion_fake_add_u32")
        stream = self._out("cuStreamCreateWithPriority", NON_BLOCKING, PRIORITY)
        blocking = self._out("cuStreamCreate", 0)
        event = self._out("cuEventCreate", 0)
        self.buffers = {name: self._out("cuMemAlloc", 4 * WORDS) for name in ("words", "marks", "copy", "staged")}
        words, marks, copy, staged = self.buffers.values()
        initial = (U32 * WORDS)(*range(WORDS))
        self.note("initial memory", [t["cuMemcpyHtoD"](words, ctypes.addressof(initial), 4 * WORDS),
                                     t["cuMemsetD32"](marks, 0, WORDS), t["cuMemsetD32"](copy, 0, WORDS),
                                     t["cuMemsetD32"](staged, 0, WORDS), t["cuCtxSynchronize"]()])
        if self.pinned_copies:
            pinned_in = self._out("cuMemAllocHost", 4 * WORDS)
            pinned_out = self._out("cuMemAllocHost", 4 * WORDS)
            self.pinned_in = (U32 * WORDS).from_address(pinned_in)
            self.pinned_out = (U32 * WORDS).from_address(pinned_out)
            for i in range(WORDS):
                self.pinned_in[i], self.pinned_out[i] = 1000 + i, 0

        # the streams' own facts
        flags, priority = self._query("cuStreamGetFlags", stream, U32), self._query("cuStreamGetPriority", stream, I32)
        self.note("flags and priority of the capturing stream", [flags[0], priority[0]], [flags[1], priority[1]])
        ids = [self._query("cuStreamGetId", s) for s in (stream, blocking, stream)]
        self.note("stream ids: non-zero, one per stream, stable", [s for s, _ in ids],
                  [all(i for _, i in ids), ids[0][1] != ids[1][1], ids[0][1] == ids[2][1]])

        # the calling thread's capture mode, exchanged and exchanged back
        there, back = self._exchange(RELAXED), self._exchange(GLOBAL)
        self.note("capture mode exchanged to RELAXED and back: the previous modes", [there[0], back[0]],
                  [there[1], back[1]])

        # the capture
        self.note("not capturing before", [], self._capturing(stream))
        self.note("begin capture (GLOBAL)", [t["cuStreamBeginCapture"](stream, GLOBAL)], self._capturing(stream))
        if self.capture_info:
            info = self._info(stream)
            self.first_id, first_graph = self.last_id, self.last_graph
            self.note("capture info before any node", [], info)
        self._captured("memset captured", t["cuMemsetD32Async"](marks, 7, WORDS, stream), stream)
        self._captured("kernel captured (marks += 3)", self._add(marks, 3, stream), stream)
        self._captured("kernel captured (words += 5)", self._add(words, 5, stream), stream)
        self._captured("device copy captured", t["cuMemcpyDtoDAsync"](copy, words, 4 * WORDS, stream), stream)
        if self.pinned_copies:
            self._captured("copy from page-locked memory captured",
                           t["cuMemcpyHtoDAsync"](staged, ctypes.addressof(self.pinned_in), 4 * WORDS, stream),
                           stream)
            self._captured("kernel captured (staged += 1)", self._add(staged, 1, stream), stream)
            self._captured("copy to page-locked memory captured",
                           t["cuMemcpyDtoHAsync"](ctypes.addressof(self.pinned_out), staged, 4 * WORDS, stream),
                           stream)
        self._captured("event record (external) captured",
                       t["cuEventRecordWithFlags"](event, stream, CU_EVENT_RECORD_EXTERNAL), stream)
        self.note("capturing during the capture", [], self._capturing(stream))
        graph_cell = U64()
        ended = int(t["cuStreamEndCapture"](stream, ctypes.addressof(graph_cell)))
        graph = graph_cell.value
        facts: list[Any] = [graph != 0]
        if self.capture_info:
            facts.append(graph == first_graph)  # the graph the capture info named
        self.note("end capture: a graph", [ended], facts)
        self.note("not capturing after", [], self._capturing(stream))
        self.note("the capture ran nothing", [t["cuStreamSynchronize"](stream)], self._memory())

        # the graph, its clone and their executable graphs
        clone = U64()
        graph_exec, clone_exec = U64(), U64()
        self.note("clone, instantiate both, upload", [
            t["cuGraphClone"](ctypes.addressof(clone), graph),
            t["cuGraphInstantiate"](ctypes.addressof(graph_exec), graph, 0),
            t["cuGraphInstantiate"](ctypes.addressof(clone_exec), clone.value, 0),
            t["cuGraphUpload"](graph_exec.value, stream)],
            [clone.value not in (0, graph), graph_exec.value != 0, clone_exec.value not in (0, graph_exec.value)])
        self.note("the graph launched twice, then a stream synchronize", [
            t["cuGraphLaunch"](graph_exec.value, stream), t["cuGraphLaunch"](graph_exec.value, stream),
            t["cuStreamSynchronize"](stream)], self._memory())
        self.note("the event its node recorded", [t["cuEventSynchronize"](event), t["cuEventQuery"](event)])
        if self.pinned_copies:
            for i in range(WORDS):
                self.pinned_in[i] = 2000 + i  # the next replay must read these
        self.note("the clone launched on a blocking stream, then a context synchronize", [
            t["cuGraphLaunch"](clone_exec.value, blocking), t["cuCtxSynchronize"]()], self._memory())

        # an event recorded with flags (0: as cuEventRecord), then waited for and queried
        self.note("event recorded with flags 0, synchronized, queried", [
            t["cuEventRecordWithFlags"](event, stream, 0), t["cuEventSynchronize"](event), t["cuEventQuery"](event)])

        # what spoils a capture
        for how, spoil in (("stream synchronize", lambda: t["cuStreamSynchronize"](stream)),
                           ("context synchronize", lambda: t["cuCtxSynchronize"]())):
            self.note(f"{how} during a capture: 900, the capture invalidated", [
                t["cuStreamBeginCapture"](stream, GLOBAL), self._add(words, 100, stream),
                t["cuMemsetD32Async"](marks, 1, WORDS, stream), spoil()], self._capturing(stream))
            self.note(f"after the {how}: end capture answers 901, no longer capturing",
                      [t["cuStreamEndCapture"](stream, ctypes.addressof(graph_cell))], self._capturing(stream))
            self.note(f"after the {how}: the captured work never ran", [t["cuStreamSynchronize"](stream)],
                      self._memory())
        allocated = U64()
        refused = U64()
        begun = t["cuStreamBeginCapture"](stream, GLOBAL)
        relaxed = self._exchange(RELAXED)
        relaxed_alloc = int(t["cuMemAlloc"](ctypes.addressof(allocated), 4096))
        strict = self._exchange(GLOBAL)
        strict_alloc = int(t["cuMemAlloc"](ctypes.addressof(refused), 4096))
        self.note("cuMemAlloc during a GLOBAL capture: allowed in RELAXED mode, 900 in GLOBAL",
                  [begun, relaxed[0], relaxed_alloc, strict[0], strict_alloc],
                  [relaxed[1], allocated.value != 0, strict[1], *self._capturing(stream)])
        self.note("after the refused cuMemAlloc: end capture answers 901",
                  [t["cuStreamEndCapture"](stream, ctypes.addressof(graph_cell)),
                   t["cuMemFree"](allocated.value) if allocated.value else -1], self._capturing(stream))

        # capture where there is none
        self.note("the legacy stream cannot capture; end capture without one", [
            t["cuStreamBeginCapture"](0, GLOBAL), t["cuStreamEndCapture"](stream, ctypes.addressof(graph_cell))],
            self._capturing(0))
        self.note("cuCtxSynchronize_v2 of the context", [t["cuCtxSynchronize_v2"](context)])

        self.note("destroy everything", [
            t["cuGraphExecDestroy"](graph_exec.value), t["cuGraphExecDestroy"](clone_exec.value),
            t["cuGraphDestroy"](graph), t["cuGraphDestroy"](clone.value), t["cuEventDestroy"](event),
            t["cuStreamDestroy"](stream), t["cuStreamDestroy"](blocking),
            *[t["cuMemFree"](pointer) for pointer in self.buffers.values()]])
        return self.out


def fake_table(driver: Any) -> Table:
    """The program's functions over a FakeDriver called directly, as C calls a driver (outputs through the
    out-pointers): pool_kernels' table (page-locked memory registered with the fake) and the calls above."""
    from tests.differential.corpus import fake_table as corpus_table

    table = pool_kernels.fake_table_with_kernels(driver, corpus_table(driver))

    def status_of(name: str) -> Any:
        return lambda *args: int(getattr(driver, name)(*args)[0])

    def with_out(name: str, cell: Any, at: int = 0) -> Any:
        """A C function whose parameter `at` is its one output (a `cell` type), the others its inputs in order."""
        def call(*args: Any) -> int:
            inputs = [*args[:at], *args[at + 1:]]
            status, *values = getattr(driver, name)(*inputs)
            if int(status) == SUCCESS:
                cell.from_address(args[at]).value = int(values[0])
            return int(status)
        return call

    def exchange(address: int) -> int:
        status, previous = driver.cuThreadExchangeStreamCaptureMode(I32.from_address(address).value)
        if int(status) == SUCCESS:
            I32.from_address(address).value = int(previous)
        return int(status)

    kept: list[Any] = []

    def capture_info(stream: int, status: int, ident: int, graph: int, nodes: int, edges: int, count: int) -> int:
        result, *values = driver.cuStreamGetCaptureInfo(stream)
        if int(result) == SUCCESS:
            state, number, made, dependencies, data, many = values
            I32.from_address(status).value = int(state)
            U64.from_address(ident).value = int(number)
            U64.from_address(graph).value = int(made)
            kept.append((U64 * max(len(dependencies), 1))(*[int(n) for n in dependencies]))  # the driver's array
            ctypes.c_void_p.from_address(nodes).value = ctypes.addressof(kept[-1]) if dependencies else None
            kept.append((U64 * max(len(data), 1))())  # default edges: all zero
            ctypes.c_void_p.from_address(edges).value = ctypes.addressof(kept[-1]) if data else None
            ctypes.c_size_t.from_address(count).value = int(many)
        return int(result)

    table.update({
        "cuStreamCreateWithPriority": with_out("cuStreamCreateWithPriority", U64),
        "cuStreamGetFlags": with_out("cuStreamGetFlags", U32, 1),
        "cuStreamGetPriority": with_out("cuStreamGetPriority", I32, 1),
        "cuStreamGetId": with_out("cuStreamGetId", U64, 1),
        "cuStreamIsCapturing": with_out("cuStreamIsCapturing", I32, 1),
        "cuStreamEndCapture": with_out("cuStreamEndCapture", U64, 1),
        "cuStreamGetCaptureInfo": capture_info,
        "cuThreadExchangeStreamCaptureMode": exchange,
        "cuGraphClone": with_out("cuGraphClone", U64),
        "cuGraphInstantiate": with_out("cuGraphInstantiate", U64),
        "cuGraphNodeGetType": with_out("cuGraphNodeGetType", I32, 1),
        **{name: status_of(name) for name in (
            "cuStreamBeginCapture", "cuGraphLaunch", "cuGraphUpload", "cuGraphExecDestroy", "cuGraphDestroy",
            "cuEventRecordWithFlags", "cuEventQuery", "cuEventDestroy", "cuCtxSynchronize_v2")},
    })
    table["_kept_capture_info"] = kept  # type: ignore[assignment]
    return table


def main(argv: list[str]) -> int:
    by_api_name = ("cuGraphInstantiate",) if "instantiate-by-api-name" in argv[1:] else ()
    table = library_table(ctypes.CDLL(argv[0], mode=ctypes.RTLD_GLOBAL), by_api_name)
    transcript = CaptureGraphProgram(table, capture_info="capture-info" in argv[1:],
                                     pinned_copies="pinned-copies" in argv[1:]).run()
    with open("/proc/self/maps") as maps:
        mapped = sorted({line.split()[-1] for line in maps if "/libcuda.so" in line})
    print(json.dumps({"transcript": transcript, "libcuda": mapped}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
