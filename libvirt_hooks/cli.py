"""`orion-hooks install|uninstall|status`: thin; installer.py does the work and says what it did."""
from __future__ import annotations

import argparse
import sys

from host_agent.daemon.pidfile import DEFAULT_PID_FILE
from ivshmem.shared.version import version_line

from .installer import InstallError, install, status, uninstall
from .qemu_hook import SERVER_CONF


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="orion-hooks", description="Install the Orion vGPU libvirt qemu hook "
                                     "(and, where AppArmor is active, the rule that lets QEMU open regions)")
    parser.add_argument("--version", action="version", version=version_line("orion-hooks"))
    sub = parser.add_subparsers(dest="command", required=True)
    commands = {name: sub.add_parser(name, help=text) for name, text in (
        ("install", "install the hook next to any hook already there (idempotent)"),
        ("uninstall", "remove the hook and the AppArmor rule, nothing else"),
        ("status", "show what is installed; exit 1 unless the hook is installed and usable"))}
    for command in commands.values():
        command.add_argument("--root", default="/", metavar="DIR", help="treat DIR as / for every file read or written "
                                                         "(default %(default)s)")
    commands["install"].add_argument("--python", default=sys.executable, metavar="PATH",
                                     help="interpreter the hook runs with (default: this one, %(default)s)")
    commands["install"].add_argument("--config", default=SERVER_CONF, metavar="FILE", help="server.conf the hook reads "
                                                                          "(default %(default)s)")
    commands["install"].add_argument("--pid-file", default=DEFAULT_PID_FILE, metavar="FILE",
                                     help="oriond's pid file, to wake it (default %(default)s)")
    args = parser.parse_args(argv)
    try:
        if args.command == "install":
            lines = install(args.root, args.python, args.config, args.pid_file)
            code = 0
        elif args.command == "uninstall":
            lines, code = uninstall(args.root), 0
        else:
            ok, lines = status(args.root)
            code = 0 if ok else 1
    except (InstallError, OSError) as exc:
        text = f"{exc.strerror}: {exc.filename}" if isinstance(exc, OSError) and exc.strerror else str(exc)
        print(f"orion-hooks: error: {text}", file=sys.stderr)
        return 1
    for line in lines:
        print(line)
    return code


if __name__ == "__main__":
    sys.exit(main())
