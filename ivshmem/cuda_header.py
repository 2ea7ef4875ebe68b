"""The CUDA driver API as cuda.h declares it: every entry point, and the types their parameters use.

    python -m guest_runtime.native.gen_libcuda --inventory /usr/local/cuda/include/cuda.h   refresh cuda_h.txt

The call table (driver_api.py) is built from this inventory rather than call by call: every entry point in it is
forwarded, answered in the guest or unsupported with a written reason (api_classes.py), and
tests/unit/test_api_classes.py fails when cuda.h declares an entry point the inventory lacks or the table leaves
unclassified. The inventory is committed (`cuda_h.txt`), since guests and hosts have no toolkit; it is
regenerated from a toolkit's cuda.h, and keeps names an earlier header or the installed cuda-bindings wheel
declared (names only grow: a library must still export an entry point a newer runtime resolves).

Signatures are spelled as the wheel's `cuda.bindings.cydriver` capsules spell them (`char const *`,
`unsigned PY_LONG_LONG`), so the table can be held to both. Parsing is deliberately small: cuda.h declares every
entry point as `CUresult CUDAAPI name(params);`, outside the block of pre-versioned ABIs
(`__CUDA_API_VERSION_INTERNAL`), and its handle, enum and scalar types as one-line typedefs. Standard library
only: the guest and the host both read this module's output.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

INVENTORY = Path(__file__).with_name("cuda_h.txt")

_DECLARATION = re.compile(r"CUresult\s+CUDAAPI\s+(cu\w+)\s*\(([^;{]*?)\)\s*;")
_ENUM = re.compile(r"typedef\s+enum\s+\w*\s*\{[^}]*\}\s*(\w+)\s*;")
_HANDLE = re.compile(r"typedef\s+struct\s+\w+\s*\*\s*(\w+)\s*;")
_ALIAS = re.compile(r"typedef\s+((?:unsigned\s+)?(?:long\s+long|int|short|char|\w+))\s+(\w+)\s*;")
_PARAM = re.compile(r"(.*?)(\w+)\s*(\[\s*\w*\s*\])?$")
# The C scalar types a typedef chain may end at, and how the capsules spell them.
C_SCALARS = {"int": "int", "unsigned int": "unsigned int", "unsigned": "unsigned int", "unsigned char":
             "unsigned char", "unsigned short": "unsigned short", "size_t": "size_t", "float": "float",
             "unsigned long long": "unsigned PY_LONG_LONG", "long long": "PY_LONG_LONG", "uint64_t": "cuuint64_t",
             "uint32_t": "cuuint32_t", "cuuint64_t": "cuuint64_t", "cuuint32_t": "cuuint32_t"}


@dataclass(frozen=True)
class Inventory:
    """What cuda.h declares: entry point -> signature; enum and handle type names; scalar typedef -> C type."""

    entry_points: dict[str, str]
    enums: frozenset[str]
    handles: frozenset[str]
    scalars: dict[str, str]


def _strip(text: str) -> str:
    """cuda.h without comments and without its block of pre-versioned ABIs (declared for the driver's own build)."""
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    kept, depth = [], 0  # depth > 0: inside `#if defined(__CUDA_API_VERSION_INTERNAL)`, nested #if levels
    for line in text.split("\n"):
        directive = line.strip()
        if depth:
            if directive.startswith("#if"):
                depth += 1
            elif directive.startswith("#endif"):
                depth -= 1
            continue
        if directive == "#if defined(__CUDA_API_VERSION_INTERNAL)":
            depth = 1
            continue
        kept.append(line)
    return "\n".join(kept)


def _spell(param: str) -> str | None:
    """One C parameter declaration, its name dropped, as the capsules spell its type (None for `void`)."""
    param = " ".join(param.split())
    if param in ("", "void"):
        return None
    match = _PARAM.match(param)
    if match is None:
        raise ValueError(f"cannot read parameter {param!r}")
    ctype, _name, array = match.groups()
    ctype = ctype.strip()
    if not ctype:  # an unnamed parameter: the last word was its type
        ctype = _name
    if array:
        ctype += " *"
    const = ctype.startswith("const ")
    ctype = ctype.removeprefix("const ")
    ctype = re.sub(r"\s*\*", " *", ctype)
    ctype = re.sub(r"\*\s+\*", "**", ctype)
    base, stars = re.fullmatch(r"([^*]*?)\s*(\**)\s*(?:const)?", ctype).groups()  # type: ignore[union-attr]
    base = {"unsigned long long": "unsigned PY_LONG_LONG", "unsigned": "unsigned int"}.get(base, base)
    return " ".join(part for part in (base, "const" if const else "", stars) if part)


def parse(text: str) -> Inventory:
    """Read cuda.h's text."""
    body = _strip(text)
    entries = {}
    for name, params in _DECLARATION.findall(body):
        spelled = [t for t in (_spell(p) for p in params.split(",")) if t is not None]
        entries[name] = f"CUresult ({', '.join(spelled) or 'void'})"
    enums = set(_ENUM.findall(body))
    handles = set(_HANDLE.findall(body))
    aliases: dict[str, str] = {}
    for old, new in _ALIAS.findall(body):  # the first wins: cuda.h declares the LP64 ABI before the 32-bit one
        aliases.setdefault(new, old)
    scalars: dict[str, str] = {}
    for name in aliases:
        seen, target = 0, name
        while target in aliases and seen < 8 and target not in C_SCALARS:
            target, seen = aliases[target], seen + 1
        if target in enums:
            enums.add(name)
        elif target in handles:
            handles.add(name)
        elif target in C_SCALARS:
            scalars[name] = C_SCALARS[target]
    return Inventory(entries, frozenset(enums), frozenset(handles), scalars)


def read(path: Path = INVENTORY) -> Inventory:
    """The committed inventory."""
    entries, enums, handles, scalars = {}, set(), set(), {}
    for line in path.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        kind, name, *rest = line.split(None, 2)
        if kind == "entry":
            entries[name] = rest[0]
        elif kind == "enum":
            enums.add(name)
        elif kind == "handle":
            handles.add(name)
        elif kind == "scalar":
            scalars[name] = rest[0]
        else:
            raise ValueError(f"{path}: unknown line {line!r}")
    return Inventory(entries, frozenset(enums), frozenset(handles), scalars)


def merged(header: Inventory, earlier: Inventory, wheel: dict[str, str]) -> Inventory:
    """cuda.h's inventory, keeping what an earlier one held and the wheel's entry points the header lacks (cuda.h's
    signature wins where both have one)."""
    entries = {**earlier.entry_points, **{k: v for k, v in wheel.items() if k not in header.entry_points},
               **header.entry_points}
    return Inventory(dict(sorted(entries.items())), earlier.enums | header.enums, earlier.handles | header.handles,
                     dict(sorted({**earlier.scalars, **header.scalars}.items())))


def write(inventory: Inventory, path: Path = INVENTORY, source: str = "") -> None:
    lines = [
        f"# The CUDA driver API's entry points and parameter types, from {source or 'cuda.h'} and the installed",
        "# cuda-bindings wheel's capsules. Generated: python -m guest_runtime.native.gen_libcuda --inventory CUDA_H.",
    ]
    lines += [f"entry {name} {signature}" for name, signature in inventory.entry_points.items()]
    lines += [f"enum {name}" for name in sorted(inventory.enums)]
    lines += [f"handle {name}" for name in sorted(inventory.handles)]
    lines += [f"scalar {name} {ctype}" for name, ctype in inventory.scalars.items()]
    path.write_text("\n".join(lines) + "\n")
