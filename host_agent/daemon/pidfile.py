"""oriond's pid file: written by oriond, read by the libvirt qemu hook to send it SIGHUP ("rescan now").

Kept apart from oriond.py so that the hook, which must start fast and never import the executor, can read
it. A pid file is only a hint: the pid it names counts only while that process is alive and is an oriond
(its command line says so), so a stale file left by a killed agent, or a pid reused by another program,
is never signalled. Nothing here fails oriond: without a pid file the agent still rescans every second.
"""
from __future__ import annotations

import contextlib
import os
import signal

from ..errors import ServiceError

DEFAULT_PID_FILE = "/run/orion/oriond.pid"
PID_FILE_ENV = "ORION_PID_FILE"  # read by oriond (default of --pid-file) and by the hook
AGENT_NAME = "oriond"


def default_path() -> str:
    """The pid file to use when none is given: $ORION_PID_FILE, else /run/orion/oriond.pid."""
    return os.environ.get(PID_FILE_ENV) or DEFAULT_PID_FILE


class PidFileTaken(ServiceError, OSError):
    """The pid file names another running oriond; it is left alone."""


def write(path: str) -> None:
    """Record this process's pid in `path` (atomically: a reader never sees a half-written number).

    A file naming another live oriond is not taken over (PidFileTaken): the first agent keeps it, so a
    second one started by hand or by a test never leaves the real agent without its pid file."""
    other = running_agent(path)
    if other is not None and other != os.getpid():
        raise PidFileTaken(f"it names oriond pid {other}, which is still running")
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, mode=0o755, exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write(f"{os.getpid()}\n")
    os.replace(tmp, path)


def remove(path: str) -> None:
    """Remove `path` if it still names this process (another oriond may have taken it over meanwhile)."""
    if read_pid(path) == os.getpid():
        with contextlib.suppress(OSError):
            os.unlink(path)


def read_pid(path: str) -> int | None:
    """The pid a pid file names, or None: no file, or anything but ASCII digits in it (the file is anyone's to point
    ORION_PID_FILE at: '²' passes str.isdigit and fails int, bytes that are not UTF-8 fail the read)."""
    try:
        with open(path, "rb") as f:
            text = f.read(32).strip()
    except OSError:
        return None
    return int(text) if text.isdigit() and 0 < int(text) < 1 << 31 else None


def running_agent(path: str) -> int | None:
    """The pid in `path` if that process is alive and is an oriond; otherwise None."""
    pid = read_pid(path)
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        return None  # no such process
    names = {os.path.basename(arg.decode(errors="replace")) for arg in argv[:3]}
    return pid if any(AGENT_NAME in name for name in names) else None


def notify(path: str) -> int | None:
    """Send SIGHUP to the oriond named by `path`; its pid, or None when no oriond runs."""
    pid = running_agent(path)
    if pid is None:
        return None
    try:
        os.kill(pid, signal.SIGHUP)
    except ProcessLookupError:
        return None
    return pid
