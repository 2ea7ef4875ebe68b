"""The two guest clients send the same records: the native `libcuda.so.1` (the guest client) and the capsule path's
`Forwarder` (guest_runtime/forward.py, kept as the reference), held byte-identical as tests/unit/test_hot_dispatch.py
holds the host's compiled dispatch to its Python path. CPU only: no GPU, no driver.

How: one recording host (tests/guest_clients.py: a real RegionServer whose sessions record every request record raw
and answer it as the call table declares, with values derived from the request's bytes alone) serves one region; the
native library runs tests/guest_clients.py's program in a child process (ctypes, ORION_SHM naming the region) while
the capsule path runs the same program here (`Forwarder.implementations()`, connected as activate.py connects it).
A marker record before each step splits each session's records by step; for each step the records must be equal --
opcode, the NO_REPLY flag and every payload byte -- and so must what the program saw (statuses and outputs).

What the program holds:
- every generic call of the table (`DriverCall.generic`), by construction: each with arguments generated from its
  parameters' types (scalars, enums, handles; `out` pointers to sentinel cells, `inout` cells holding a value),
  distinct per position, once with typical values, once with values at the ends of each type's range, and once with
  NULL outputs (both must answer CUDA_ERROR_INVALID_VALUE without a record, unless cuda.h lets every one of them
  be NULL: `DriverCall.optional_outputs`, then both forward the call and skip them);
- hand-written calls whose payloads both sides build by hand: copies of sizes from 0 bytes through the ring slot's
  edge to past a staging chunk, copies with page-locked pool memory (the pinned variants; the pool's POOL_MAP and
  bookkeeping calls), unified-addressing cuMemcpy, module and library loads (PTX, fatbin, ELF, an image
  asked for by digest first, JIT and library options), functions, kernels and globals by name, launches
  (kernelParams by the layout the host gives, an `extra` buffer, 3004 parameter bytes, a CUkernel, cooperative,
  cuLaunchKernelEx with and without attributes, layouts forgotten at an unload), occupancy (with a callback: the
  search in the guest), pointer and pool attributes, contexts, device names, UUIDs, error texts, and calls both
  refuse without a record;
- graph nodes, which only the native library forwards (forward.py NATIVE_ONLY): held to the request the table's own
  codec encodes from the same arguments (`Step.reference`).

Handles are not normalised: neither client maps handles, and the host's replies are a function of the request, so
both clients are handed the same handle numbers and send them back unchanged; a difference in a handle is a
difference. Page-locked pool addresses are: each client maps the region, and so its pool slice, at an address of its
own, which it proposes in POOL_MAP; an address inside the slice is compared as its offset from that proposal
(`pool_offsets`, POOL_ADDRESSES). The STAGED flag is not compared: it says whether a payload crossed in the slot or
in staging chunks, a transport choice (both make the same one today). Where the clients legitimately differ, the
records are left out of the comparison by a named reason (`LEGITIMATE`), and a test fails if such a difference stops
happening; real differences are strict expected failures (`DEFECTS`, with what each sends).
"""
from __future__ import annotations

import contextlib
import itertools
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from ivshmem.driver_api import BY_OPCODE, CALLS, IMAGE_BY_DIGEST, PINNED_COPY, POOL_MAP_OPCODE
from ivshmem.record import HELLO_REQUEST, Flag, Op
from tests.forwarding_rig import native_child_env
from tests.guest_clients import (
    NATIVE_STEPS,
    OWN_STREAM_COPY,
    CapsuleApi,
    Capture,
    Rec,
    RecordingHost,
    Step,
    program,
    read_captures,
    run_program,
)

REPO = Path(__file__).resolve().parents[2]
REGION_SIZE = 32 << 20
CHILD_TIMEOUT_S = 120
FLAGS_COMPARED = Flag.NO_REPLY | Flag.ASYNC_ERROR  # STAGED: how the payload crossed, not what it is
SET_CURRENT = CALLS["cuCtxSetCurrent"].opcode
# What both clients post before a call to make the host thread's state the calling thread's: its current context,
# and its capture interaction mode while a capture may run.
FOLLOWS = (SET_CURRENT, CALLS["cuThreadExchangeStreamCaptureMode"].opcode)
# Generic calls both clients answer themselves with typical values (a valid capture mode is kept per thread in the
# guest: native/capture_state.c, forward.py).
KEPT_IN_GUEST = frozenset({"cuThreadExchangeStreamCaptureMode"})


