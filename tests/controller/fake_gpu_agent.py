"""A host agent with made-up GPUs for the guest-allocation tests: the real oriond parts, only the driver faked.

``python tests/controller/fake_gpu_agent.py REGION HOST [CONTROLLER]`` serves REGION with host_agent.daemon.agent.Agent,
whose sessions run the real CudaExecutor over tests/fake_driver.FakeDriver (two GPUs), and, given CONTROLLER,
links to it with the real ControllerLink: registers the fake GPUs under HOST (their UUIDs as the executor will
read them), heartbeats, and gives back the allocations of sessions that end. It logs as oriond does, to
stderr, and stops on SIGTERM. CI has no GPU; everything else a guest's allocation goes through is real here.

``... REGION HOST [CONTROLLER] --listen PORT`` also runs the relay listener as oriond does: it listens on
HOST:PORT (HOST is then an IP address: it is the bind address as well as the host's name) for sessions other
hosts' orionds relay here, served by the same fake-driver executor, and registers PORT with the controller as
the port those orionds dial (docs/remote.md). Without --listen it listens nowhere and registers port 9960.
``--rdma DEVICE`` turns enable_rdma on with ibverbs_device DEVICE (``any``: none named), as server.conf does.
``--log-dir DIR``: log as oriond's [server-log] log_dir = DIR does (server.log and the session logs there, and
stderr), instead of stderr alone. ``--key-file PATH``: the cluster key the link and the session workers sign with
as member HOST, as oriond's [cluster] key_file (without it they sign nothing, and a controller refuses them); the
relay listener admits the orionds that prove they hold it (without it, the tests' fixed key: tests/cluster_key.py).
"""
from __future__ import annotations

import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from controller.cluster_key import load_key  # noqa: E402
from host_agent.daemon.agent import Agent  # noqa: E402
from host_agent.daemon.config import ServerConfig  # noqa: E402
from host_agent.daemon.controller_link import ControllerLink, LinkProcess, load_member  # noqa: E402
from host_agent.relay.listener import Admission, listen_socket  # noqa: E402
from host_agent.relay.transport import RdmaSettings  # noqa: E402
from host_agent.server_log import LogSettings, configure  # noqa: E402
from host_agent.session import vgpu_grant  # noqa: E402
from host_agent.session.executor import CudaExecutor, ExecutorOptions  # noqa: E402
from host_agent.session.gpu_inventory import of_driver  # noqa: E402
from host_agent.session_loop import ServerOptions  # noqa: E402
from host_agent.stop import StopRequest  # noqa: E402
from tests.cluster_key import TEST_KEY  # noqa: E402
from tests.fake_driver import FakeDriver  # noqa: E402

GPUS = 2


def fake_driver() -> FakeDriver:
    driver = FakeDriver(devices=GPUS)
    driver.cuInit(0)  # as executor._load_driver does
    return driver


def main(region: str, host: str, controller: str = "", listen_port: int | None = None, rdma: str | None = None,
         key_file: str = "", log_dir: str = "") -> int:
    if log_dir:
        configure(LogSettings(directory=log_dir))
    else:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s [%(levelname)s] %(message)s", stream=sys.stderr)
    stop = StopRequest().on_signals()
    # The listener admits holders of the cluster key (docs/security.md): --key-file's, else the tests' fixed one.
    key = load_key(Path(key_file)) if key_file else TEST_KEY
    listen = listen_socket(host, listen_port, Admission(key, require_allocation=bool(controller))) \
        if listen_port is not None else None
    config = ServerConfig(None, enable_rdma=rdma is not None, ibverbs_device=rdma or "")
    if listen is not None:
        logging.info("Orion Server listens on %s:%d for relayed sessions; %s", host, listen_port,
                     RdmaSettings(config.enable_rdma, config.ibverbs_device).startup_line())
    # In a process of its own, as oriond runs it: this process forks the region's supervisor.
    port = listen_port if listen_port is not None else 9960
    member = load_member(key_file, host) if key_file else None
    vgpu_grant.sign_as(member)
    link = LinkProcess(ControllerLink(controller, host, port, 4, of_driver(fake_driver()), member)) if controller \
        else None
    options = ExecutorOptions(controller=controller, host=host)
    agent = Agent(config, options, regions=[region], options=ServerOptions(heartbeat_timeout=5.0),
                  stop=stop, release=link.release_later if link else None, listen=listen)
    agent.factory = lambda session: CudaExecutor(session, options, driver=fake_driver())  # type: ignore[assignment]
    try:
        agent.run()
    finally:
        if link is not None:
            link.stop()
    return 0


def _arguments(argv: list[str]) -> tuple[str, str, str, int | None, str | None, str, str]:
    """REGION, HOST, CONTROLLER ("" without it), --listen's port (None without it), --rdma's device (None
    without --rdma, "" for any device), --key-file's path and --log-dir's ("" without them)."""
    paths = {"--key-file": "", "--log-dir": ""}
    for flag in paths:
        if flag in argv:
            at = argv.index(flag)
            if at + 1 >= len(argv):
                sys.exit(f"fake_gpu_agent.py: {flag} needs a path")
            argv, paths[flag] = argv[:at] + argv[at + 2:], argv[at + 1]
    rdma = None
    if "--rdma" in argv:
        at = argv.index("--rdma")
        if at + 1 >= len(argv):
            sys.exit("fake_gpu_agent.py: --rdma needs a device name, or 'any'")
        argv, rdma = argv[:at] + argv[at + 2:], ("" if argv[at + 1] == "any" else argv[at + 1])
    port = None
    if "--listen" in argv:
        at = argv.index("--listen")
        if at + 1 >= len(argv):
            sys.exit("fake_gpu_agent.py: --listen needs a port")
        argv, port = argv[:at] + argv[at + 2:], int(argv[at + 1])
    if not 2 <= len(argv) <= 3:
        sys.exit("usage: fake_gpu_agent.py REGION HOST [CONTROLLER] [--listen PORT] [--rdma DEVICE|any] "
                 "[--key-file PATH] [--log-dir DIR]")
    region, host, controller = (*argv, "")[:3]
    return region, host, controller, port, rdma, paths["--key-file"], paths["--log-dir"]


if __name__ == "__main__":
    sys.exit(main(*_arguments(sys.argv[1:])))
