"""``orion-check``: Orion's health check tool (a bash script in its packages), against this project's components.

``orion-check install [server|client|controller|all]`` prints the installation summary (``all`` when no
target is given: the README's bare ``orion-check install``, which Orion refused), ``orion-check runtime
server`` the GPU host's state (GPUs, MPS, oriond, whether its listen port can be reached, its controller),
``orion-check runtime client`` the controller this client would use (ORION_CONTROLLER, else
``~/.orion/client.conf``, else ``/etc/orion/client.conf``, else Orion's default 127.0.0.1:9123, said to be the
default, not a file's).

It lives in guest_runtime, not on the host side, because Orion's client installer puts it into every VM and
container; it therefore imports nothing from ``controller`` or ``host_agent`` (the orion-guest wheel forbids
both) and speaks to the controller over its plain-text REST API. The exit status is 0 when every check that
matters passed, 1 otherwise (the bash original always ended 0; a status is more useful to scripts).
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import TextIO

from ivshmem.shared import ini
from ivshmem.shared.version import version_line

from . import check_host
from .check_controller import DEFAULT_SOURCE, check_controller
from .client_config import (
    DEFAULT_ADDRESS,
    SYSTEM_CONF,
    ClientConfigError,
    ControllerSetting,
    controller_setting,
    read_conf,
    user_conf,
)

SERVER_CONF = Path(ini.SERVER_CONF)
HELP = """NAME: Orion Health Check Tool
VERSION: v0.1
USAGE:
    orion-check install [server|client|controller|all]    (all when omitted)
    orion-check runtime {server|client}
    orion-check -h"""
INSTALL_TARGETS = ("server", "client", "controller", "all")


def _row(name: str, ok: bool | str, out: TextIO) -> None:
    value = ok if isinstance(ok, str) else ("Yes" if ok else "No")
    print(f"{name + ' :':<40} [{value}]", file=out)


def install(target: str, out: TextIO) -> int:
    print("===============================================", file=out)
    print("Installation summaries :", file=out)
    print(file=out)
    _row("OS", check_host.os_name(), out)
    if target in ("server", "all"):
        _row("RDMA", check_host.rdma(), out)
        _row("CUDA", check_host.cuda_driver() is not None, out)
        _row("NVIDIA GPU", check_host.gpus() is not None, out)
        _row("NVIDIA CUDA MPS", "ON" if check_host.mps_running() else "OFF", out)
        _row("QEMU-KVM environment", check_host.libvirt_qemu(), out)
        _row("Docker container environment", check_host.docker(), out)
        _row("Orion Server binary", check_host.on_path("oriond"), out)
    if target in ("client", "all"):
        _row("Orion client runtime", True, out)  # this very module is part of it
    if target in ("controller", "all"):
        _row("etcd", check_host.on_path("etcd"), out)
        _row("Orion Controller binary", check_host.on_path("orion-controller"), out)
    return 0


def _gpu_section(out: TextIO) -> bool:
    print("Searching NVIDIA GPU ...", file=out)
    found = check_host.gpus()
    if found is None:
        print("[Error] No NVIDIA GPU driver is found (nvidia-smi does not answer).", file=out)
        return False
    driver, names = found
    print(f"CUDA driver {driver}", file=out)
    print(f"{driver} is installed.", file=out)
    print(f"{len(names)} NVIDIA GPU{'s are' if len(names) != 1 else ' is'} found :", file=out)
    for i, name in enumerate(names):
        print(f"    {i} : {name}", file=out)
    return True


def _network_section(bind_addr: str, listen_port: str, conf_path: Path, out: TextIO) -> bool:
    """Orion's "Orion Server can be reached through IP:PORT": oriond's listen port, where the oriond of another
    host relays sessions to this one (docs/remote.md), accepts a TCP connection."""
    fix = (f"bind_addr and listen_port in {conf_path} (oriond's -b and -p) must be an address of this host and a "
           f"free port")
    if not (listen_port.isascii() and listen_port.isdigit() and 1 <= int(listen_port) <= 65535):
        print(f"[Error] Listening Port {listen_port!r} is not a port number (1 to 65535): oriond cannot listen "
              f"there, so other hosts cannot relay sessions to this host; {fix}.", file=out)
        return False
    address = check_host.dialled(bind_addr)
    where = check_host.host_port(address, int(listen_port))
    why = check_host.reach(address, int(listen_port))
    if why is None:
        wildcard = f" (bind_addr {bind_addr}: every address of this host)" if address != bind_addr.strip("[]") else ""
        print(f"Orion Server can be reached through {where}{wildcard}", file=out)
        return True
    print(f"[Error] Orion Server cannot be reached through {where} ({why}): other hosts cannot relay sessions to "
          f"this host (its local sessions are not affected). Check that oriond runs (its log says where it "
          f"listens), that {fix}, and that no firewall drops the port.", file=out)
    return False


def runtime_server(out: TextIO) -> int:
    ok = _gpu_section(out)
    print(file=out)
    print("Checking NVIDIA MPS ...", file=out)
    print(f"NVIDIA CUDA MPS is {'on' if check_host.mps_running() else 'off'}.", file=out)
    print(file=out)
    print("Checking Orion Server status ...", file=out)
    proc = check_host.oriond()
    conf_path = proc.config(SERVER_CONF) if proc is not None else SERVER_CONF
    server = read_conf(conf_path).get("server", {})
    if proc is None:
        print("Orion Server is not running.", file=out)
        ok = False
    else:
        print(f"Orion Server is running with Linux user   : {proc.user}", file=out)
        print(f"Orion Server is running with command line : {proc.cmdline}", file=out)
    yes = {"true": "Yes", "false": "No"}
    print(f"{'Enable SHM':<40}[{yes.get(server.get('enable_shm', 'true'), 'No')}]", file=out)
    print(f"{'Enable RDMA':<40}[{yes.get(server.get('enable_rdma', 'false'), 'No')}]", file=out)
    print(f"{'Enable Local QEMU-KVM with SHM':<40}[{yes.get(server.get('enable_kvm', 'false'), 'No')}]", file=out)
    # oriond's -b and -p override server.conf (host_agent/daemon/oriond.py); Orion's defaults otherwise
    bind_addr = (proc.option("-b") if proc else "") or server.get("bind_addr", "127.0.0.1")
    listen_port = (proc.option("-p") if proc else "") or server.get("listen_port", "9960")
    print(f"{'Binding IP Address :':<40}{bind_addr}", file=out)
    print(f"{'Listening Port :':<40}{listen_port}", file=out)
    print(file=out)
    print("Testing the Orion Server network ...", file=out)
    ok = _network_section(bind_addr, listen_port, conf_path, out) and ok
    print(file=out)
    print("Checking Orion Controller status ...", file=out)
    env = proc.environ if proc is not None else {}
    try:
        setting = controller_setting(env, files=(conf_path,))
    except ClientConfigError as exc:
        print(f"[Error] {exc}", file=out)
        return 1
    if setting is None:
        print(f"[Info] No Orion Controller is configured (ORION_CONTROLLER in oriond's environment, controller_addr "
              f"in {conf_path}), so oriond registers with none; checking the default address.", file=out)
        setting = ControllerSetting(DEFAULT_ADDRESS, DEFAULT_SOURCE)
    return 0 if check_controller(setting, out) and ok else 1


def runtime_client(out: TextIO) -> int:
    """Orion's "Using ... configuration in FILE" names the file the address came from, and only then."""
    try:
        setting = controller_setting()
    except ClientConfigError as exc:
        print(f"[Error] {exc}", file=out)
        return 1
    if setting is None:
        print(f"[Info] No Orion Controller is configured (ORION_CONTROLLER, controller_addr in {user_conf()} or "
              f"{SYSTEM_CONF}); checking the default address.", file=out)
        setting = ControllerSetting(DEFAULT_ADDRESS, DEFAULT_SOURCE)
        print(file=out)
    elif not setting.from_env:
        print(f"Using Orion Controller configuration in {setting.source}", file=out)
        print(file=out)
    return 0 if check_controller(setting, out) else 1


def main(argv: list[str] | None = None, out: TextIO | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    out = out or sys.stdout
    if args[:1] == ["--version"]:
        print(version_line("orion-check"), file=out)
        return 0
    if args and args[0] in ("-h", "--help", "help"):
        print(HELP, file=out)
        return 0
    if args == ["install"]:
        return install("all", out)
    if len(args) < 2:
        print("Invalid usage for Orion Health Check Tool.", file=out)
        print(HELP, file=out)
        return 1
    if len(args) == 2 and args[0] == "install" and args[1] in INSTALL_TARGETS:
        return install(args[1], out)
    if args == ["runtime", "server"]:
        return runtime_server(out)
    if args == ["runtime", "client"]:
        return runtime_client(out)
    print("Invalid parameters.", file=out)
    print(HELP, file=out)
    return 1


if __name__ == "__main__":
    sys.exit(main())
