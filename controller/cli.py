"""``orion-controller start [--config-file controller.yaml] [--listen 0.0.0.0:9123] [--etcd URL] [--log FILE] ...`` and
``orion-controller cluster-key PATH`` (make the cluster's key, docs/security.md); ``orion-controller help [COMMAND]``,
Orion's form of ``--help``.

Only argument parsing: the settings become one ControllerConfig and service.run does the rest; the key file is
made by cluster_key.make_key_file.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from controller.cluster_key import DEFAULT_KEY_FILE
from controller.config import DEFAULT_ETCD, DEFAULT_LISTEN, DEFAULT_MAX_BODY_KIB, ConfigError, ControllerConfig
from controller.config_file import start_flags
from controller.keys import DEFAULT_ROOT
from controller.payloads import DEFAULT_MAX_GPUS_PER_HOST, MAX_VGPU_COUNT
from controller.pool import DEFAULT_HOST_TTL_S, DEFAULT_LEASE_TTL_S, ETCD_DEFAULT_MAX_TXN_OPS
from controller.service import run
from ivshmem.shared.version import version_line


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="orion-controller",
                                     description="Orion Controller: the vGPU pool in etcd, REST API on :9123")
    parser.add_argument("--version", action="version", version=version_line("orion-controller"))
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    start = sub.add_parser("start", help="run the controller in the foreground")
    start.add_argument("--config-file", metavar="YAML",
                       help="Orion's controller.yaml: its listen address, log settings and etcd client URL "
                            "(flags given here win)")
    start.add_argument("--listen", metavar="HOST:PORT", help=f"address of the REST API (default {DEFAULT_LISTEN})")
    start.add_argument("--etcd", metavar="URL", help=f"etcd endpoint(s), comma-separated (default {DEFAULT_ETCD})")
    start.add_argument("--log", metavar="FILE", help="log to this file instead of stdout")
    start.add_argument("--log-level", choices=["debug", "info", "warn", "error"], help="(default info)")
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
    start.add_argument("--key-file", default=str(DEFAULT_KEY_FILE), metavar="PATH",
                       help="the cluster key: members (orionds, the device plugin) sign their requests with it "
                            "(default %(default)s; make one with `orion-controller cluster-key PATH`)")
    start.add_argument("--max-gpus-per-host", type=int, default=DEFAULT_MAX_GPUS_PER_HOST, metavar="N",
                       help="the most GPUs one host registers (default %(default)s)")
    start.add_argument("--max-vgpus-per-gpu", type=int, default=MAX_VGPU_COUNT, metavar="N",
                       help="the most vGPUs one GPU is carved into (default %(default)s)")
    start.add_argument("--max-body-kib", type=int, default=DEFAULT_MAX_BODY_KIB, metavar="KIB",
                       help="the largest request body (default %(default)s KiB)")
    make = sub.add_parser("cluster-key", help="make a new cluster key file (0600, never overwriting one)")
    make.add_argument("path", metavar="PATH", help=f"where to write it, e.g. {DEFAULT_KEY_FILE}")
    return parser


def _make_key(path: str) -> int:
    from controller.cluster_key import make_key_file

    try:
        make_key_file(Path(path))
    except FileExistsError:
        print(f"orion-controller: {path} exists already; copy it to every member of the cluster (mode 0600), or "
              f"remove it first to make a new key", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"orion-controller: cannot write {path}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    print(f"Made the cluster key {path}: copy it (mode 0600, owned by the user each runs as) to every oriond, "
          f"controller and device plugin of this cluster")
    return 0


def start_config(args: argparse.Namespace) -> ControllerConfig:
    """`start`'s settings: its flags, over those of --config-file (Orion's controller.yaml), over the defaults; a key
    of the file Orion's does not have is named on stderr. ConfigError, one line, for a bad one."""
    from_file, unknown = start_flags(args.config_file) if args.config_file else ({}, [])
    for key in unknown:
        print(f"orion-controller: {args.config_file}: {key} is not in Orion's controller.yaml; ignored (a typo?)",
              file=sys.stderr)
    return ControllerConfig.build(args.listen or from_file.get("listen", DEFAULT_LISTEN),
                                  args.etcd or from_file.get("etcd", DEFAULT_ETCD), args.log or from_file.get("log"),
                                  args.log_level or from_file.get("log_level", "info"), args.lease_ttl, args.host_ttl,
                                  args.key_root, args.etcd_timeout, args.workers, args.etcd_max_txn_ops,
                                  key_file=args.key_file, max_gpus_per_host=args.max_gpus_per_host,
                                  max_vgpus_per_gpu=args.max_vgpus_per_gpu, max_body_kib=args.max_body_kib)


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["help"]:  # Orion's form: `orion-controller help start`
        argv = [*argv[1:2], "--help"]
    args = parser.parse_args(argv)
    if args.command == "cluster-key":
        return _make_key(args.path)
    if args.command != "start":
        parser.print_help()
        return 2
    try:
        config = start_config(args)
    except ConfigError as exc:
        print(f"orion-controller: {exc}", file=sys.stderr)
        return 2
    return run(config)


if __name__ == "__main__":
    sys.exit(main())
