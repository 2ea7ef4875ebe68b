"""Build the native wire client, or the whole native guest driver, with the system C compiler.

    python guest_runtime/native/build.py OUTPUT.so            the wire client alone
    python -m guest_runtime.native.build --driver libcuda.so.1  the native guest driver (docs/native-driver.md)

Stdlib only: the guest image and the host (setup.sh installs gcc) have a compiler, pip does not need one of its
own. `$CC` wins over `cc` and `gcc`. A missing compiler or a failed compile is one line and exit status 1.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from guest_runtime.startup import NATIVE_ALIASES
from ivshmem.shared.compiler import CFLAGS, find_compiler

SOURCE_DIR = Path(__file__).resolve().parent
SOURCES = ("orion_wire.c", "copy_helper.c")
LIBS = ("-lpthread",)


class BuildError(Exception):
    """The library could not be built; the message is one line that says why."""


def wire_sources() -> list[Path]:
    """The wire client's C files (orion_wire.h's API), to compile into a program or library of one's own (the
    benchmarks' C clients), with write_region_header's directory on the include path."""
    return [SOURCE_DIR / s for s in SOURCES]


def build_library(output: str | os.PathLike[str]) -> Path:
    """Compile the wire client alone into `output` (its directory is created, with the generated orion_region.h
    beside it); raises BuildError with one line."""
    target = Path(output)
    write_region_header(target.parent)
    return _compile(target, wire_sources(), [f"-I{target.parent}"])


def write_region_header(directory: Path) -> Path:
    """orion_region.h in `directory` (created): the region's, record cells' and control words' layout from ivshmem
    (gen_libcuda.generate_region), which orion_wire.c and vgpu_lease.c include; compile with `-I directory`."""
    from guest_runtime.native.gen_libcuda import generate_region

    directory.mkdir(parents=True, exist_ok=True)
    header = directory / "orion_region.h"
    header.write_text(generate_region())
    return header


def build_driver(output: str | os.PathLike[str]) -> Path:
    """The native guest driver: the entry points generated from the call table (gen_libcuda.py, written beside
    `output` with the headers orion_calls.h, orion_layouts.h and orion_region.h) and every C file of this directory
    (the process's channel, the wire client, the hand-written calls, the export tables), as a library whose SONAME is
    libcuda.so.1 that also exports cuda.h's versioned names (cuMemAlloc_v2...) as the real driver does."""
    from guest_runtime.native.gen_libcuda import abi_aliases, generate, generate_header, generate_layouts

    target = Path(output)
    target.parent.mkdir(parents=True, exist_ok=True)
    calls = target.with_name(target.name + ".calls.c")
    calls.write_text(generate())
    target.with_name("orion_calls.h").write_text(generate_header())
    target.with_name("orion_layouts.h").write_text(generate_layouts())  # payload offsets and sizes
    write_region_header(target.parent)  # the region's, record cells' and control words' offsets
    aliases = [f"-Wl,--defsym,{alias}={name}" for alias, name in abi_aliases()]  # cuMemAlloc_v2 = cuMemAlloc
    _compile(target, [calls, *sorted(SOURCE_DIR.glob("*.c"))],
             ["-Wl,-soname,libcuda.so.1", f"-I{SOURCE_DIR}", f"-I{target.parent}", *aliases])
    for name in ALIASES:
        build_alias(target, name)
    return target


ALIASES = NATIVE_ALIASES  # each built beside the driver by build_alias, and loaded with it by the start-up hook


def build_alias(library: Path, name: str) -> Path:
    """`name` beside the driver: an empty library of that SONAME that needs libcuda.so.1. The loader does not
    match a dlopen of another name against the driver's SONAME; once this alias is loaded too, that dlopen gets
    it, and every symbol looked up through it resolves in its dependency, the driver, so the process still has one
    driver (one channel)."""
    alias = library.with_name(name)
    empty = library.with_name(name + ".c")
    empty.write_text(f"/* {name}, an alias of the Orion native driver (build.py): no code of its own */\n")
    return _compile(alias, [empty, library], [f"-Wl,-soname,{name}", "-Wl,--no-as-needed"])


def _compile(target: Path, sources: list[Path], extra: list[str]) -> Path:
    compiler = find_compiler()
    if compiler is None:
        raise BuildError("no C compiler found (set CC, or install gcc: apt-get install gcc) to build the Orion "
                         "native library")
    target.parent.mkdir(parents=True, exist_ok=True)
    command = [*compiler, *CFLAGS, *extra, "-o", str(target), *(str(s) for s in sources), *LIBS]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BuildError(f"{compiler[0]} could not run: {exc}") from None
    if done.returncode != 0:
        first = next((line for line in done.stderr.splitlines() if "error" in line), done.stderr.strip()[:300])
        raise BuildError(f"{compiler[0]} failed to build {target.name}: {first}")
    return target


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    driver = args[:1] == ["--driver"]
    args = args[1:] if driver else args
    if len(args) != 1:
        print("usage: build.py [--driver] OUTPUT.so", file=sys.stderr)
        return 2
    try:
        print(build_driver(args[0]) if driver else build_library(args[0]))
    except BuildError as exc:
        print(f"build.py: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