@dataclass(frozen=True)
class Legit:
    """A difference by design in one step: records of these calls that only one client sends."""
    reason: str
    capsule_only: tuple[str, ...] = ()
    native_only: tuple[str, ...] = ()


CONTEXT_CHECKED_ONCE = ("the native library checks a context with the host once (one it made or already checked: "
                        "docs/native-driver.md, 'Making a context current is a check, not state'); the capsule path "
                        "checks at every cuCtxSetCurrent/cuCtxPushCurrent")
HOST_CONTEXT_FOLLOWS = ("the consequence of the unchecked push or set before it: the native library's host context "
                        "is still the one it last told the host, so it posts cuCtxSetCurrent before the next call; "
                        "the capsule path's check already made it current there")
ANSWERED_IN_GUEST = ("the native library answers a query it has asked once from its guest-side cache "
                     "(device_answers.c; docs/native-driver.md, 'Queries answered in the guest'); the capsule path "
                     "asks every time")

# step label -> why the clients differ there (only the records of the calls named are left out, on that side).
LEGITIMATE: dict[str, Legit] = {
    "cuCtxPushCurrent of the context made by cuCtxCreate": Legit(CONTEXT_CHECKED_ONCE,
                                                                 capsule_only=("cuCtxSetCurrent",)),
    "cuCtxSynchronize after the pops": Legit(HOST_CONTEXT_FOLLOWS, native_only=("cuCtxSetCurrent",)),
    "cuCtxSetCurrent of the context made by cuCtxCreate": Legit(CONTEXT_CHECKED_ONCE,
                                                                capsule_only=("cuCtxSetCurrent",)),
    "cuCtxSynchronize after cuCtxSetCurrent": Legit(HOST_CONTEXT_FOLLOWS, native_only=("cuCtxSetCurrent",)),
    "cuDeviceGetName 5 bytes, asked again": Legit(ANSWERED_IN_GUEST + ": the whole name, cut to the caller's length",
                                                  capsule_only=("cuDeviceGetName",)),
    "cuDriverGetVersion (extreme values)": Legit(ANSWERED_IN_GUEST + " (a call without inputs: the same question)",
                                                 capsule_only=("cuDriverGetVersion",)),
    "cuDeviceGetCount (extreme values)": Legit(ANSWERED_IN_GUEST + " (a call without inputs: the same question)",
                                               capsule_only=("cuDeviceGetCount",)),
}

# step label -> a real difference between the clients' encodings (what each sends), kept as a strict expected
# failure until one side is fixed. None found when this suite was written.
DEFECTS: dict[str, str] = {}


def record_name(opcode: int) -> str:
    base = opcode & ~(PINNED_COPY | IMAGE_BY_DIGEST)
    if base in BY_OPCODE:
        name = BY_OPCODE[base].name
    else:
        name = "POOL_MAP" if opcode == POOL_MAP_OPCODE else Op(opcode).name if opcode in set(Op) else f"{opcode:#x}"
        return name
    return name + (" (pinned)" if opcode & PINNED_COPY else "") + (" (by digest)" if opcode & IMAGE_BY_DIGEST else "")


def describe(record: Rec) -> str:
    head = record.payload[:48].hex() + ("…" if len(record.payload) > 48 else "")
    return f"{record_name(record.opcode)} flags {record.flags:#x}, {len(record.payload)} bytes {head}"


def compared(record: Rec) -> tuple[int, int, bytes]:
    return record.opcode, record.flags & FLAGS_COMPARED, record.payload


def payload_difference(expected: bytes, got: bytes) -> str:
    at = next((i for i, (a, b) in enumerate(zip(expected, got, strict=False)) if a != b), min(len(expected), len(got)))
    start = max(0, at - 8)
    return (f"payloads of {len(expected)} and {len(got)} bytes first differ at byte {at}: "
            f"{expected[start:at + 24].hex()} vs {got[start:at + 24].hex()} (from byte {start})")


def differences(expected: list[Rec], got: list[Rec], names: tuple[str, str] = ("capsule", "native")) -> list[str]:
    """What differs between two record lists, one line per record; [] when they agree."""
    problems = []
    for index, (a, b) in enumerate(itertools.zip_longest(expected, got)):
        if a is None:
            problems.append(f"record {index}: only the {names[1]} client sends {describe(b)}")
        elif b is None:
            problems.append(f"record {index}: only the {names[0]} client sends {describe(a)}")
        elif compared(a) != compared(b):
            if (a.opcode, a.flags & FLAGS_COMPARED) != (b.opcode, b.flags & FLAGS_COMPARED):
                problems.append(f"record {index}: {names[0]} {describe(a)}; {names[1]} {describe(b)}")
            else:
                problems.append(f"record {index} ({record_name(a.opcode)}): "
                                f"{payload_difference(a.payload, b.payload)}")
    return problems


