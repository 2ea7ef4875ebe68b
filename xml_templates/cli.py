"""`orion-domain render`: print (or write) a libvirt domain XML with Orion regions, ready for `virsh define`.

Only argument parsing, output and exit codes live here; the domain is built by domain.py. Every bad option
ends in one line on stderr and exit code 2 (argparse's own errors included), never a traceback.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import NoReturn

from ivshmem.shared.version import version_line

from . import domain
from .errors import DomainXmlError

EXIT_BAD_OPTIONS = 2


class _OneLineParser(argparse.ArgumentParser):
    """argparse, but an error is one line (`orion-domain render: error: …`) without the usage block."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_BAD_OPTIONS, f"{self.prog}: error: {message} (see --help)\n")


def _parser() -> argparse.ArgumentParser:
    parser = _OneLineParser(prog="orion-domain", description="libvirt domain XML for guests with Orion regions")
    parser.add_argument("--version", action="version", version=version_line("orion-domain"))
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_OneLineParser)
    render = commands.add_parser(
        "render", help="write a complete domain XML with Orion regions attached",
        description="Write a complete libvirt domain XML for a guest with one or more Orion regions "
                    "(/dev/shm/orionsock<N>, ivshmem-plain), ready for `virsh define`.")
    render.add_argument("--name", required=True, help="domain name")
    render.add_argument("--memory", type=int, default=1024, metavar="MiB", help="guest memory in MiB (1024)")
    render.add_argument("--vcpus", type=int, default=1, metavar="N", help="virtual CPUs (1)")
    render.add_argument("--disk", metavar="IMAGE", help="disk image (qcow2 or raw), attached as virtio vda: the boot "
                        "disk, or with --kernel the root disk")
    render.add_argument("--disk-format", choices=domain.DISK_FORMATS, help="the image's format (default: detected)")
    render.add_argument("--kernel", metavar="FILE", help="boot this kernel directly (with --disk, that disk is still "
                        "attached, e.g. for root=/dev/vda)")
    render.add_argument("--initrd", metavar="FILE", help="initrd for --kernel")
    render.add_argument("--cmdline", metavar="ARGS", help="kernel command line for --kernel")
    render.add_argument("--region", action="append", default=[], metavar="INDEX[:SIZE_MIB]",
                        help="attach /dev/shm/orionsock<INDEX> of SIZE_MIB MiB (a power of two, default "
                             f"{domain.DEFAULT_REGION_SIZE_MIB}); repeat for more regions")
    render.add_argument("--network", default="none", help="none (default), user, network=NAME or bridge=NAME")
    render.add_argument("--console", action="store_true", help="add a serial console on a pty (virsh console)")
    render.add_argument("--serial-log", metavar="FILE", help="also write the serial console to FILE (implies "
                        "--console; virtlogd writes it, replaced at each start)")
    render.add_argument("--share", action="append", default=[], metavar="DIR:TAG",
                        help="share host directory DIR read-only over 9p; the guest mounts it with "
                             "`mount -t 9p -o trans=virtio TAG /mnt`; repeat for more")
    render.add_argument("--type", dest="domain_type", choices=domain.DOMAIN_TYPES,
                        help="libvirt domain type (default: kvm if /dev/kvm can be opened, else qemu)")
    render.add_argument("--output", "-o", metavar="FILE", help="write here instead of stdout")
    return parser


def _spec(args: argparse.Namespace) -> domain.DomainSpec:
    """The options as a DomainSpec; DomainXmlError for any that make no sense."""
    if not args.kernel and (args.initrd or args.cmdline):
        raise DomainXmlError("--initrd and --cmdline need --kernel")
    if args.disk_format and not args.disk:
        raise DomainXmlError("--disk-format needs --disk")
    if not args.disk and not args.kernel:
        raise DomainXmlError("give a boot source: --disk IMAGE or --kernel FILE [--initrd FILE]")
    return domain.DomainSpec(
        name=domain.check_name(args.name), memory_mib=args.memory, vcpus=args.vcpus,
        disk=domain.disk_boot(args.disk, args.disk_format) if args.disk else None,
        kernel=domain.kernel_boot(args.kernel, args.initrd, args.cmdline) if args.kernel else None,
        regions=domain.unique_regions([domain.parse_region(text) for text in args.region]),
        domain_type=args.domain_type or domain.default_domain_type(),
        network=domain.parse_network(args.network), console=args.console,
        serial_log=os.path.abspath(args.serial_log) if args.serial_log else None,
        shares=tuple(domain.parse_share(text) for text in args.share))


def _write(data: bytes, output: str | None) -> None:
    if output is None:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
        return
    try:
        with open(output, "wb") as f:
            f.write(data)
    except OSError as exc:
        raise DomainXmlError(f"cannot write {output!r}: {exc.strerror}") from None


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        _write(domain.render(_spec(args)), args.output)
    except DomainXmlError as exc:
        print(f"orion-domain {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_BAD_OPTIONS
    return 0


if __name__ == "__main__":
    sys.exit(main())
