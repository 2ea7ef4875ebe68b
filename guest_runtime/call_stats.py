"""ORION_STATS on the capsule path: the account the native guest driver keeps (guest_runtime/native/call_stats.c,
docs/performance.md "Where the time goes"), for a cuda-python program forwarded without it.

Each driver function the capsule hook forwards is counted under its name with its time, and classed by how it was
served: in the guest (no record sent), posted (records sent, no reply waited for), or round trip (a reply waited
for). A call made while another is under way on the same thread is the outer call's. After cuInit the agent is asked
to count too (a posted STATS), and at exit its STATS answer adds how it served each call's records, and one table
goes to stderr, or to ORION_STATS's path (`%p`: the process id). Without ORION_STATS nothing here runs: activate.py
wraps nothing.

What does not belong here: forwarding itself (forward.py), the hook (capsule_hook.py).
"""
from __future__ import annotations

import functools
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TextIO

from ivshmem.channel import ClientChannel
from ivshmem.driver_api import BY_OPCODE, PINNED_COPY
from ivshmem.errors import WireError
from ivshmem.record import STATS_RELAYED, STATS_REPLY, Op

SETTING = os.environ.get("ORION_STATS", "")
ENABLED = SETTING not in ("", "0")


@dataclass
class Account:
    calls: int = 0
    guest: int = 0
    posted: int = 0
    round_trip: int = 0
    ns: int = 0


@dataclass
class _Scope:
    replies: int = 0
    posts: int = 0


_accounts: dict[str, Account] = {}
_lock = threading.Lock()
_local = threading.local()
_owner = os.getpid()
_started = time.monotonic()
_channel: ClientChannel | None = None  # the process's channel (watch)
_asked = False  # the agent was asked to count (_agent_counts)


def counted(name: str, target: Callable[..., Any]) -> Callable[..., Any]:
    """`target` (a driver function's implementation) counted under `name`."""
    @functools.wraps(target)
    def call(*args: Any) -> Any:
        if getattr(_local, "scope", None) is not None:
            return target(*args)  # inside another counted call: its own
        scope = _local.scope = _Scope()
        started = time.perf_counter_ns()
        try:
            result = target(*args)
            if name == "cuInit" and result == 0:
                _agent_counts()
            return result
        finally:
            elapsed = time.perf_counter_ns() - started
            _local.scope = None
            with _lock:
                account = _accounts.setdefault(name, Account())
                account.calls += 1
                account.ns += elapsed
                if scope.replies:
                    account.round_trip += 1
                elif scope.posts:
                    account.posted += 1
                else:
                    account.guest += 1
    return call


def _agent_counts() -> None:
    """After cuInit (the session's route known, a relayed one's included): a posted STATS, from which the agent
    serving the session times its Python path (an agent never asked times nothing), once."""
    global _asked
    if _channel is not None and not _asked:
        _asked = True
        _channel.post(int(Op.STATS))



def _marked(method: Callable[..., Any], waits: bool) -> Callable[..., Any]:
    @functools.wraps(method)
    def marked(*args: Any, **kwargs: Any) -> Any:
        scope = getattr(_local, "scope", None)
        if scope is not None:
            if waits:
                scope.replies += 1
            else:
                scope.posts += 1
        return method(*args, **kwargs)
    return marked


def watch(channel: ClientChannel) -> None:
    """Class what crosses `channel` by the call under way on the calling thread (the process's one channel)."""
    global _channel
    for name, waits in (("call", True), ("next_reply", True), ("post", False), ("submit", False)):
        setattr(channel, name, _marked(getattr(channel, name), waits))
    _channel = channel



def _host_rows(channel: ClientChannel | None) -> tuple[dict[int, tuple[int, int, int, int, int]], str]:
    """opcode -> (compiled, python, python ns, compiled ns, driver ns) from the agent's STATS answer, or why there is
    none."""
    if channel is None:
        return {}, "the program opened no channel"
    try:
        reply = channel.call(int(Op.STATS))
    except (WireError, OSError) as exc:
        return {}, f"the agent could not be asked ({exc})"
    if not reply.ok:
        return {}, f"the agent did not answer STATS (status {reply.status}; an oriond older than this answers none)"
    (rows,) = STATS_REPLY.decode(reply.payload)
    return {opcode: tuple(columns) for opcode, *columns in rows}, ""


