"""`orion-k8s-plugin`: kubelet's device plugin for Orion vGPUs on this node (docs/kubernetes.md).

Orion's flag is kept (``-controller HOST:PORT``, single dash); the others are ours and take either spelling.
The node's name in the pool, the regions' directory and size come from server.conf, as oriond reads them, so
that one file configures both; the flags override it.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys

from ivshmem.shared.ini import ConfigError, normal_address
from ivshmem.shared.version import version_line

from ..daemon.cli_args import OneLineParser, flag_type
from ..daemon.config import DEFAULT_PATH, ServerConfig, flag_host, flag_seconds
from ..stop import StopRequest
from .api import DEVICE_PLUGIN_DIR, RESOURCE_NAME
from .container_regions import ContainerRegions, RegionDirError
from .devices import DeviceBoard
from .plugin import Endpoint, PluginServer
from .pool_watch import POLL_S, PoolWatch
from .service import DevicePluginService

log = logging.getLogger("orion-k8s-plugin")


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = OneLineParser(prog="orion-k8s-plugin", description=f"Advertise this node's Orion vGPUs to kubelet as "
                           f"{RESOURCE_NAME} and set up the containers that get them")
    parser.add_argument("--version", action="version", version=version_line("orion-k8s-plugin"))
    parser.add_argument("-controller", "--controller", type=flag_type(normal_address, "controller"),
                        metavar="HOST:PORT",
                        help="the Orion Controller (default: ORION_CONTROLLER, else server.conf's controller_addr, "
                             "else 127.0.0.1:9123); containers are given the same address")
    parser.add_argument("-config", "--config", metavar="FILE", default=DEFAULT_PATH,
                        help="oriond's server.conf on this node (default %(default)s; Orion's defaults if missing)")
    parser.add_argument("-node", "--node", type=flag_type(flag_host, "node"), metavar="NAME",
                        help="this host's name in the controller's pool (default: server.conf's bind_addr, as "
                             "oriond registers it)")
    parser.add_argument("-region-dir", "--region-dir", metavar="DIR",
                        help="where the containers' regions are made (default: server.conf's shm_path_base, which "
                             "oriond serves); a directory only this plugin's user may enter, whose path no other "
                             "user can change (docs/kubernetes.md)")
    parser.add_argument("-device-plugin-dir", "--device-plugin-dir", metavar="DIR", default=DEVICE_PLUGIN_DIR,
                        help="kubelet's device-plugin directory (default %(default)s)")
    parser.add_argument("-pid-file", "--pid-file", metavar="FILE", default="",
                        help="oriond's pid file, to wake it when a region is made (default: oriond's default)")
    parser.add_argument("-poll", "--poll", type=flag_type(flag_seconds, "seconds"), metavar="S", default=POLL_S,
                        help="how often to ask the controller for this node's vGPUs (default %(default)s s)")
    args = parser.parse_args(argv)
    if os.path.exists(args.config) and not os.path.isfile(args.config):
        parser.error(f"-config {args.config}: not a file; give the path of oriond's server.conf")
    return args


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s [%(levelname)s] %(message)s")
    try:
        config = ServerConfig.load(args.config)
    except ConfigError as exc:
        print(f"orion-k8s-plugin: Error in {args.config}: {exc}", file=sys.stderr)
        return 1
    controller = args.controller or config.controller_addr
    node = args.node or config.bind_addr
    regions = ContainerRegions(args.region_dir or config.shm.path_base, config.shm.buffer_size_mib, args.pid_file)
    try:
        regions.prepare()
    except RegionDirError as exc:
        hint = "" if args.region_dir else (" (it is server.conf's shm_path_base: on a Kubernetes node set it, for "
                                           "oriond and this plugin alike, to a directory of its own such as "
                                           "/dev/shm/orion-k8s/; docs/kubernetes.md)")
        print(f"orion-k8s-plugin: {exc}{hint}", file=sys.stderr)
        return 1
    log.info("orion-k8s-plugin: node %s, Orion Controller %s, regions in %s, kubelet's directory %s", node,
             controller, regions.directory, args.device_plugin_dir)
    if regions.directory != (config.shm.path_base.rstrip("/") or "/"):
        log.warning("-region-dir %s is not shm_path_base %s of %s: oriond serves only the latter, so set them to the "
                    "same directory", regions.directory, config.shm.path_base, args.config)
    stop = StopRequest().on_signals()
    board = DeviceBoard()
    watch = PoolWatch(controller, node, board, args.poll).start()
    service = DevicePluginService(board, regions, controller, stopping=stop)
    try:
        PluginServer(Endpoint(args.device_plugin_dir), service, stop).run()
    finally:
        watch.stop()
    log.info("orion-k8s-plugin stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
