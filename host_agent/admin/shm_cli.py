"""`orion-shm`: Orion's SHM creator (same options, messages and exit codes), plus list/inspect/remove.

`orion-shm [-i N] [-s MiB] [-d DIR] [-h]` behaves as Orion's binary did (getopt, its help text, its
messages), so scripts written for Orion keep working; `-h`/`--help` add the newer commands after Orion's
text, and a first argument naming a command selects the newer form. The work is done in shm_admin.py; this
module only parses, prints and picks exit codes.
"""
from __future__ import annotations

import argparse
import getopt
import os
import re
import sys

from ivshmem.errors import WireError
from ivshmem.layout import MIB
from ivshmem.region import SHM_DIR
from ivshmem.shared.version import version_line

from ..errors import ConfigurationError
from ..server_conf import SERVER_CONF, ConfigError, ShmSettings
from ..shm_admin import (
    CreatedRegion,
    ShmError,
    access_of,
    access_warning,
    create,
    inspect,
    list_regions,
    remove,
    remove_command,
    serving_agent,
)

PROG = "orion-shm"
ORION_HELP = (
    "Name    : Orion SHM creator\n"
    "Version : 0.1\n"
    "Options :\n"
    "\t-i : Index of created SHM file.   Default 0\n"
    "\t-s : Size of SHM (MiB).           Default 128\n"
    "\t-d : System default shm path.     Default /dev/shm\n"
    "\t-h : Print this message.\n"
)
COMMANDS_HELP = f"""\
Commands:
  {PROG} create [-i N] [-s MiB] [-d DIR] [--owner USER[:GROUP]] [--mode OCTAL] [--channels N] [--config FILE]
                   create and format a region and give it to its tenant: --owner (a container's or local
                   user's uid, mode 0600; 0660 with a group), else QEMU's user:group of server.conf
                   [server-shm] (0660), else it stays yours (0600)
  {PROG} list [-d DIR]                 one line per region: size, owner, mode, who can reach it, agent, channels
  {PROG} inspect N [-d DIR]            header, agent, every channel and the processes using region N
  {PROG} remove N [-d DIR] [--force]   delete region N unless a process or the host agent still uses it
  {PROG} attach DOMAIN [-i N] [-s MiB] [--live] [--config] [--persistent] [-c URI]
                   create /dev/shm/orionsock<N> if needed and attach it to a libvirt domain (ivshmem-plain)
  {PROG} detach DOMAIN [-i N] [--live] [--config] [--wait S] [-c URI]
                   remove that device and its record from the domain; the region file stays
  {PROG} help [COMMAND]
"""
OVERVIEW = f"""\
{PROG}: create and manage Orion shared-memory regions (DIR/orionsock<N>, default DIR /dev/shm)

Orion-compatible form (Orion's options, messages and exit codes; the region is then created as by 'create'):
  {PROG} [-i N] [-s MiB] [-d DIR] [-h]

{COMMANDS_HELP}
Sizes are powers of two (QEMU maps a region as a PCI BAR). A region is one tenant's: whoever can open it can
read and write every session in it (docs/containers.md).

Every command also takes --config FILE (default {SERVER_CONF}); its [server-shm] shm_path_base and
shm_buffer_size are the defaults of -d and -s. attach and detach, whose --config means the domain's persistent
definition (as in virsh), take that file as --server-conf FILE. Run '{PROG} COMMAND -h' for a command's options.
"""
# `orion-shm -h`: Orion's text first (scripts may compare it), then the commands it never had.
LEGACY_HELP = f"{ORION_HELP}\n{COMMANDS_HELP}Run '{PROG} help' for more, '{PROG} COMMAND -h' for a command's options.\n"
COMMANDS = ("create", "list", "inspect", "remove", "attach", "detach", "help")
LIBVIRT_COMMANDS = ("attach", "detach")
# Exit statuses of attach/detach: (status, the gateway's error class, meaning); docs/kvm.md lists them too.
_LIBVIRT_EXITS = (
    (0, "", "done, or nothing to do"),
    (1, "", "bad arguments, or the region could not be created"),
    (2, "LibvirtdUnreachable", "libvirtd is not running or not reachable at the URI"),
    (3, "DomainNotFound", "no such domain"),
    (4, "NotPermitted", "libvirt does not allow this user, or no write access to /dev/shm"),
    (5, "RegionUnusable", "the existing region is too small, or QEMU cannot open it"),
    (6, "Conflict", "a <shmem> of that name that is not ours, or ours with another size, is in the way"),
    (7, "Refused", "libvirt refused the change; what was done before it was undone"),
    (8, "DetachPending", "live detach asked for, but the guest has not released the device within --wait"),
)
_INTEGER = re.compile(r"\s*[+-]?\d+\s*")


