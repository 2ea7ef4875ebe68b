"""The whole driver API by construction: every entry point cuda.h declares is forwarded, answered in the guest or
unsupported with a reason (ivshmem/api_classes.py), and the inventory it is read from is cuda.h's."""
from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest
from cuda.bindings import driver

from guest_runtime.native import gen_libcuda
from host_agent.session.session_ledger import SessionLedger
from ivshmem import api_classes, cuda_header
from ivshmem.cuda_status import INVALID_VALUE
from ivshmem.driver_api import (
    CALLS,
    GENERATED,
    OUT,
    UNCLASSIFIED,
    UNSUPPORTED,
    classification,
)

BASE = 0x7F00_0000_0000


class CountingUsage:
    """The ledger's Usage, counting nothing (the quota is not what these tests hold)."""

    def allocated(self, size: int, device: int | None = None) -> int:
        return 0

    def freed(self, device: int, size: int) -> None:
        pass

    def may_have_changed(self) -> None:
        pass


NATIVE_SOURCES = Path(gen_libcuda.__file__).resolve().parent  # the native driver's C files
CUDA_H = next((p for p in (Path("/usr/local/cuda/include/cuda.h"), *Path("/usr/local").glob("cuda-*/include/cuda.h"))
               if p.exists()), None)


def test_every_entry_point_is_classified_once() -> None:
    classes = classification()
    assert not [name for name, (kind, _) in classes.items() if kind == UNCLASSIFIED]
    hand = set(CALLS) - set(api_classes.GENERATED)
    assert not set(api_classes.GENERATED) & hand, "a generated call is in the hand table too"
    assert not set(api_classes.GUEST) & set(CALLS), "a call answered in the guest outside the table is in it"
    doubly = [name for name in [*CALLS, *api_classes.GUEST] if api_classes.unsupported_reason(name) is not None]
    assert not doubly, f"forwarded or answered, yet matched by an UNSUPPORTED pattern: {doubly}"
    assert set(CALLS) <= set(classes) and set(api_classes.GUEST) <= set(classes)


def test_every_unsupported_pattern_names_something() -> None:
    """A pattern that matches no entry point is a stale reason."""
    names = cuda_header.read().entry_points
    for pattern, _reason in api_classes.UNSUPPORTED:
        assert any(re.match(pattern, name) for name in names), pattern


@pytest.mark.skipif(CUDA_H is None, reason="no cuda.h (the CUDA toolkit's headers) on this machine")
def test_the_inventory_holds_every_entry_point_of_cuda_h_as_declared() -> None:
    assert CUDA_H is not None
    header = cuda_header.parse(CUDA_H.read_text())
    kept = cuda_header.read()
    assert len(header.entry_points) > 400
    missing = sorted(set(header.entry_points) - set(kept.entry_points))
    assert not missing, f"regenerate: python -m guest_runtime.native.gen_libcuda --inventory {CUDA_H} ({missing[:5]})"
    differ = {n: (s, kept.entry_points[n]) for n, s in header.entry_points.items() if kept.entry_points[n] != s}
    assert not differ, differ
    assert header.enums <= kept.enums and header.handles <= kept.handles


def test_the_inventory_spells_signatures_as_the_wheel_does() -> None:
    wheel = gen_libcuda.wheel_signatures()
    kept = cuda_header.read().entry_points
    assert {n: (s, wheel[n]) for n, s in kept.items() if n in wheel and wheel[n] != s} == {}
    assert set(wheel) <= set(kept), "regenerate the inventory: the wheel declares entry points it lacks"


def test_the_parser_reads_declarations_as_cuda_h_writes_them() -> None:
    text = """
    typedef struct CUfoo_st *CUfoo;
    typedef enum CUbar_enum { CU_BAR_A = 0 } CUbar;
    typedef unsigned long long CUbaz_v1;
    typedef CUbaz_v1 CUbaz;
    /* cuNotOne is a comment */
    CUresult CUDAAPI cuOne(CUfoo *out, const char *name, const void *data, unsigned int n, unsigned flags);
    __CUDA_DEPRECATED CUresult CUDAAPI cuTwo(void);
    CUresult CUDAAPI cuThree(CUbaz values[], const CUfoo *const list, unsigned long long count);
    #if defined(__CUDA_API_VERSION_INTERNAL)
    #if 1
    CUresult CUDAAPI cuOld(int);
    #endif
    CUresult CUDAAPI cuOlder(int);
    #endif
    """
    inventory = cuda_header.parse(text)
    assert inventory.entry_points == {
        "cuOne": "CUresult (CUfoo *, char const *, void const *, unsigned int, unsigned int)",
        "cuTwo": "CUresult (void)",
        "cuThree": "CUresult (CUbaz *, CUfoo const *, unsigned PY_LONG_LONG)",
    }
    assert "CUfoo" in inventory.handles and "CUbar" in inventory.enums
    assert inventory.scalars["CUbaz"] == "unsigned PY_LONG_LONG"


