"""`orion-wire-demo`: the smaller demonstration beside the README's main job (setup.sh's KVM demo) — a region, the host
side, and a client process, without libvirt.

Everything runs as it would for a user, in separate processes through the real commands: `orion-shm create`
makes and formats the region, the region server serves it, `orion-guest probe` (a client process) exchanges
records through it and prints the round trip, and `orion-shm remove` cleans up. It picks a free region index
from 100 upwards so it never touches a region someone else made.
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time

from ivshmem import layout
from ivshmem.region import Region, region_path
from ivshmem.shared.version import version_line

FIRST_INDEX = 100


def _run(*args: str) -> None:
    print("$", " ".join(args), flush=True)
    subprocess.run(args, check=True)


def _free_index() -> int:
    for index in range(FIRST_INDEX, 10000):
        if not os.path.exists(region_path(index)):
            return index
    raise RuntimeError("no free orionsock index between 100 and 9999 in /dev/shm")


def _wait_serving(path: str, server: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    with Region.open(path) as region:
        while region.agent_words()[2] != layout.AGENT_SERVING:
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the region server did not start serving {path}")
            time.sleep(0.05)


def run_demo(size_mib: int = 64) -> None:
    bindir = os.path.dirname(sys.executable)
    index = _free_index()
    path = region_path(index)
    _run(os.path.join(bindir, "orion-shm"), "create", "-i", str(index), "-s", str(size_mib))
    print(f"$ {sys.executable} -m host_agent.daemon.region_server {path} &", flush=True)
    server = subprocess.Popen([sys.executable, "-m", "host_agent.daemon.region_server", path])
    try:
        _wait_serving(path, server)
        _run(os.path.join(bindir, "orion-shm"), "inspect", str(index))
        _run(os.path.join(bindir, "orion-guest"), "probe", "--region", path)
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(10)
        _run(os.path.join(bindir, "orion-shm"), "remove", str(index))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="orion-wire-demo", description=__doc__.split("\n\n")[0].replace("\n", " "))
    parser.add_argument("--version", action="version", version=version_line("orion-wire-demo"))
    parser.parse_args(argv)
    try:
        run_demo()
    except (subprocess.CalledProcessError, RuntimeError) as exc:
        print(f"orion-wire-demo: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
