"""What ``orion-check`` looks at on this machine: OS, the CUDA driver, GPUs, MPS, libvirt, Docker, oriond (and
whether its listen port, where other hosts relay sessions to, accepts a connection).

Each probe runs a bounded command or reads /proc and /etc, and answers a plain value; orion_check.py prints
them in Orion's layout. Standard library only (it ships in the ``orion-guest`` wheel with orion-check, and must
work on a guest that has no GPU, no libvirt and no host-side package).
"""
from __future__ import annotations

import ctypes
import os
import shutil
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

COMMAND_TIMEOUT_S = 10.0
CONNECT_TIMEOUT_S = 2.0  # oriond's listen port, on this host: it answers at once or not at all


def run(argv: list[str]) -> str | None:
    """stdout of a command, or None if it is missing, fails or exceeds the timeout."""
    if shutil.which(argv[0]) is None:
        return None
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def os_name() -> str:
    info = {}
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            key, _, value = line.partition("=")
            info[key] = value.strip('"')
    except OSError:
        pass
    return info.get("PRETTY_NAME", "unknown")


def gpus() -> tuple[str, list[str]] | None:
    """(driver version, GPU names) from nvidia-smi, or None when there is no NVIDIA driver here."""
    out = run(["nvidia-smi", "--query-gpu=driver_version,gpu_name", "--format=csv,noheader"])
    if not out:
        return None
    rows = [[part.strip() for part in line.split(",", 1)] for line in out.splitlines() if "," in line]
    return (rows[0][0], [row[1] for row in rows]) if rows else None


@dataclass(frozen=True)
class Process:
    pid: int
    user: str
    argv: list[str]
    environ: dict[str, str]

    @property
    def cmdline(self) -> str:
        return " ".join(self.argv)

    def config(self, default: Path) -> Path:
        """The server.conf this oriond reads: its ``--config`` argument, else the default."""
        argv = self.argv
        return Path(argv[argv.index("--config") + 1]) if "--config" in argv[:-1] else default

    def option(self, flag: str) -> str:
        """The value of one of oriond's one-letter options (``-b IP``, ``-p9960``, ``-p=9960``; the last one
        wins, as for argparse), "" when it was not given: ``-b`` and ``-p`` override server.conf."""
        value = ""
        own = [i for i, a in enumerate(self.argv[:3])
               if os.path.basename(a) == "oriond" or a == "host_agent.daemon.oriond"]
        start = own[0] + 1 if own else 1  # past the interpreter's own options (python3 -b -m host_agent.daemon.oriond)
        for i, arg in enumerate(self.argv[start:], start):
            if arg == flag:
                value = self.argv[i + 1] if i + 1 < len(self.argv) else ""
            elif arg.startswith(flag) and not arg.startswith("--"):
                value = arg[len(flag):].removeprefix("=")
        return value


def _processes() -> list[tuple[int, list[str]]]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            found.append((int(entry.name), [a.decode(errors="replace") for a in argv if a]))
    return found


def mps_running() -> bool:
    return any(argv and os.path.basename(argv[0]) == "nvidia-cuda-mps-control" for _, argv in _processes())


def oriond() -> Process | None:
    """The running oriond: the ``oriond`` script, or ``python -m host_agent.daemon.oriond``."""
    for pid, argv in _processes():
        names = [os.path.basename(a) for a in argv[:3]]
        if "oriond" in names or "host_agent.daemon.oriond" in argv[:3]:
            try:
                import pwd
                user = pwd.getpwuid(Path(f"/proc/{pid}").stat().st_uid).pw_name
                raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except (OSError, KeyError):
                user, raw = "unknown", []
            env = dict(e.decode(errors="replace").partition("=")[::2] for e in raw if b"=" in e)
            return Process(pid, user, argv, env)
    return None


def libvirt_qemu() -> bool:
    """Orion's test: libvirtd runs and ``virsh version`` answers (its major-2 rule is dropped: any QEMU works)."""
    running = any(argv and os.path.basename(argv[0]) == "libvirtd" for _, argv in _processes())
    return running and run(["virsh", "version"]) is not None


def docker() -> bool:
    return run(["docker", "version"]) is not None


def reach(address: str, port: int, timeout_s: float = CONNECT_TIMEOUT_S) -> str | None:
    """None when a TCP connection to address:port is accepted within ``timeout_s``, else why not (a few words).
    The connection is closed at once; oriond's relay listener takes it for a relay that said nothing."""
    try:
        with socket.create_connection((address, port), timeout=timeout_s):
            return None
    except TimeoutError:
        return f"no answer within {timeout_s:g} s"
    except OSError as exc:
        return exc.strerror or str(exc) or type(exc).__name__


def dialled(bind_addr: str) -> str:
    """Where to connect to reach a server bound to ``bind_addr``: a wildcard address means this host's loopback."""
    return {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1", "[::]": "::1"}.get(bind_addr, bind_addr.strip("[]"))


def host_port(address: str, port: int) -> str:
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def rdma() -> bool:
    return Path("/dev/infiniband/rdma_cm").exists()


def cuda_driver() -> str | None:
    """The CUDA version of the NVIDIA driver this process can load, e.g. "13.0"; None without one.

    A driver is a loadable libcuda.so.1 whose cuDriverGetVersion succeeds. A toolkit under /usr/local/cuda*
    (Orion's test, which says Yes on a GPU-less build host), a Python package such as cuda-python, or the
    toolkit's stub libcuda (it answers CUDA_ERROR_STUB_LIBRARY) is no driver: oriond could not run a call."""
    try:
        get_version = ctypes.CDLL("libcuda.so.1").cuDriverGetVersion
    except (OSError, AttributeError):
        return None
    get_version.argtypes = [ctypes.POINTER(ctypes.c_int)]
    get_version.restype = ctypes.c_int
    version = ctypes.c_int(0)
    if get_version(ctypes.byref(version)) != 0 or version.value <= 0:
        return None
    return f"{version.value // 1000}.{version.value % 1000 // 10}"


def on_path(name: str) -> bool:
    return shutil.which(name) is not None
