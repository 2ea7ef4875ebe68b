"""`oriond`: the Orion host agent (thin: parses flags, loads the config, runs the agent).

Orion's flags are kept (-n -b -p -r -i -m -k -d, ORION-COMPAT.md §6.3); `--config`, `--region`, `--gmem`,
`--devices`, `--pid-file` and `--rescan-interval` are ours. SIGHUP asks the agent to rescan its regions at
once: the libvirt qemu hook sends it, through the pid file, after creating or removing a region.

When server.conf's [controller] controller_addr (or ORION_CONTROLLER) names an Orion Controller, this host's
GPUs are registered there and kept alive by heartbeats on a thread of their own (controller_link.py); without
one, oriond only serves its regions, as before.
"""
from __future__ import annotations

import argparse
import logging
import signal
import sys

from ivshmem.orion_conf import ConfigError

from . import controller_link, pidfile
from .agent import RESCAN_S, Agent
from .config import DEFAULT_PATH, ServerConfig
from .executor import ExecutorOptions
from .region_server import ServerOptions
from .stop import StopRequest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="oriond", description="Orion Server: runs forwarded CUDA calls on "
                                                                "this host's GPUs")
    parser.add_argument("-n", type=int, metavar="N", help="the maximum number of clients (accepted, unused)")
    parser.add_argument("-b", metavar="IP", help="bind IP address (TCP transport: not in this release)")
    parser.add_argument("-p", type=int, metavar="PORT", help="listen port (TCP transport: not in this release)")
    parser.add_argument("-m", action="store_true", help="enable shared memory acceleration (the default)")
    parser.add_argument("-k", action="store_true", help="enable shared memory for QEMU-KVM guests")
    parser.add_argument("-r", action="store_true", help="enable RDMA (not in this release)")
    parser.add_argument("-i", action="store_true", help="enable ibverbs for RDMA (not in this release)")
    parser.add_argument("-d", action="store_true", help="run as a daemon (use your service manager instead)")
    parser.add_argument("--config", default=DEFAULT_PATH, help="server configuration (default %(default)s)")
    parser.add_argument("--region", action="append", help="serve this region file only (repeatable)")
    parser.add_argument("--gmem", type=int, metavar="MiB", help="memory quota of each vGPU of a session "
                        "without a controller allocation (default: device memory / vgpu_count)")
    parser.add_argument("--devices", help="comma-separated physical GPU ordinals sessions may use")
    parser.add_argument("--pid-file", default=pidfile.default_path(),
                        help="where to write our pid, for the libvirt hook's SIGHUP (default %(default)s; "
                             "ORION_PID_FILE sets the default)")
    parser.add_argument("--rescan-interval", type=float, default=RESCAN_S, metavar="S",
                        help="how often to look for new or removed regions (default %(default)s s); SIGHUP "
                             "rescans at once")
    args = parser.parse_args(argv)
    try:
        config = ServerConfig.load(args.config)
    except ConfigError as exc:
        print(f"oriond: Error in orion.conf: {exc}", file=sys.stderr)
        return 1
    if args.r or args.i:
        print("oriond: RDMA is not available in this release; serving shared memory only", file=sys.stderr)
    logging.basicConfig(level=config.log_level, format="%(asctime)s [%(levelname)s] %(message)s")
    if config.path is None:
        logging.info("No configuration file is found. Use default settings and environment variables.")
    devices = tuple(int(d) for d in args.devices.split(",")) if args.devices else None
    stop = StopRequest().on_signals()
    link = None
    if config.controller_configured:
        link = controller_link.start(config.controller_addr, config.bind_addr, config.listen_port,
                                     config.vgpu_count)
    executor = ExecutorOptions(devices=devices, gmem_mib=args.gmem, vgpu_count=config.vgpu_count,
                               controller=config.controller_addr if link else "", host=config.bind_addr)
    agent = Agent(config, executor, regions=args.region, options=ServerOptions(), stop=stop,
                  rescan_s=args.rescan_interval, release=link.release_later if link else None)
    # Before the pid file exists: SIGHUP's default action would end the process.
    signal.signal(signal.SIGHUP, lambda *_: agent.request_refresh())
    try:
        pidfile.write(args.pid_file)
    except OSError as exc:
        logging.warning("not writing the pid file %s (%s): the libvirt hook cannot wake this agent, which "
                        "still finds new regions within %s s", args.pid_file, exc.strerror or exc,
                        args.rescan_interval)
    try:
        agent.run()
    finally:
        if link is not None:
            link.stop()
        pidfile.remove(args.pid_file)
    return 0


if __name__ == "__main__":
    sys.exit(main())
