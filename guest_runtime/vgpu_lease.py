"""vGPUs from the Orion Controller for a process on the native guest driver (docs/native-driver.md, "vGPUs").

The native driver has no Python of its own to run allocation.py's request, keep-alive thread and release at exit,
and a program that loads it need not be Python at all. So when ORION_VGPU is set it starts this helper at its
first connection, after asking the agent for its host name (AGENT_INFO), and the helper holds the lease for the
process's lifetime:

    python -c '...vgpu_lease.main...' WHERE HOST [--predates]

stdout, one line: ``ALLOCATION <id>`` (the driver then sends BIND), ``NONE`` (no controller configured or
ORION_VGPU unset: the session keeps the agent's defaults, as on the capsule path) or ``ERROR <reason>``. Then it
reads stdin, which the driver holds open for the life of its process: an ``abandon`` line gives the grant back
unannounced (the agent refused BIND); end of file (the process is gone, however it ended) releases the grant
with Orion's exit line, or says the client exits without an allocation, as activate.py's exit handler does.
"""
from __future__ import annotations

import sys

from . import allocation
from .client_config import ClientConfigError


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) not in (2, 3) or args[2:] not in ([], ["--predates"]):
        print("usage: vgpu_lease WHERE HOST [--predates]", file=sys.stderr)
        return 2
    where, host, predates = args[0], args[1], args[2:] == ["--predates"]
    granted = failed = False
    try:
        alloc = allocation.acquire_configured(lambda: allocation.serving_host(host, where, not predates))
        granted = alloc is not None
        print(f"ALLOCATION {alloc.id}" if alloc is not None else "NONE", flush=True)
    except (ClientConfigError, allocation.AllocationError) as exc:
        failed = True
        print("ERROR " + " ".join(str(exc).split()), flush=True)
    for line in sys.stdin:
        if line.strip() == "abandon" and granted:
            allocation.abandon()
            granted, failed = False, True
    if failed:
        allocation.say_exit_without_allocation()
    allocation.release_at_exit()
    return 0


if __name__ == "__main__":
    sys.exit(main())