POOL_ADDRESSES = ("a page-locked pool address is where this process mapped its slice of the region (each client "
                  "maps it at its own address, which it tells the host in POOL_MAP): compared as its offset in the "
                  "slice")
# Records naming a pool address, and where in the payload: POOL_MAP's proposal, the host pointer of a copy's pinned
# variant (its last field), and the pointer the pool's bookkeeping calls name.
POOL_ADDRESS_AT = {POOL_MAP_OPCODE: 0, **{CALLS[name].opcode | PINNED_COPY: -8 for name in
                                          ("cuMemcpyHtoD", "cuMemcpyDtoH", "cuMemcpyHtoDAsync", "cuMemcpyDtoHAsync")},
                   **{CALLS[name].opcode: 0 for name in ("cuMemFreeHost", "cuMemHostGetDevicePointer",
                                                         "cuMemHostGetFlags")}}
SLICE_AT_MOST = 1 << 32


def pool_base(capture: Capture) -> int | None:
    """The slice address the client proposed in its POOL_MAP (None: it never mapped the pool)."""
    for records in capture.steps:
        for record in records:
            if record.opcode == POOL_MAP_OPCODE:
                return int.from_bytes(record.payload[:8], "little")
    return None


def pool_offsets(records: list[Rec], base: int | None) -> list[Rec]:
    """`records` with every pool address (POOL_ADDRESS_AT) inside the slice replaced by its offset from `base`
    (POOL_ADDRESSES); anything else, an address outside the slice included, as sent."""
    out = []
    for record in records:
        at = POOL_ADDRESS_AT.get(record.opcode)
        if base is not None and at is not None and len(record.payload) >= 8:
            start = at % len(record.payload)
            value = int.from_bytes(record.payload[start:start + 8], "little")
            if base <= value < base + SLICE_AT_MOST:
                payload = record.payload[:start] + (value - base).to_bytes(8, "little") + record.payload[start + 8:]
                record = record._replace(payload=payload)
        out.append(record)
    return out


def without(records: list[Rec], calls: tuple[str, ...]) -> tuple[list[Rec], int]:
    """`records` less those of `calls`, and how many were left out."""
    opcodes = {CALLS[name].opcode for name in calls}
    kept = [r for r in records if r.opcode not in opcodes]
    return kept, len(records) - len(kept)


@dataclass
class Captured:
    steps: list[Step]
    capsule: Capture
    native: Capture
    capsule_seen: list[Any]
    native_seen: list[Any]
    seconds: float
    region: str = ""
    log_dir: Path = field(default_factory=Path)

    def index(self, label: str) -> int:
        return next(i for i, step in enumerate(self.steps) if step.label == label)

    def check(self, label: str) -> list[str]:
        """The differences of one step, after leaving out its named legitimate ones."""
        i = self.index(label)
        capsule = pool_offsets(self.capsule.steps[i], pool_base(self.capsule))
        native = pool_offsets(self.native.steps[i], pool_base(self.native))
        legit = LEGITIMATE.get(label)
        if legit is not None:
            capsule, _ = without(capsule, legit.capsule_only)
            native, _ = without(native, legit.native_only)
        problems = differences(capsule, native)
        if self.capsule_seen[i] != self.native_seen[i]:
            problems.append(f"the program saw {json.dumps(self.capsule_seen[i])[:400]} through the capsule path, "
                            f"{json.dumps(self.native_seen[i])[:400]} through the native library")
        return problems


def _plain(value: Any) -> Any:
    """What the program saw, as the native child reports it (JSON: tuples become lists)."""
    return json.loads(json.dumps(value))


def run_capsule(region: str, log_dir: Path, api: CapsuleApi | None = None) -> list[Any]:
    """The program through the capsule path, in this process, on `region`."""
    with pytest.MonkeyPatch.context() as patch:
        for name in [name for name in os.environ if name.startswith("ORION_")]:
            patch.delenv(name)
        patch.setenv("ORION_SHM", region)
        api = api or CapsuleApi()
        try:
            return _plain(run_program(api, program()))
        finally:
            api.close()


