"""The libvirt qemu hook: `HOOK DOMAIN OPERATION SUBOP EXTRA`, with the domain XML on stdin.

libvirt runs it (installed by `orion-hooks install` as /etc/libvirt/hooks/qemu.d/orion-vgpu) for every
domain at every step, so everything that is not `prepare` or `release` of a domain with an Orion region
returns 0 at once, before the heavier imports, touching nothing. On failure it prints exactly one line on
stderr and exits non-zero: libvirt puts that line in the error the user sees and, on prepare, refuses to
start the domain. On success its notes go to stderr too, which libvirt only keeps in its debug log.

Environment: ORION_SERVER_CONF (default /etc/orion/server.conf: shm_path_base, the QEMU user and group) and
ORION_PID_FILE (default /run/orion/oriond.pid: the agent to wake). The installed hook script sets both.
It never calls libvirt: libvirt holds its locks while running a hook.
"""
from __future__ import annotations

import os
import sys
from typing import BinaryIO

from ivshmem.shared.ini import SERVER_CONF

SERVER_CONF_ENV = "ORION_SERVER_CONF"
OPERATIONS = ("prepare", "release")
PREFIX = "Orion vGPU hook"
USAGE = 2


def main(argv: list[str] | None = None, stdin: BinaryIO | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) < 2:
        print(f"{PREFIX}: usage: qemu_hook DOMAIN OPERATION [SUBOP EXTRA] < domain.xml (libvirt runs this)",
              file=sys.stderr)
        return USAGE
    domain, operation = args[0], args[1]
    # Read all of stdin whatever the operation: libvirt writes the XML to every hook, and a hook that exits
    # without reading it only relies on libvirt ignoring the broken pipe.
    xml = (stdin or sys.stdin.buffer).read()
    if operation not in OPERATIONS or b"orionsock" not in xml:
        return 0
    try:
        notes = run(domain, operation, xml)
    except Exception as exc:  # one line for libvirt, whatever went wrong
        from .regions import HookError

        if isinstance(exc, HookError):
            print(f"{PREFIX}: {operation} of domain {domain} failed: {exc}", file=sys.stderr)
        else:
            print(f"{PREFIX}: {operation} of domain {domain} failed unexpectedly: {type(exc).__name__}: {exc}",
                  file=sys.stderr)
        return 1
    for note in notes:
        print(f"{PREFIX}: {domain} {operation}: {note}", file=sys.stderr)
    return 0


def run(domain: str, operation: str, xml: bytes) -> list[str]:
    """Prepare or release the Orion regions of the domain in `xml`; returns notes for the log."""
    from host_agent.daemon import pidfile
    from host_agent.server_conf import ConfigError, ShmSettings

    from . import regions

    uuid, found = regions.domain_regions(xml)
    if not found:
        return []
    conf = os.environ.get(SERVER_CONF_ENV) or SERVER_CONF
    try:
        settings = ShmSettings.load(conf)
    except ConfigError as exc:
        raise regions.HookError(str(exc)) from None
    state_dir = os.path.dirname(pidfile.default_path())  # /run/orion, with the agent's pid file
    if operation == "prepare":
        try:
            notes = regions.prepare(domain, found, settings)
        except regions.HookError:
            regions.mark_failed_start(state_dir, uuid)
            raise
        regions.take_failed_start(state_dir, uuid)  # a stale mark from an earlier failed start
    elif regions.take_failed_start(state_dir, uuid):
        return ["kept every region as it was: this start failed in prepare, so the domain never used them"]
    else:
        notes = regions.release(found, settings)
    return [*notes, regions.wake_agent(pidfile.default_path())]


if __name__ == "__main__":
    sys.exit(main())