def test_the_parser_finds_the_parameters_cuda_h_lets_a_caller_leave_null() -> None:
    text = r"""
    /**
     * Both parameters \p pbase and \p psize are optional. If one
     * of them is NULL, it is ignored.
     *
     * \param pbase - Returned base address
     * \param psize - Returned size
     * \param dptr  - Device pointer to query
     */
    CUresult CUDAAPI cuRange(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr);
    /**
     * A NULL may be passed in for \p *least or \p *greatest if the value is not desired.
     * \param least    - Pointer to an int
     * \param greatest - Pointer to an int
     */
    CUresult CUDAAPI cuRangeOfInts(int *least, int *greatest);
    /**
     * \p nodes may be NULL, in which case this function will return the number of nodes in \p numNodes.
     * \param offset - Returns the offset
     * \param size   - Optionally returns the size
     * \param nodes  - Pointer to return the nodes
     * \param numNodes - See description
     */
    CUresult CUDAAPI cuInfo(size_t *offset, size_t *size, int *nodes, size_t *numNodes);
    /**
     * Returns in \p *pctx the current context. If none is bound, \p *pctx is set to NULL.
     * \param pctx  - Returned context handle
     * \param name  - Returned NULL-terminated name
     */
    CUresult CUDAAPI cuCurrent(CUcontext *pctx, char *name);
    """
    assert cuda_header.parse(text).optional == {"cuInfo": (1, 2), "cuRange": (0, 1), "cuRangeOfInts": (0, 1)}


@pytest.mark.skipif(CUDA_H is None, reason="no cuda.h (the CUDA toolkit's headers) on this machine")
def test_the_inventory_holds_the_outputs_cuda_h_lets_a_caller_leave_null() -> None:
    assert CUDA_H is not None
    header = cuda_header.parse(CUDA_H.read_text())
    assert header.optional.items() <= cuda_header.read().optional.items(), \
        f"regenerate: python -m guest_runtime.native.gen_libcuda --inventory {CUDA_H}"
    for name, indices in {"cuMemGetAddressRange": (0, 1), "cuModuleGetGlobal": (0, 1), "cuLinkComplete": (2,),
                          "cuCtxGetStreamPriorityRange": (0, 1), "cuKernelGetParamInfo": (3,)}.items():
        assert header.optional[name] == indices, name
    assert not {"cuCtxGetCurrent", "cuDeviceGetPCIBusId", "cuMemGetInfo", "cuMemAlloc"} & set(header.optional)


# Hand-written native calls with an output cuda.h lets a caller leave NULL: each honours it (the generated calls do
# by construction, guest_runtime/native/gen_libcuda.py). A new one fails the test below until it is looked at.
NULL_OUTPUTS_BY_HAND = {
    "cuCtxGetStreamPriorityRange": "context_answers.c; tests/wire/test_native_memory_calls.py (null_outputs)",
    "cuModuleGetGlobal": "module_calls.c: either output may be NULL",
    "cuLibraryGetGlobal": "module_calls.c: either output may be NULL",
    "cuLinkComplete": "link_calls.c: sizeOut written only if given",
    "cuStreamGetCaptureInfo": "answered_in_guest.c: each optional output written only if given",
    "cuGraphGetEdges": "graph_calls.c: cuda.h's pairings of NULL arrays",
    "cuGraphGetNodes": "graph_calls.c: NULL nodes asks for the count",
    "cuGraphGetRootNodes": "graph_calls.c: NULL nodes asks for the count",
    "cuGraphNodeGetDependencies": "graph_calls.c: NULL arrays ask for the count",
    "cuGraphNodeGetDependentNodes": "graph_calls.c: NULL arrays ask for the count",
}


def test_every_hand_written_call_with_an_output_cuda_h_lets_be_null_was_looked_at() -> None:
    sources = "\n".join(path.read_text() for path in NATIVE_SOURCES.glob("*.c"))
    inventory = cuda_header.read()
    found = set()
    for name, indices in inventory.optional.items():
        types = inventory.entry_points[name].removeprefix("CUresult (").removesuffix(")").split(", ")
        outputs = [i for i in indices if types[i].endswith("*") and "const" not in types[i]]
        if outputs and re.search(rf"^CUresult(?: CUDAAPI)? {name}\(", sources, re.M):
            found.add(name)
    assert found == set(NULL_OUTPUTS_BY_HAND)


@pytest.mark.parametrize("name", sorted(api_classes.GENERATED))
def test_a_generated_call_is_marshalled_whole_and_its_memory_is_bounded(name: str) -> None:
    call = CALLS[name]
    assert call.generic, f"{name}: a parameter the generic marshalling cannot carry"
    assert classification()[name][0] == GENERATED
    for position, param in enumerate(call.params):
        if param.ctype == "CUdeviceptr" and param.role != OUT:  # the host holds the range it reaches to the session
            assert position in dict(call.spans), f"{name}: device pointer argument {position} has no span"
    function = getattr(driver, name, None)
    if function is not None:  # the host's cuda-python takes exactly the request's values, in order
        taken = [p for p in inspect.signature(function).parameters.values()]
        assert len(taken) == len(call.input_positions), (name, taken)


def test_an_unsupported_entry_point_says_why() -> None:
    for name, (kind, reason) in classification().items():
        if kind == UNSUPPORTED:
            assert len(reason) > 30, name
    assert "managed memory" in classification()["cuMemAllocManaged"][1]


@pytest.mark.parametrize("name", sorted(n for n, o in api_classes.GENERATED.items() if o.get("spans")))
def test_the_host_holds_a_generated_calls_whole_device_range_to_the_sessions_memory(name: str) -> None:
    """Each declared span is what the ledger checks: a device pointer at the base of a 4 KiB allocation passes with
    counts of 1; at its last byte, with large counts, it is refused (INVALID_VALUE, before the driver)."""
    book = SessionLedger((0,), CountingUsage())
    book.record(CALLS["cuMemAlloc"], (4096,), [BASE])
    call = CALLS[name]
    for pointer, count, expected in ((BASE, 1, None), (BASE + 4095, 1 << 20, INVALID_VALUE)):
        args = tuple(pointer if call.params[p].base == "CUdeviceptr" else count for p in call.input_positions)
        for position, _span in call.spans:
            assert book.check(call, position, "CUdeviceptr", pointer, args) == expected, (name, position, count)
