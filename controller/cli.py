"""``orion-controller start [--listen 0.0.0.0:9123] [--etcd http://127.0.0.1:2379] [--log FILE]``.

Only argument parsing: the settings become one ControllerConfig and service.run does the rest.
"""
from __future__ import annotations

import argparse
import sys

from controller.config import DEFAULT_ETCD, DEFAULT_LISTEN, ConfigError, ControllerConfig
from controller.keys import DEFAULT_ROOT
from controller.pool import DEFAULT_HOST_TTL_S, DEFAULT_LEASE_TTL_S, ETCD_DEFAULT_MAX_TXN_OPS
from controller.service import run


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="orion-controller",
                                     description="Orion Controller: the vGPU pool in etcd, REST API on :9123")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    start = sub.add_parser("start", help="run the controller in the foreground")
    start.add_argument("--listen", default=DEFAULT_LISTEN, metavar="HOST:PORT",
                       help="address of the REST API (default %(default)s)")
    start.add_argument("--etcd", default=DEFAULT_ETCD, metavar="URL",
                       help="etcd endpoint(s), comma-separated (default %(default)s)")
    start.add_argument("--log", metavar="FILE", help="log to this file instead of stdout")
    start.add_argument("--log-level", default="info", choices=["debug", "info", "warn", "error"])
    start.add_argument("--lease-ttl", type=int, default=DEFAULT_LEASE_TTL_S, metavar="S",
                       help="an allocation's lease: freed this long after its last keep-alive (default %(default)s)")
    start.add_argument("--host-ttl", type=int, default=DEFAULT_HOST_TTL_S, metavar="S",
                       help="a host leaves the pool this long after its last heartbeat (default %(default)s)")
    start.add_argument("--key-root", default=DEFAULT_ROOT, metavar="PREFIX",
                       help="etcd key prefix of this pool (default %(default)s)")
    start.add_argument("--etcd-timeout", type=float, default=3.0, metavar="S",
                       help="deadline of each etcd call (default %(default)s)")
    start.add_argument("--workers", type=int, default=16, help="threads waiting on etcd (default %(default)s)")
    start.add_argument("--etcd-max-txn-ops", type=int, default=ETCD_DEFAULT_MAX_TXN_OPS, metavar="N",
                       help="etcd's --max-txn-ops; one allocation holds at most (N - 2) // 3 vGPUs "
                            "(default %(default)s: 42)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command != "start":
        parser.print_help()
        return 2
    try:
        config = ControllerConfig.build(args.listen, args.etcd, args.log, args.log_level, args.lease_ttl,
                                        args.host_ttl, args.key_root, args.etcd_timeout, args.workers,
                                        args.etcd_max_txn_ops)
    except ConfigError as exc:
        print(f"orion-controller: {exc}", file=sys.stderr)
        return 2
    return run(config)


if __name__ == "__main__":
    sys.exit(main())
