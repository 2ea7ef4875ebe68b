"""The stream captures under way in this process, which thread began each, and each thread's capture interaction
mode: what the capsule path needs to give every guest thread the driver's capture rules, though the host runs all of
them on one thread (native twin: native/capture_state.c).

cuda.h prohibits a thread's potentially unsafe calls while a capture runs when the thread's capture interaction
mode is GLOBAL and it began a capture not RELAXED or another thread began a GLOBAL one, or its mode is THREAD_LOCAL
and it began a capture not RELAXED; and only the thread that began a capture not RELAXED may end it
(CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD). The host thread began every capture, so the mode it is given before each
call while a capture may run (`presented`) is GLOBAL exactly when the calling thread would be prohibited (the
capture that prohibits it is the host thread's too) and RELAXED otherwise. Past KEPT captures at once, the calling
thread's own mode is given instead.

Each thread's own mode decides only what it may call while a capture is under way, so it is exchanged here without
a round trip (`exchange`; NCCL exchanges it about 740 times at each communicator's start).

Not here: forwarding (forward.py posts the mode `presented` names when it differs from `host_mode`)."""
from __future__ import annotations

import threading

GLOBAL, THREAD_LOCAL, RELAXED = 0, 1, 2  # CUstreamCaptureMode
ENDING = frozenset({0, 901, 904})  # cuStreamEndCapture's statuses that end a capture: success, invalidated, unjoined
KEPT = 64


class CaptureOwners:
    """Captures begun and not ended (true while any may run), with the thread and mode that began each."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count = 0  # never below the true number: a capture whose stream the program destroyed stays counted
        self._owners: dict[int, tuple[int, int]] = {}  # stream -> (thread ident, mode)
        self._lost = False  # a capture under way began past KEPT
        self._modes = threading.local()  # each thread's own mode (`mode`; absent: GLOBAL, CUDA's default)
        self.host_mode = GLOBAL  # the host thread's, as forward.py last set it

    def __bool__(self) -> bool:
        return self._count > 0

    def began(self, stream: int, mode: int) -> None:
        """A capture of `stream` began on this thread in `mode` (the driver said so)."""
        with self._lock:
            self._count += 1
            if stream in self._owners or len(self._owners) < KEPT:
                self._owners[stream] = (threading.get_ident(), mode)
            else:
                self._lost = True

    def ended(self, stream: int, status: int) -> None:
        """cuStreamEndCapture of `stream` answered `status`."""
        if status not in ENDING:
            return
        with self._lock:
            self._count = max(0, self._count - 1)
            self._owners.pop(stream, None)
            if not self._count:
                self._owners.clear()
                self._lost = False

    def begun_elsewhere(self, stream: int) -> bool:
        """Whether another thread began `stream`'s capture, not RELAXED: its end here is the wrong thread's."""
        with self._lock:
            owner = self._owners.get(stream)
        return owner is not None and owner[0] != threading.get_ident() and owner[1] != RELAXED

    def exchange(self, mode: int) -> int:
        """cuThreadExchangeStreamCaptureMode of a valid mode: this thread's mode is `mode`; the one before it."""
        previous = getattr(self._modes, "mode", GLOBAL)
        self._modes.mode = mode
        return previous

    def presented(self) -> int:
        """The host thread's mode that makes the driver's rule this thread's."""
        mode = getattr(self._modes, "mode", GLOBAL)
        if mode == RELAXED:
            return mode
        me = threading.get_ident()
        with self._lock:
            if self._lost:
                return mode
            own_strict = any(thread == me and began != RELAXED for thread, began in self._owners.values())
            other_global = any(thread != me and began == GLOBAL for thread, began in self._owners.values())
        return GLOBAL if own_strict or (mode == GLOBAL and other_global) else RELAXED
