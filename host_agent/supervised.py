"""Processes oriond supervises: a region's supervisor and the relay listener (SupervisedProcess, oriond's side of
one), and the rule every process oriond forks follows: it dies with the process that forked it (die_with_parent).

Why a module of its own: region serving (daemon/) and the relay listener (relay/) both run sessions in processes
oriond watches, and neither may import the other. What does not belong here: what such a process does.
"""
from __future__ import annotations

import contextlib
import ctypes
import logging
import multiprocessing
import os
import signal
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)
_MP = multiprocessing.get_context("fork")
PR_SET_PDEATHSIG = 1
STOP_TIMEOUT_S = 10.0


def die_with_parent(signum: int) -> None:
    """Have the kernel send `signum` to this process when the process that forked it ends, however it ends."""
    parent = os.getppid()
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signum)
    if os.getppid() != parent:  # it ended before the request was in place
        os.kill(os.getpid(), signum)


class SupervisedProcess:
    """oriond's side of a process that runs sessions (a region's supervisor, the relay listener): the process,
    and the pipe on which its workers' notes and its ended sessions come."""

    def __init__(self, target: Callable[..., None], args: tuple[Any, ...], name: str) -> None:
        """`target(*args, events)` is the process's body; `events` the sending end of the pipe."""
        self.events, events = _MP.Pipe(duplex=False)
        self.process = _MP.Process(target=target, name=name, args=(*args, events))
        self.process.start()
        events.close()
        self.pending: dict[int, list[str]] = {}  # session -> what its worker noted, until the session ends

    @property
    def pid(self) -> int:
        return self.process.pid or 0

    def ended_sessions(self) -> list[tuple[int, list[str]]]:
        """(session, notes) of every session that ended since the last call; never blocks."""
        ended = []
        with contextlib.suppress(EOFError, OSError):
            while self.events.poll():
                kind, session, text = self.events.recv()
                if kind == "note":
                    self.pending.setdefault(session, []).append(text)
                elif kind == "ended":
                    ended.append((session, self.pending.pop(session, [])))
        return ended

    def exitcode(self) -> int | None:
        """None while it runs."""
        return self.process.exitcode

    def orphaned_notes(self) -> list[str]:
        """After the process ended: what its sessions noted and no ended event covered (their workers died
        with it)."""
        self.ended_sessions()
        notes = [text for texts in self.pending.values() for text in texts]
        self.pending.clear()
        return notes

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """Ask it to end its sessions (a region: and mark the region stopped); kill it if it does not within
        `timeout`."""
        if self.process.exitcode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGTERM)
            self.process.join(timeout)
            if self.process.exitcode is None:
                log.warning("%s did not stop within %g s; killed", self.process.name, timeout)
                self.process.kill()
                self.process.join(timeout)

    def close(self) -> None:
        self.events.close()
