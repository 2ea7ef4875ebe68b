"""CUDA's per-thread context stacks, kept in the guest.

A process has one channel and the host runs its calls on one thread, which has one current context. CUDA's
contexts are current per thread, so the guest keeps each thread's stack itself: cuCtxGetCurrent, Push and Pop are
answered here, and before a call goes out the host's current context is set to the calling thread's (one posted
cuCtxSetCurrent, only when threads with different contexts take turns). Threads are told apart by
`threading.get_ident()` (pthread_self): a `threading.local` would be reset between two trampoline calls on a
thread Python did not create.
"""
from __future__ import annotations

import threading

UNKNOWN = -1  # the host's current context after a call that may have changed it in ways we do not mirror


class ContextStacks:
    def __init__(self) -> None:
        self._stacks: dict[int, list[int]] = {}
        self.host_current = 0  # what the host thread has current (UNKNOWN: must be set before the next call)

    def _stack(self) -> list[int]:
        return self._stacks.setdefault(threading.get_ident(), [])

    def current(self) -> int:
        stack = self._stacks.get(threading.get_ident())
        return stack[-1] if stack else 0

    def set_current(self, ctx: int) -> None:
        """cuCtxSetCurrent: replace the top (NULL pops it; on an empty stack, a NULL changes nothing)."""
        stack = self._stack()
        if stack:
            stack.pop()
        if ctx:
            stack.append(ctx)

    def push(self, ctx: int) -> None:
        self._stack().append(ctx)

    def pop(self) -> int | None:
        stack = self._stack()
        return stack.pop() if stack else None

    def destroyed(self, ctx: int) -> None:
        """cuCtxDestroy: popped from the calling thread's stack if it is its current context."""
        stack = self._stack()
        if stack and stack[-1] == ctx:
            stack.pop()
        self.host_current = UNKNOWN