def _label(opcode: int) -> str:
    """The row of a record no call above is named after: the wire's own, the pool's, or the relaying host's
    (STATS_RELAYED), a copy's page-locked variant under its call's name."""
    relayed, opcode = opcode & STATS_RELAYED, opcode & ~STATS_RELAYED
    call = BY_OPCODE.get(opcode)
    pinned = call is None and bool(opcode & PINNED_COPY) and BY_OPCODE.get(opcode - PINNED_COPY) is not None
    if pinned:
        call = BY_OPCODE[opcode - PINNED_COPY]
    known = call.name if call else Op(opcode).name if opcode in {int(o) for o in Op} else ""
    variant = " page-locked" if pinned else ""
    if relayed:
        return f"(relayed {known}{variant})" if known else f"(relayed record {opcode:#x})"
    return f"(record {opcode:#x}{' ' + known if known else ''}{variant})"


def _mean_us(ns: int, n: int, width: int) -> str:
    """A mean in microseconds, or "-" where nothing was counted or timed."""
    return f"{ns * 1e-3 / n:>{width}.2f}" if n and ns else f"{'-':>{width}}"


def _host_columns(compiled: int, python: int, python_ns: int, compiled_ns: int, driver_ns: int) -> str:
    """The agent's columns of one row (call_stats.c's host_columns)."""
    return (f"{compiled:>10} {_mean_us(compiled_ns, compiled, 11)} {_mean_us(driver_ns, compiled, 9)} {python:>10} "
            f"{_mean_us(python_ns, python, 9)}")


def report(out: TextIO | None = None) -> None:
    """The table (call_stats.c's), once, at exit; nothing in a fork child."""
    if os.getpid() != _owner:
        return
    rows, why = _host_rows(_channel)
    by_name = {call.name: opcode for opcode, call in BY_OPCODE.items()}
    with _lock:
        accounts = sorted(_accounts.items(), key=lambda item: -item[1].ns)
    totals = Account(sum(a.calls for _, a in accounts), sum(a.guest for _, a in accounts),
                     sum(a.posted for _, a in accounts), sum(a.round_trip for _, a in accounts),
                     sum(a.ns for _, a in accounts))
    lines = [f"orion-stats: pid {os.getpid()}, {time.monotonic() - _started:.3f} s since forwarding began, "
             f"{totals.calls} calls ({totals.guest} in the guest, {totals.posted} posted, {totals.round_trip} round "
             f"trips), {totals.ns * 1e-9:.3f} s in them (the capsule path)",
             f"{'call':<36} {'calls':>10} {'guest':>10} {'posted':>10} {'round trip':>10} {'total ms':>10} "
             f"{'mean us':>9} | {'compiled':>10} {'compiled us':>11} {'driver us':>9} {'python':>10} {'python us':>9}"]
    shown = set()
    for name, a in accounts:
        host = rows.get(by_name.get(name, -1))
        left = (f"{name:<36} {a.calls:>10} {a.guest:>10} {a.posted:>10} {a.round_trip:>10} {a.ns * 1e-6:>10.3f} "
                f"{a.ns * 1e-3 / a.calls if a.calls else 0:>9.2f} |")
        if host is None:
            lines.append(f"{left} {'-':>10} {'-':>11} {'-':>9} {'-':>10} {'-':>9}")
            continue
        shown.add(by_name[name])
        lines.append(f"{left} {_host_columns(*host)}")
    for opcode, host in sorted(rows.items()):
        if opcode in shown:
            continue
        label = _label(opcode)
        lines.append(f"{label:<36} {'':>10} {'':>10} {'':>10} {'':>10} {'':>10} {'':>9} | {_host_columns(*host)}")
    lines.append("orion-stats: guest = answered in this process; posted = sent without waiting; round trip = waited "
                 "for the agent. compiled/python = the agent's records served by its hot path or in Python (relayed: "
                 "the relaying host's, by its compiled pump or in Python), each with its mean time on the agent; "
                 "driver us = the part of a compiled record's in the CUDA driver"
                 + (f"; agent columns empty: {why}" if why else ""))
    text = "\n".join(lines) + "\n"
    if out is not None:
        out.write(text)
    elif SETTING == "1":
        sys.stderr.write(text)
    else:
        path = SETTING.replace("%p", str(os.getpid()))
        try:
            with open(path, "w", encoding="utf-8") as written:
                written.write(text)
        except OSError as exc:
            sys.stderr.write(f"orion-stats: cannot write {path} ({exc.strerror}); the table follows here\n{text}")
