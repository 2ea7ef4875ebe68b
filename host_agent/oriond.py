"""`oriond`: the Orion host agent (thin: parses flags, loads the config, runs the agent).

Orion's flags are kept (-n -b -p -r -i -m -k -d, ORION-COMPAT.md §6.3); `--config`, `--region`, `--gmem`
and `--devices` are ours.
"""
from __future__ import annotations

import argparse
import logging
import sys

from ivshmem.orion_conf import ConfigError

from .agent import Agent
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
    parser.add_argument("--gmem", type=int, metavar="MiB", help="memory quota per session (default: device "
                                                                 "memory / vgpu_count)")
    parser.add_argument("--devices", help="comma-separated physical GPU ordinals sessions may use")
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
    Agent(config, ExecutorOptions(devices=devices, gmem_mib=args.gmem, vgpu_count=config.vgpu_count),
          regions=args.region, options=ServerOptions(), stop=stop).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
