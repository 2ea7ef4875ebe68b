"""A host agent with made-up GPUs for the guest-allocation tests: the real oriond parts, only the driver faked.

``python tests/controller/fake_gpu_agent.py REGION HOST [CONTROLLER]`` serves REGION with host_agent.agent.Agent,
whose sessions run the real CudaExecutor over tests/fake_driver.FakeDriver (two GPUs), and, given CONTROLLER,
links to it with the real ControllerLink: registers the fake GPUs under HOST (their UUIDs as the executor will
read them), heartbeats, and gives back the allocations of sessions that end. It logs as oriond does, to
stderr, and stops on SIGTERM. CI has no GPU; everything else a guest's allocation goes through is real here.
"""
from __future__ import annotations

import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from host_agent.agent import Agent  # noqa: E402
from host_agent.config import ServerConfig  # noqa: E402
from host_agent.controller_link import ControllerLink, LinkProcess  # noqa: E402
from host_agent.executor import CudaExecutor, ExecutorOptions  # noqa: E402
from host_agent.gpu_inventory import of_driver  # noqa: E402
from host_agent.region_server import ServerOptions  # noqa: E402
from host_agent.stop import StopRequest  # noqa: E402
from tests.fake_driver import FakeDriver  # noqa: E402

GPUS = 2


def fake_driver() -> FakeDriver:
    driver = FakeDriver(devices=GPUS)
    driver.cuInit(0)  # as executor._load_driver does
    return driver


def main(region: str, host: str, controller: str = "") -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s [%(levelname)s] %(message)s", stream=sys.stderr)
    stop = StopRequest().on_signals()
    # In a process of its own, as oriond runs it: this process forks the region's supervisor.
    link = LinkProcess(ControllerLink(controller, host, 9960, 4, of_driver(fake_driver()))) if controller else None
    options = ExecutorOptions(controller=controller, host=host)
    agent = Agent(ServerConfig(None), options, regions=[region], options=ServerOptions(heartbeat_timeout=5.0),
                  stop=stop, release=link.release_later if link else None)
    agent.factory = lambda session: CudaExecutor(session, options, driver=fake_driver())  # type: ignore[assignment]
    try:
        agent.run()
    finally:
        if link is not None:
            link.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
