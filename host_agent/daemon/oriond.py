"""`oriond`: the Orion host agent (thin: parses flags, loads the config, runs the agent).

Orion's flags are kept (-n -b -p -r -i -m -k -d, as Orion's oriond takes them); `--config`, `--region`, `--gmem`,
`--devices`, `--pid-file` and `--rescan-interval` are ours. SIGHUP asks the agent to rescan its regions at
once: the libvirt qemu hook sends it, through the pid file, after creating or removing a region.

When server.conf's [controller] controller_addr (or ORION_CONTROLLER) names an Orion Controller, this host's
GPUs are registered there and kept alive by heartbeats on a thread of their own (controller_link.py); without
one, oriond only serves its regions, as before.

Remote GPU hosts (docs/remote.md): when listen_port is set (server.conf or -p), oriond listens on
bind_addr:listen_port for sessions the orionds of other members of the cluster relay here, each proving it holds
the cluster key ([cluster] key_file, docs/security.md); a port already taken or a key it cannot use is one error
line, and the regions are served regardless. Its own sessions are relayed to another host when their controller
allocation was granted there, or, with `[server-relay] remote_addr`, always to that host.
"""
from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from dataclasses import replace

from controller.cluster_key import ClusterKeyError, load_key
from ivshmem.shared.version import version_line

from .. import server_log
from ..relay.listener import Admission, ListeningSocket, listen_socket
from ..relay.route import RelayRoute, host_name
from ..relay.transport import RdmaSettings
from ..server_conf import ConfigError
from ..session import vgpu_grant
from ..session.executor import ExecutorOptions
from ..session_loop import ServerOptions
from ..stop import StopRequest
from . import controller_link, metrics_server, mps, pidfile
from .agent import RESCAN_S, Agent
from .cli_args import OneLineParser, flag_type
from .config import DEFAULT_PATH, ServerConfig, flag_count, flag_devices, flag_host, flag_port, flag_seconds


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = OneLineParser(prog="oriond", description="Orion Server: runs forwarded CUDA calls on this host's GPUs")
    parser.add_argument("--version", action="version", version=version_line("oriond"))
    count = flag_type(lambda text: flag_count(text, "a number of clients"), "count")
    parser.add_argument("-n", type=count, metavar="N", help="the maximum number of clients (accepted, unused)")
    parser.add_argument("-b", type=flag_type(flag_host, "address"), metavar="IP",
                        help="bind IP address for relayed sessions (server.conf's bind_addr)")
    parser.add_argument("-p", type=flag_type(flag_port, "port"), metavar="PORT",
                        help="listen port for relayed sessions (server.conf's listen_port)")
    parser.add_argument("-m", action="store_true", help="enable shared memory acceleration (the default)")
    parser.add_argument("-k", action="store_true", help="enable shared memory for QEMU-KVM guests")
    parser.add_argument("-r", action="store_true", help="enable RDMA (relay connections use TCP in this release)")
    parser.add_argument("-i", action="store_true", help="enable ibverbs for RDMA (as -r)")
    parser.add_argument("-d", action="store_true", help="Orion's daemon flag: refused; oriond runs in the foreground "
                        "under a service manager (systemctl start oriond: deploy/systemd/oriond.service)")
    parser.add_argument("--config", metavar="FILE",
                        help=f"server configuration (default {DEFAULT_PATH}; Orion's defaults if that is missing)")
    parser.add_argument("--region", action="append", help="serve this region file only (repeatable)")
    mib = flag_type(lambda text: flag_count(text, "MiB of memory"), "MiB")
    parser.add_argument("--gmem", type=mib, metavar="MiB", help="memory quota of each vGPU of a session "
                        "without a controller allocation (default: device memory / vgpu_count)")
    parser.add_argument("--devices", type=flag_type(flag_devices, "devices"),
                        help="comma-separated physical GPU ordinals sessions may use, e.g. 0,2")
    parser.add_argument("--pid-file", help=f"where to write our pid, for the libvirt hook's SIGHUP (default "
                        f"{pidfile.default_path()}; ORION_PID_FILE sets the default)")
    parser.add_argument("--rescan-interval", type=flag_type(flag_seconds, "seconds"), default=RESCAN_S, metavar="S",
                        help="how often to look for new or removed regions (default %(default)s s); SIGHUP "
                             "rescans at once")
    args = parser.parse_args(argv)
    if args.d:  # a daemon that forks itself away from its service manager loses its logs and its restarts
        parser.error("-d: oriond does not fork itself into the background; run it under systemd (systemctl start "
                     "oriond, the unit setup.sh installs) or with `oriond &`")
    # Paths are checked here, before anything is served: a typo must not give an agent serving nothing.
    if args.config is not None and not os.path.isfile(args.config):
        why = "no such file" if not os.path.exists(args.config) else "not a file"
        parser.error(f"--config {args.config}: {why}; give the path of a server.conf, or leave --config out to "
                     f"read {DEFAULT_PATH}")
    for region in args.region or ():
        if not os.path.isfile(region):
            why = "no such file" if not os.path.exists(region) else "not a file"
            parser.error(f"--region {region}: {why}; create it with orion-shm create, or leave --region out to "
                         "serve every region of shm_path_base")
    if args.pid_file is not None:
        source = f"--pid-file {args.pid_file!r}"
    else:
        args.pid_file = pidfile.default_path()
        source = (f"{pidfile.PID_FILE_ENV}={args.pid_file}" if os.environ.get(pidfile.PID_FILE_ENV)
                  else f"the default pid file {args.pid_file}")
    if not args.pid_file.strip() or os.path.isdir(args.pid_file):
        parser.error(f"{source}: {'is a directory' if args.pid_file.strip() else 'is empty'}; give a file path, "
                     f"e.g. {pidfile.DEFAULT_PID_FILE}")
    return args