class UsageError(ConfigurationError):
    """Bad command-line arguments; the message is the line to print."""


class _Exit(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


class _Parser(argparse.ArgumentParser):
    """argparse that reports a mistake in one line and exits 1 (as Orion did), never 2 with a usage dump."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{self.prog}: {message}; see '{self.prog} -h'")

    def exit(self, status: int = 0, message: str | None = None) -> None:  # type: ignore[override]
        if message:
            sys.stderr.write(message)
        raise _Exit(status)


def _integer(text: str, option: str) -> int:
    if not _INTEGER.fullmatch(text):
        raise UsageError(f"Error. Invalid value '{text}' for {option}: an integer is expected. "
                         f"See '{PROG} -h'.")
    return int(text)


def _int_arg(text: str) -> int:
    if not _INTEGER.fullmatch(text):
        raise argparse.ArgumentTypeError(f"'{text}' is not an integer")
    return int(text)


def _mode_arg(text: str) -> int:
    try:
        mode = int(text, 8)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not an octal mode such as 0660") from None
    if not 0 <= mode <= 0o7777:
        raise argparse.ArgumentTypeError(f"'{text}' is not an octal mode such as 0660")
    return mode


# --- Orion's form -------------------------------------------------------------------------------------------
def _legacy(argv: list[str]) -> int:
    try:
        opts, rest = getopt.gnu_getopt(argv, "s:i:d:h", ["help"])  # glibc getopt permutes too
    except getopt.GetoptError as exc:
        sys.stderr.write(f"{PROG}: {exc.msg}\n")
        sys.stdout.write(ORION_HELP)
        return 1
    values = {"-i": "0", "-s": "128", "-d": SHM_DIR}
    for option, value in opts:
        if option in ("-h", "--help"):
            sys.stdout.write(LEGACY_HELP)
            return 0
        values[option] = value
    if rest:
        raise UsageError(f"Error. Unexpected argument '{rest[0]}'; use options only, or one of the commands "
                         f"{', '.join(COMMANDS)}. See '{PROG} help'.")
    index, size = _integer(values["-i"], "-i"), _integer(values["-s"], "-s")
    created = create(index, size, values["-d"], settings=ShmSettings.load(SERVER_CONF))
    _report_created(created, extra=False)
    return 0


def _report_created(created: CreatedRegion, extra: bool) -> None:
    """Orion's line on stdout (scripts read it); anything else the user should know on stderr."""
    print(f"{created.path} is successfully created.")
    if extra:
        print(f"{created.size // MIB} MiB, {created.channels} channels, owner {created.owner}:{created.group}, "
              f"mode {created.mode:04o} ({access_of(created.mode, created.path)})")
    if created.note:
        print(f"Note: {created.note}", file=sys.stderr)
    if created.warning:
        print(f"Warning: {created.warning}", file=sys.stderr)


# --- commands -----------------------------------------------------------------------------------------------
def _parsers() -> dict[str, _Parser]:
    def parser(name: str, description: str) -> _Parser:
        p = _Parser(prog=f"{PROG} {name}", description=description, allow_abbrev=False)
        p.add_argument("--config", default=SERVER_CONF, metavar="FILE",
                       help=f"Orion server configuration (default {SERVER_CONF}; a missing file means defaults)")
        return p

    def directory(p: _Parser) -> None:
        p.add_argument("-d", "--dir", metavar="DIR", help="where regions live (default: shm_path_base of "
                       "[server-shm], /dev/shm)")

    def index(p: _Parser) -> None:
        p.add_argument("index", type=_int_arg, metavar="N", help="region index: DIR/orionsock<N>")

    create_p = parser("create", "Create DIR/orionsock<N>, size it, format its header and give it to its tenant "
                      "(a region is one tenant's: whoever can open it can read and write every session in it): "
                      "--owner's user (mode 0600, 0660 with a group), else the QEMU user and group of "
                      "[server-shm] (0660) when they exist here, else it stays yours (0600).")
    create_p.add_argument("-i", "--index", type=_int_arg, default=0, metavar="N", help="index, 0-9999 (default 0)")
    create_p.add_argument("-s", "--size", type=_int_arg, metavar="MiB",
                          help="size in MiB, a power of two from 16 to 1048576 (default: shm_buffer_size of "
                          "[server-shm], 128)")
    directory(create_p)
    create_p.add_argument("--channels", type=_int_arg, default=8, metavar="N",
                          help="channels, i.e. client processes at once (default 8)")
    create_p.add_argument("--owner", metavar="USER[:GROUP]", help="the tenant: a container's or local user's "
                          "name or numeric uid (need not exist here), and a group to share it with")
    create_p.add_argument("--mode", type=_mode_arg, metavar="OCTAL", help="file mode instead of 0600/0660; one "
                          "that lets others in is allowed, with a warning")
    list_p = parser("list", "List the regions in DIR.")
    directory(list_p)
    inspect_p = parser("inspect", "Show region N: file, header, host agent, channels and the processes using it.")
    index(inspect_p)
    directory(inspect_p)
    remove_p = parser("remove", "Delete region N, unless a process maps or opens it or a live host agent serves "
                      "it.")
    index(remove_p)
    directory(remove_p)
    remove_p.add_argument("--force", action="store_true", help="remove it even while it is in use")
    return {"create": create_p, "list": list_p, "inspect": inspect_p, "remove": remove_p, **_libvirt_parsers()}


def _libvirt_parsers() -> dict[str, _Parser]:
    """attach/detach: virsh's flag names (--live, --config, -c URI), so server.conf is --server-conf here."""
    exits = "exit status: " + "; ".join(f"{code} {what}" for code, _, what in _LIBVIRT_EXITS)

    def parser(name: str, description: str) -> _Parser:
        p = _Parser(prog=f"{PROG} {name}", description=description, epilog=exits, allow_abbrev=False)
        p.add_argument("domain", metavar="DOMAIN", help="libvirt domain name")
        p.add_argument("-i", "--index", type=_int_arg, default=0, metavar="N", help="region index (default 0)")
        p.add_argument("--live", action="store_true", help="change the running domain")
        p.add_argument("--config", action="store_true", help="change the persistent definition (default: "
                       "--live if the domain runs, --config if it is persistent, both if both)")
        p.add_argument("-c", "--connect", metavar="URI", help="libvirt URI (default: $LIBVIRT_DEFAULT_URI, else "
                       "qemu:///system)")
        p.add_argument("--server-conf", default=SERVER_CONF, metavar="FILE",
                       help=f"Orion server configuration (default {SERVER_CONF}): QEMU's user and group, and the "
                       "default size")
        return p

    attach_p = parser("attach", "Attach /dev/shm/orionsock<N> to DOMAIN as an ivshmem-plain <shmem> device "
                      "(alias ua-orion-orionsock<N>) and record it in the domain's orion: metadata. The region "
                      "is created first if missing (owner and mode for QEMU); an existing one is reused if large "
                      "enough. Attaching again changes nothing; a failure part-way undoes what was done.")
    attach_p.add_argument("-s", "--size", type=_int_arg, metavar="MiB", help="device size, a power of two in "
                          "MiB (default: the attached device's, else the existing region's, else shm_buffer_size)")
    attach_p.add_argument("--persistent", action="store_true", help="mark the region persistent: the qemu hook "
                          "keeps the file when the domain stops")
    detach_p = parser("detach", "Detach our orionsock<N> device (alias ua-orion-orionsock<N>) and its metadata "
                      "entry from DOMAIN; nothing else is touched and the region file is kept. Live detach is an "
                      "ACPI eject the guest must acknowledge; it is waited for at most --wait seconds.")
    detach_p.add_argument("--wait", type=float, default=10.0, metavar="S",
                          help="seconds to wait for the guest to release the device (default 10)")
    return {"attach": attach_p, "detach": detach_p}


def _command(name: str, argv: list[str]) -> int:
    parsers = _parsers()
    if name == "help":
        if len(argv) > 1 or (argv and argv[0] not in parsers):
            raise UsageError(f"{PROG} help: unknown command '{' '.join(argv)}'; the commands are "
                             f"{', '.join(parsers)}")
        if argv:
            parsers[argv[0]].print_help()
        else:
            sys.stdout.write(OVERVIEW)
        return 0
    args = parsers[name].parse_args(argv)
    if name in LIBVIRT_COMMANDS:
        return _libvirt_command(name, args)
    settings = ShmSettings.load(args.config)
    directory = args.dir or settings.path_base
    if name == "create":
        size = args.size if args.size is not None else settings.buffer_size_mib
        created = create(args.index, size, directory, channels=args.channels, settings=settings, mode=args.mode,
                         owner=args.owner)
        _report_created(created, extra=True)
        return 0
    if name == "list":
        return _print_list(directory)
    if name == "inspect":
        return _print_inspect(inspect(args.index, directory))
    print(f"{remove(args.index, directory, force=args.force)} is removed.")
    return 0


def _libvirt_command(name: str, args: argparse.Namespace) -> int:
    """attach/detach; the gateway (libvirt, lxml) is imported here only, so create/list/inspect/remove start
    fast and work on a host without libvirt-python."""
    try:
        from ..kvm import libvirt_gateway, region_attach
    except ImportError as exc:
        print(f"Error. '{PROG} {name}' needs the host side (libvirt-python, lxml): {exc}; install the orion-vgpu "
              "package (./setup.sh)", file=sys.stderr)
        return 1
    try:
        if name == "attach":
            done = region_attach.attach_region(args.domain, args.index, args.size, live=args.live,
                                               config=args.config, persistent=True if args.persistent else None,
                                               settings=ShmSettings.load(args.server_conf), uri=args.connect)
        else:
            if args.wait < 0:
                raise UsageError(f"{PROG} detach: --wait must be 0 or more seconds, not {args.wait:g}")
            done = region_attach.detach_region(args.domain, args.index, live=args.live, config=args.config,
                                               wait_s=args.wait, uri=args.connect)
    except libvirt_gateway.GatewayError as exc:
        print(f"Error. {exc}", file=sys.stderr)
        return next((code for code, error, _ in _LIBVIRT_EXITS if error == type(exc).__name__), 7)
    except ValueError as exc:  # xml_templates' DomainXmlError: a size or index QEMU cannot take
        print(f"Error. {exc}", file=sys.stderr)
        return 1
    where = " and ".join("the running domain" if s == "live" else "the persistent definition" for s in done.scopes)
    region = os.path.basename(done.path)
    if name == "attach":
        if not done.changed:
            print(f"{region} is already attached to {done.domain} ({where}, {done.size_mib} MiB); nothing changed.")
        else:
            made = "created" if done.region_created else "existing"
            print(f"{region} ({done.size_mib} MiB, {made} {done.path}) is attached to {done.domain} ({where}).")
        return 0
    if not done.changed:
        print(f"{region} is not attached to {done.domain} ({where}); nothing changed.")
    else:
        print(f"{region} is detached from {done.domain} ({where}).")
    if done.region_exists:
        agent = serving_agent(done.path)
        if agent:
            print(f"The region file {done.path} is kept and the host agent (pid {agent}) still serves it; when no "
                  f"longer needed, '{remove_command(args.index, done.path, force=True)}' deletes it (oriond then "
                  "lets go of it).")
        else:
            print(f"The region file {done.path} is kept; remove it with '{remove_command(args.index, done.path)}' "
                  "when no longer needed.")
    return 0


def _size_text(size: int) -> str:
    return f"{size // MIB} MiB" if size % MIB == 0 else f"{size} bytes"


def _agent_text(agent: dict | None) -> str:
    if agent is None:
        return "-"
    if agent["state_code"] == 0:
        return "never"
    alive = "running" if agent["pid_alive"] else "not running"
    return f"{agent['state']} (pid {agent['pid']}, {alive})"


def _print_list(directory: str) -> int:
    regions = list_regions(directory)
    if not regions:
        print(f"No Orion regions (orionsock<N>) in {directory}.")
        return 0
    for r in regions:
        status = r["status"] if r["reason"] is None or r["status"] == "formatted" else f"{r['status']}: {r['reason']}"
        channels = "-" if r["channel_count"] is None else f"{r['channels_in_use']}/{r['channel_count']} in use"
        users = ",".join(str(pid) for pid, _ in r["users"]) or "none"
        print(f"{r['index']:>4}  {_size_text(r['size']):>11}  {r['owner']}:{r['group']}  {r['mode']:04o} "
              f"{r['access']}  agent {_agent_text(r['agent'])}  channels {channels}  users {users}  {status}")
    for r in regions:
        _warn_access(r)
    return 0


def _warn_access(info: dict) -> None:
    """A warning for a region others can reach; not for a file that is no region (nothing serves it)."""
    if info["type"] == "file" and info["status"] in ("formatted", "not formatted"):
        warning = access_warning(info["path"], info["mode"])
        if warning:
            print(f"Warning: {warning}", file=sys.stderr)


def _print_inspect(info: dict) -> int:
    out = [info["path"],
           f"  type      {info['type']}",
           f"  size      {info['size']} bytes ({_size_text(info['size'])})",
           f"  owner     {info['owner']}:{info['group']}",
           f"  mode      {info['mode']:04o}",
           f"  access    {info['access']}",
           f"  status    {info['status']}"]
    if info["geometry"] is not None:
        out.append("header")
        out += [f"  {key:<19} {value}" for key, value in info["geometry"].items()]
        agent = info["agent"]
        out += ["agent",
                f"  state     {agent['state']} ({agent['state_code']})",
                f"  pid       {agent['pid']} ({'running' if agent['pid_alive'] else 'not running'})",
                f"  heartbeat {agent['heartbeat']}",
                f"channels ({info['channels_in_use']}/{info['channel_count']} in use)"]
        for ch in info["channels"]:
            if not ch["in_use"] and ch["client_gen"] == 0:
                out.append(f"  {ch['index']:>3} free    never claimed")
                continue
            words = " ".join(f"{k}={v}" for k, v in ch.items() if k not in ("index", "in_use"))
            out.append(f"  {ch['index']:>3} {'in use' if ch['in_use'] else 'free  '}  {words}")
    out.append("users" + ("" if info["users"] else "     none"))
    out += [f"  {pid:>7}  {cmd}" for pid, cmd in info["users"]]
    print("\n".join(out))
    if info["status"] != "formatted":
        print(f"Error. {info['path']}: {info['reason']}", file=sys.stderr)
        return 1
    _warn_access(info)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `orion-shm` console script; returns the exit status, never raises."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["--version"]:
        print(version_line(PROG))
        return 0
    try:
        if argv and argv[0] in COMMANDS:
            return _command(argv[0], argv[1:])
        return _legacy(argv)
    except _Exit as exc:
        return exc.status
    except (UsageError, ShmError) as exc:
        print(exc, file=sys.stderr)
    except ConfigError as exc:
        print(f"Error. {exc}", file=sys.stderr)
    except WireError as exc:
        print(f"Error. {exc}", file=sys.stderr)
    except BrokenPipeError:  # `orion-shm list | head`: stop quietly, and keep Python from complaining at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except OSError as exc:
        where = f" {exc.filename}" if exc.filename else ""
        print(f"Error.{where} {exc.strerror or exc}", file=sys.stderr)
    except KeyboardInterrupt:
        return 130
    return 1


if __name__ == "__main__":
    sys.exit(main())
