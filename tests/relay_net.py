"""Two network namespaces joined by a veth pair, for the relayed-session tests (docs/remote.md, issue 14).

    orion-ra-<pid> (10.231.0.1, veth ora<pid>)  <== veth ==>  orion-rb-<pid> (10.231.0.2, veth orb<pid>)

The relaying oriond (a region's supervisor) runs in A and the GPU host's (the relay listener, over the fake driver
where no GPU exists) in B, so relayed records cross a real kernel network path that a test can take down
(`link(False)`: the veth end in B goes down) while both processes keep running. The namespaces are made once per
test process, as root, and removed at its exit; a process joins one with `enter()` (setns), which is why the
processes that serve are forked: the pytest process itself never changes namespace. The names carry the pid of
the test process that made them, so two test processes (a pytest and the one test_relayed_suite.py starts, or two
checkouts' runs on one machine) never make, use or remove each other's.
"""
from __future__ import annotations

import atexit
import ctypes
import os
import shutil
import subprocess

RELAY_NS, GPU_NS = f"orion-ra-{os.getpid()}", f"orion-rb-{os.getpid()}"
RELAY_IF, GPU_IF = f"ora{os.getpid()}", f"orb{os.getpid()}"  # at most 15 characters: pids have at most 7 digits
RELAY_IP, GPU_IP = "10.231.0.1", "10.231.0.2"
CLONE_NEWNET = 0x40000000
_made = False


def why_not() -> str:
    """Why this machine cannot make the namespaces ("" when it can)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "iproute2's ip is not installed"
    return ""


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


def ensure() -> None:
    """Make the namespaces and the veth pair (again, if a previous run left them half made)."""
    global _made
    if _made:
        return
    remove()
    _ip("netns", "add", RELAY_NS)
    _ip("netns", "add", GPU_NS)
    _ip("link", "add", RELAY_IF, "netns", RELAY_NS, "type", "veth", "peer", "name", GPU_IF, "netns", GPU_NS)
    for ns, name, address in ((RELAY_NS, RELAY_IF, RELAY_IP), (GPU_NS, GPU_IF, GPU_IP)):
        _ip("-n", ns, "addr", "add", f"{address}/30", "dev", name)
        _ip("-n", ns, "link", "set", name, "up")
        _ip("-n", ns, "link", "set", "lo", "up")
    _made = True
    atexit.register(remove)


def remove() -> None:
    for ns in (RELAY_NS, GPU_NS):
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


def link(up: bool) -> None:
    """Take the GPU host's end of the veth pair down (False) or up again: the link drops, nobody dies. Up again, the
    neighbour entries the outage left FAILED are flushed, as a healed network's would expire: else a connect in
    the next seconds gets `No route to host` from the stale entry, not from the network."""
    _ip("-n", GPU_NS, "link", "set", GPU_IF, "up" if up else "down")
    if up:
        _ip("-n", RELAY_NS, "neigh", "flush", "dev", RELAY_IF)
        _ip("-n", GPU_NS, "neigh", "flush", "dev", GPU_IF)


def enter(namespace: str) -> None:
    """Move this process (all its later sockets) into `namespace`."""
    fd = os.open(f"/run/netns/{namespace}", os.O_RDONLY)
    try:
        if ctypes.CDLL(None, use_errno=True).setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns {namespace}")
    finally:
        os.close(fd)