@pytest.fixture(scope="module")
def captured(library: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Captured]:
    """Both clients through the program, concurrently, against one recording host."""
    region = f"/dev/shm/orion-agree-{uuid.uuid4().hex}"
    fd = os.open(region, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, REGION_SIZE)
    finally:
        os.close(fd)
    log_dir = tmp_path_factory.mktemp("agree")
    host = None
    try:
        started = time.monotonic()
        host = RecordingHost(region, log_dir)
        child = subprocess.Popen([sys.executable, "-m", "tests.guest_clients", "native", str(library)],
                                 env=native_child_env(library, region), cwd=REPO, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
        try:
            capsule_seen = run_capsule(region, log_dir)
            out, err = child.communicate(timeout=CHILD_TIMEOUT_S)
        finally:
            if child.poll() is None:
                child.kill()
                child.communicate()
        assert child.returncode == 0, f"the native client failed ({child.returncode}):\n{err[-4000:]}"
        line = next(line for line in out.splitlines() if line.startswith("SEEN "))
        native_seen = json.loads(line[len("SEEN "):])
        captures = read_captures(log_dir)
        assert set(captures) == {"capsule", "native"}, f"sessions recorded: {sorted(captures)}"
        yield Captured(program(), captures["capsule"], captures["native"], capsule_seen, native_seen,
                       time.monotonic() - started, region, log_dir)
    finally:
        if host is not None:
            host.stop()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(region)


def _params(labels: list[str]) -> list[Any]:
    return [pytest.param(label, id=label, marks=pytest.mark.xfail(strict=True, reason=DEFECTS[label]))
            if label in DEFECTS else pytest.param(label, id=label) for label in labels]


GENERIC_CALLS = [call.name for call in CALLS.values() if call.generic]
HAND_LABELS = [step.label for step in program() if step.kind == "hand"]
NATIVE_LABELS = [step.label for step in NATIVE_STEPS]


# --- the whole table, and nothing outside the steps ---------------------------------------------------------------

def test_every_generic_call_of_the_table_is_in_the_program() -> None:
    steps = program()
    generic = [step for step in steps if step.kind == "generic"]
    assert {step.call for step in generic} == set(GENERIC_CALLS)
    with_outputs = sum(1 for name in GENERIC_CALLS if any(p.role in ("out", "inout") for p in CALLS[name].params))
    assert len(generic) == 2 * len(GENERIC_CALLS) + with_outputs
    assert len({step.label for step in steps + NATIVE_STEPS}) == len(steps) + len(NATIVE_STEPS)
    assert set(LEGITIMATE) <= {step.label for step in steps} and set(DEFECTS) <= {step.label for step in steps}


def test_both_sessions_begin_with_the_same_hello_and_end_with_the_program(captured: Captured) -> None:
    """HELLO (the pid aside), then only the program's steps: every record either client sent is in a step."""
    hellos = []
    for capture in (captured.capsule, captured.native):
        assert [r.opcode for r in capture.preamble] == [Op.HELLO]
        protocol, _pid, host, calls = HELLO_REQUEST.decode(capture.preamble[0].payload)
        hellos.append((protocol, host, calls))
        assert capture.ended and capture.steps[-1] == [], "records after the end marker"
    assert hellos[0] == hellos[1]
    assert len(captured.capsule.steps) == len(captured.steps) + 1  # and the end marker's
    assert len(captured.native.steps) == len(captured.steps) + len(NATIVE_STEPS) + 1


# --- the generic calls ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", _params(GENERIC_CALLS))
def test_a_generic_call_sends_the_same_records(captured: Captured, name: str) -> None:
    """Typical and extreme arguments: one record of the call each (unless the native library answers from its cache:
    LEGITIMATE, or both keep it in the guest: KEPT_IN_GUEST), equal bytes; NULL outputs: no record from either."""
    labels = [step.label for step in captured.steps if step.kind == "generic" and step.call == name]
    problems = [f"{label}: {problem}" for label in labels for problem in captured.check(label)]
    assert not problems, "\n".join(problems)
    opcode = CALLS[name].opcode
    outputs = {n for n, p in enumerate(CALLS[name].params) if p.role in ("out", "inout")}
    for label in labels:
        i = captured.index(label)
        sent = [r.opcode for r in captured.capsule.steps[i]]
        if label.endswith("(NULL outputs)") and not outputs <= CALLS[name].optional_outputs:
            assert sent == [], f"{label}: {sent}"
            assert captured.capsule_seen[i][0] == 1  # CUDA_ERROR_INVALID_VALUE
        elif label == name and name in KEPT_IN_GUEST:
            assert sent == [], f"{label}: {sent}"
        else:
            assert opcode in sent, f"{label}: the call sent no record of its own: {sent}"
            assert sent.count(opcode) == 1 and all(op in (opcode, *FOLLOWS) for op in sent), f"{label}: {sent}"


# --- hand-written calls ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("label", _params(HAND_LABELS))
def test_a_hand_written_call_sends_the_same_records(captured: Captured, label: str) -> None:
    problems = captured.check(label)
    assert not problems, "\n".join(problems)


def test_a_small_copy_on_a_stream_of_the_programs_own_is_posted_until_it_is_destroyed(captured: Captured) -> None:
    """Issue 30: both clients post a small copy to the device on a stream the process made (NO_REPLY: it returns once
    its bytes are taken, as on a default stream), and wait for the host's answer once the stream is destroyed."""
    i = captured.index(OWN_STREAM_COPY)
    copy = CALLS["cuMemcpyHtoDAsync"].opcode
    for capture in (captured.capsule, captured.native):
        copies = [r for r in capture.steps[i] if r.opcode == copy]
        assert [bool(r.flags & Flag.NO_REPLY) for r in copies] == [True, False], copies


@pytest.mark.parametrize("label", _params(NATIVE_LABELS))
def test_a_graph_node_call_sends_what_the_table_encodes(captured: Captured, label: str) -> None:
    """Calls the capsule path does not forward: the native library's records against the table codec's encoding."""
    step = next(step for step in NATIVE_STEPS if step.label == label)
    assert step.reference is not None
    i = len(captured.steps) + NATIVE_LABELS.index(label)
    problems = differences(step.reference(), captured.native.steps[i], ("table codec", "native"))
    assert not problems, "\n".join(problems)
    seen = captured.native_seen[i]
    assert set(seen["statuses"]) == {0} and all(seen["nodes"]), seen


def test_every_legitimate_difference_still_happens(captured: Captured) -> None:
    """A named difference that no longer occurs is stale: take it out of LEGITIMATE (the clients now agree there)."""
    stale = []
    for label, legit in LEGITIMATE.items():
        i = captured.index(label)
        _, dropped_capsule = without(captured.capsule.steps[i], legit.capsule_only)
        _, dropped_native = without(captured.native.steps[i], legit.native_only)
        if (legit.capsule_only and not dropped_capsule) or (legit.native_only and not dropped_native):
            stale.append(label)
    assert not stale, f"no longer differ: {stale}"


# --- the comparison itself can fail ----------------------------------------------------------------------------------

def test_one_byte_changed_in_one_clients_encoding_is_caught(captured: Captured) -> None:
    """The capsule path run again with the last byte of every cuMemPoolSetAttribute request flipped on its way to
    the ring: exactly that step differs from the native library's, at that byte, and every other step agrees."""
    target = CALLS["cuMemPoolSetAttribute"].opcode

    def flip_one(channel: Any) -> Any:
        call = channel.call

        def flipped(opcode: int, payload: Any = b"", sink: Any = None) -> Any:
            if opcode == target:
                payload = bytes(payload[:-1]) + bytes([payload[-1] ^ 0x01])
            return call(opcode, payload, sink=sink)
        channel.call = flipped
        return channel

    api = CapsuleApi(around_channel=flip_one)
    api.client = "capsule-flipped"
    seen = run_capsule(captured.region, captured.log_dir, api)
    flipped = read_captures(captured.log_dir)["capsule-flipped"]
    again = Captured(captured.steps, flipped, captured.native, seen, captured.native_seen, 0.0)
    failing = {step.label: again.check(step.label) for step in captured.steps}
    failing = {label: problems for label, problems in failing.items() if problems}
    label = "cuMemPoolSetAttribute of int and cuuint64_t attributes"
    assert list(failing) == [label], list(failing)
    assert all("first differ at byte 19" in problem for problem in failing[label]), failing[label]
    assert len(failing[label]) == 4  # its four requests (the NULL value sends none)


def test_the_suite_runs_in_seconds(captured: Captured) -> None:
    assert captured.seconds < 60, f"both clients took {captured.seconds:.1f} s"
