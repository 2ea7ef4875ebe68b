"""The interpreter start-up hook that orion_guest.pth runs in every Python process of an environment with
orion-guest installed: cheap (the standard library's os and sys only) unless Orion's environment asks for
forwarding, and never in a host-side command.

Everything that forwarding needs (the wire, the call table, the capsule hook, cuda.bindings' capsules) is
imported by guest_runtime.activate, and only when forwarding is wanted: a program that does not use Orion
must not pay for it at start-up.
"""
from __future__ import annotations

import os
import sys
from collections.abc import Mapping

TRIGGERS = ("ORION_VGPU", "ORION_CONTROLLER", "ORION_SHM")

# The host side's packages and commands: they read ORION_CONTROLLER themselves (oriond: server.conf's override),
# and on a GPU host that also has orion-guest's .pth installed (setup.sh's environment), Orion's variables in
# their environment must never turn forwarding on inside them (oriond would forward its own CUDA calls).
# HOST_COMMANDS is every console script of pyproject.toml whose module is in a host package (written out, since this
# hook may import nothing but os and sys; tests/unit/test_host_side_never_forwards.py holds it to pyproject.toml).
HOST_PACKAGES = ("host_agent", "controller", "libvirt_hooks", "xml_templates")
HOST_COMMANDS = ("oriond", "orion-controller", "orion-wire-demo", "orion-hooks", "orion-domain", "orion-smi",
                 "orion-shm", "orion-k8s-plugin")
_OPTIONS_WITH_VALUE = ("-W", "-X", "-Q")


def wanted(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether Orion's environment asks for forwarding in this process."""
    return any(environ.get(name) for name in TRIGGERS)


def runs_host_side(argv: list[str] | None = None) -> bool:
    """Whether this interpreter was started to run a host-side command or module (from sys.orig_argv)."""
    args = list(sys.orig_argv if argv is None else argv)[1:]
    while args:
        arg = args.pop(0)
        if arg == "-m":
            return bool(args) and args[0].split(".")[0] in HOST_PACKAGES
        if arg == "-c" or arg == "-":
            return False
        if arg in _OPTIONS_WITH_VALUE:
            args = args[1:]
        elif not arg.startswith("-"):
            return os.path.basename(arg) in HOST_COMMANDS
    return False


# The other names the native driver is opened by, each an alias library beside it (native/build.py builds them):
# "libcuda.so" (cuBLAS on the H100 opens that) and "libnvidia-ml.so.1", the NVML it also answers (native/nvml.c).
NATIVE_ALIASES = ("libcuda.so", "libnvidia-ml.so.1")
NATIVE_LIBRARY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "native", "lib", "libcuda.so.1")


def native_library(environ: Mapping[str, str] = os.environ) -> tuple[str | None, str]:
    """The native guest driver this process would load (docs/native-driver.md), or None, and why in words.

    The default wherever it was built (`pip install` compiles it; setup.sh in a checkout), or the build
    ORION_NATIVE_LIB names; ORION_NATIVE=0 asks for the capsule path instead."""
    if environ.get("ORION_NATIVE") == "0":
        return None, "the capsule path (ORION_NATIVE=0)"
    path = environ.get("ORION_NATIVE_LIB") or NATIVE_LIBRARY
    if not os.path.isfile(path):
        return None, f"no native driver at {path} (built by pip install with a C compiler)"
    return path, f"native driver {path}"


def load_native(path: str) -> None:
    """Load the native driver under its SONAME libcuda.so.1 before any framework opens the CUDA driver: the
    dynamic loader then answers every later dlopen("libcuda.so.1") with it (checked on the GPU machine with
    cuda-python, PyTorch, CuPy and JAX)."""
    import ctypes
    # for its vGPU lease helper (guest_runtime/vgpu_lease.py): this interpreter, and where guest_runtime is
    os.environ.setdefault("ORION_PYTHON", sys.executable)
    os.environ.setdefault("ORION_GUEST_ROOT", os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ctypes.CDLL(path, mode=os.RTLD_NOW | os.RTLD_GLOBAL)
    for name in NATIVE_ALIASES:  # for a dlopen by those names
        alias = os.path.join(os.path.dirname(path), name)
        if os.path.isfile(alias):
            ctypes.CDLL(alias, mode=os.RTLD_NOW | os.RTLD_GLOBAL)


_said_no_native = False


def autoload() -> None:
    """Turn forwarding on if Orion's environment is set and this is not a host-side command: the native driver
    where it is installed, else the capsule path (one line on stderr says so, unless ORION_NATIVE=0 asked for it);
    a failure is one line on stderr, never a broken start-up."""
    if not wanted() or runs_host_side():
        return
    native, why = native_library()
    global _said_no_native
    if native is None and why.startswith("no native driver") and not _said_no_native:  # say once what it lacks
        _said_no_native = True
        print(f"orion: {why}; using the capsule path, which serves cuda-python programs but not PyTorch, CuPy or "
              "JAX (install orion-guest where a C compiler is, or the prebuilt wheel `make wheels` writes: "
              "docs/native-driver.md)", file=sys.stderr)
    if native:
        try:
            load_native(native)
            return
        except OSError as exc:
            print(f"orion: the native driver {native} did not load ({exc}); using the capsule path",
                  file=sys.stderr)
    try:
        from . import activate
        activate.activate()
    except Exception as exc:  # never break the interpreter's start-up
        print(f"orion: CUDA forwarding is not active: {exc}", file=sys.stderr)