def relay_route(config: ServerConfig, link: object | None) -> RelayRoute | None:
    """How this oriond's sessions may be relayed (relay/route.py): to `[server-relay] remote_addr`, or to the host
    a controller allocation names; None when neither can happen (no relay address, no controller)."""
    if not config.relay_addr and not config.controller_configured:
        return None
    # This node's name in the relay handshake: the one it registers under with a controller (its bind_addr), else
    # its host name (where that can name it: a machine without one says "(none)"; else its bind_addr).
    route = RelayRoute(fixed=config.relay_addr, controller=config.controller_addr if config.controller_configured
                       else "", host=config.bind_addr if link is not None else "",
                       rdma=RdmaSettings(config.enable_rdma, config.ibverbs_device),
                       key_file=config.cluster_key_file,
                       member=config.bind_addr if config.controller_configured else host_name(config.bind_addr))
    try:
        load_key(config.cluster_key_file)  # here once, so a key that cannot be used is said at start
    except ClusterKeyError as exc:
        logging.error("%s: sessions cannot be relayed to GPU hosts until it can be used", exc)
    if route.fixed:
        logging.info("Relaying every session to the GPU host %s (server-relay remote_addr)", route.fixed)
    elif not route.host:
        logging.info("No GPU registered here: sessions are relayed to the GPU hosts of Orion Controller %s",
                     route.controller)
    return route


def missing_devices(devices: tuple[int, ...]) -> str:
    """What is wrong with --devices on this host: ordinals it has no GPU for (one line), or "". A host whose
    GPUs cannot be read (no driver) is not judged: its sessions have no device anyway, which they say."""
    from ..session.gpu_inventory import InventoryError, read

    try:
        gpus, _why = read()  # in a child interpreter: oriond itself never initialises CUDA
    except InventoryError:
        return ""
    have = sorted(g.index for g in gpus)
    missing = [d for d in devices if d not in have]
    if not gpus or not missing:
        return ""
    return (f"{','.join(map(str, devices))}: this host has no GPU {','.join(map(str, missing))} (it has "
            f"{len(have)}: {', '.join(map(str, have))}); name only GPUs it has, or leave --devices out to use all")


def _listen(config: ServerConfig, asked: bool) -> ListeningSocket | None:
    """The relay listener's socket on bind_addr:listen_port, when listen_port was `asked` for (server.conf or -p);
    None, said once, when it was not or cannot be had: without a usable cluster key no peer could prove itself."""
    if not asked:
        logging.info("Not listening for relayed sessions: set listen_port in %s (or -p) and give this host the "
                     "cluster key to take sessions other hosts relay here", config.path or DEFAULT_PATH)
        return None
    try:
        key = load_key(config.cluster_key_file)
    except ClusterKeyError as exc:
        logging.error("not listening on %s:%d for relayed sessions: %s", config.bind_addr, config.listen_port, exc)
        return None
    try:
        sock = listen_socket(config.bind_addr, config.listen_port,
                             Admission(key, require_allocation=config.controller_configured))
    except OSError as exc:
        logging.error("cannot listen on %s:%d for relayed sessions (%s): other hosts cannot relay sessions here; "
                      "free the port or set listen_port (-p) and bind_addr (-b) in %s", config.bind_addr,
                      config.listen_port, exc.strerror or exc, config.path or DEFAULT_PATH)
        return None
    logging.info("Orion Server listens on %s:%d for relayed sessions; %s", config.bind_addr, config.listen_port,
                 RdmaSettings(config.enable_rdma, config.ibverbs_device).startup_line())
    return sock


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    try:
        config = ServerConfig.load(args.config or DEFAULT_PATH)
        if not args.region:
            config.check_region_dir()
    except ConfigError as exc:
        print(f"oriond: Error in orion.conf: {exc}", file=sys.stderr)
        return 1
    config = replace(config, bind_addr=args.b or config.bind_addr, listen_port=args.p or config.listen_port,
                     enable_rdma=config.enable_rdma or args.r or args.i)
    server_log.configure(config.log)
    if config.path is None:
        logging.info("No configuration file is found. Use default settings and environment variables.")
    for key in config.unknown_keys:
        logging.warning("%s: %s is not in Orion's server.conf; ignored (a typo?)", config.path, key)
    devices = args.devices
    problem = missing_devices(devices) if devices is not None else ""
    if problem:  # sessions would silently lose the missing GPUs: a typo must not pass
        print(f"oriond: argument --devices: {problem}", file=sys.stderr)
        return 2
    stop = StopRequest().on_signals()
    link = None
    if config.controller_configured:  # as a member of the cluster: without its key, one line and no registration
        link = controller_link.start(config.controller_addr, config.bind_addr, config.listen_port,
                                     config.vgpu_count, config.cluster_key_file)
        vgpu_grant.sign_as(link.member if link else None)  # before any session worker is forked
    sharing = mps.start(config.mps, config.vgpu_count)  # before any session worker is forked
    metrics = metrics_server.start(config.metrics_addr)  # likewise: the workers keep their figures for it
    executor = ExecutorOptions(devices=devices, gmem_mib=args.gmem, vgpu_count=config.vgpu_count,
                               controller=config.controller_addr if link else "", host=config.bind_addr,
                               image_cache=config.image_cache)
    agent = Agent(config, executor, regions=args.region, options=ServerOptions(relay=relay_route(config, link)),
                  stop=stop, rescan_s=args.rescan_interval, release=link.release_later if link else None,
                  listen=_listen(config, args.p is not None or config.listen_port_set))
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
        if sharing is not None:
            sharing.stop()
        if metrics is not None:
            metrics.stop()
        pidfile.remove(args.pid_file)
    return 0


if __name__ == "__main__":
    sys.exit(main())
