"""`orion-guest`: the guest runtime's command line (thin: parsing and printing only)."""
from __future__ import annotations

import argparse
import sys

from ivshmem.errors import WireError
from ivshmem.region import Region
from ivshmem.shared.version import version_line

from .probe import run_probe
from .startup import native_library


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="orion-guest", description="Orion vGPU guest runtime")
    parser.add_argument("--version", action="version", version=version_line("orion-guest"))
    commands = parser.add_subparsers(dest="command", required=True)
    probe = commands.add_parser("probe", help="check that this machine reaches the host agent through its region")
    probe.add_argument("--region", help="a region file (/dev/shm/orionsock0) or an ivshmem PCI address "
                                        "(0000:00:04.0); default: $ORION_SHM, an ivshmem device, /dev/shm")
    probe.add_argument("--round-trips", type=int, default=2000)
    probe.add_argument("--bulk-mib", type=int, default=8)
    args = parser.parse_args(argv)
    try:
        if args.region is None:
            region = Region.discover()
        elif args.region.startswith("/"):
            region = Region.open(args.region)
        else:
            region = Region.open_pci(args.region)
        with region:
            r = run_probe(region, args.round_trips, args.bulk_mib)
    except WireError as exc:
        print(f"orion-guest: {exc}", file=sys.stderr)
        return 1
    print(f"ORION-PROBE region={r.region} kind={r.kind} channel={r.channel} session={r.session} agent={r.agent!r}")
    print(f"ORION-PROBE round-trip n={r.round_trips} p50={r.p50_us:.2f}us p99={r.p99_us:.2f}us")
    print(f"ORION-PROBE bulk bytes={r.bulk_bytes} to-host={r.to_host_mb_s:.0f}MB/s "
          f"from-host={r.from_host_mb_s:.0f}MB/s")
    native, why = native_library()
    print(f"ORION-PROBE path={'native' if native else 'capsule'} ({why})")
    print("ORION-PROBE ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
