"""The CUDA driver API as cuda.h declares it: every entry point, and the types their parameters use.

    python -m guest_runtime.native.gen_libcuda --inventory /usr/local/cuda/include/cuda.h   refresh cuda_h.txt

The call table (driver_api.py) is built from this inventory rather than call by call: every entry point in it is
forwarded, answered in the guest or unsupported with a written reason (api_classes.py), and
tests/unit/test_api_classes.py fails when cuda.h declares an entry point the inventory lacks or the table leaves
unclassified. The inventory is committed (`cuda_h.txt`), since guests and hosts have no toolkit; it is
regenerated from a toolkit's cuda.h, and keeps names an earlier header or the installed cuda-bindings wheel
declared (names only grow: a library must still export an entry point a newer runtime resolves).

The inventory also keeps which pointer parameters cuda.h's documentation lets a caller pass as NULL ("Both
parameters pbase and psize are optional", "paramSize - Optionally returns ...", "A NULL may be passed in for
*leastPriority"): a forwarded call must answer those as the driver does, not CUDA_ERROR_INVALID_VALUE (NCCL frees
its cuMem buffers with `cuMemGetAddressRange(NULL, &size, ptr)`). Found from the documentation's own phrases, so a
new entry point's optional outputs are found when the inventory is regenerated.

Signatures are spelled as the wheel's `cuda.bindings.cydriver` capsules spell them (`char const *`,
`unsigned PY_LONG_LONG`), so the table can be held to both. Parsing is deliberately small: cuda.h declares every
entry point as `CUresult CUDAAPI name(params);`, outside the block of pre-versioned ABIs
(`__CUDA_API_VERSION_INTERNAL`), and its handle, enum and scalar types as one-line typedefs. Standard library
only: the guest and the host both read this module's output.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

INVENTORY = Path(__file__).with_name("cuda_h.txt")

_DECLARATION = re.compile(r"CUresult\s+CUDAAPI\s+(cu\w+)\s*\(([^;{]*?)\)\s*;")
_ENUM = re.compile(r"typedef\s+enum\s+\w*\s*\{[^}]*\}\s*(\w+)\s*;")
_HANDLE = re.compile(r"typedef\s+struct\s+\w+\s*\*\s*(\w+)\s*;")
_ALIAS = re.compile(r"typedef\s+((?:unsigned\s+)?(?:long\s+long|int|short|char|\w+))\s+(\w+)\s*;")
_PARAM = re.compile(r"(.*?)(\w+)\s*(\[\s*\w*\s*\])?$")
_DOCUMENTED = re.compile(r"/\*\*((?:(?!\*/).)*?)\*/\s*(?:__CUDA_DEPRECATED\s+)?"
                         r"CUresult\s+CUDAAPI\s+(cu\w+)\s*\(([^;{]*?)\)\s*;", re.S)
# What cuda.h says of a parameter a caller may leave NULL: in its \param text, or in a sentence that names it first.
_MAY_BE_NULL = re.compile(r"\b(?:[Mm]ay|[Cc]an)\s+be\s+NULL|\bare\s+(?:both\s+)?optional|\bis\s+optional|"
                          r"is\s+NULL,?\s+it\s+is\s+ignored|^(?:An?\s+|The\s+)?[Oo]ptional(?:ly)?\b|\bIf\s+NULL\b")
# ... or in "A NULL may be passed in for \p *a or \p *b": the names that follow.
_NULL_PASSED = re.compile(r"NULL\s+may\s+be\s+passed\s+(?:in\s+)?(?:for|as)\b(.*)")
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
    optional: dict[str, tuple[int, ...]] = field(default_factory=dict)  # entry point -> parameters that may be NULL


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


def _names(params: str) -> list[str]:
    """The parameter names of a declaration's parameter list."""
    names = []
    for param in params.split(","):
        param = " ".join(param.split())
        match = _PARAM.match(param) if param not in ("", "void") else None
        if match is not None:
            names.append(match.group(2))
    return names


def _may_be_null(doc: str, names: list[str]) -> set[int]:
    """The parameters a declaration's documentation lets a caller pass as NULL."""
    doc = re.sub(r"\n\s*\*", "\n", doc)
    found = set()
    for index, name in enumerate(names):
        described = re.search(rf"\\param\s+{name}\s+(.*?)(?=\\param|\\return|\\note|\n\s*\n)", doc, re.S)
        if described and _MAY_BE_NULL.search(described.group(1).lstrip(" -")):
            found.add(index)
    mention = r"\\p\s+\*?({})\b".format("|".join(map(re.escape, names)) or "$^")
    for sentence in re.split(r"(?<=\.)\s+", doc):
        allowed = _MAY_BE_NULL.search(sentence)
        if allowed:  # "\p a and \p b are optional": the names before the phrase
            found |= {names.index(n) for n in re.findall(mention, sentence[:allowed.start()])}
        passed = _NULL_PASSED.search(sentence)
        if passed:  # "A NULL may be passed in for \p *a or \p *b": the names after it
            found |= {names.index(n) for n in re.findall(mention, passed.group(1))}
    return found


def optional_parameters(text: str, entries: dict[str, str]) -> dict[str, tuple[int, ...]]:
    """cuda.h's documented NULL-able parameters by entry point (only declarations whose parameter count is the
    entry point's: not the pre-versioned ABIs)."""
    optional: dict[str, tuple[int, ...]] = {}
    for doc, name, params in _DOCUMENTED.findall(text):
        names = _names(params)
        signature = entries.get(name, "")
        if not signature or len(names) != (0 if signature.endswith("(void)") else signature.count(",") + 1):
            continue
        found = _may_be_null(doc, names)
        if found:
            optional[name] = tuple(sorted(found))
    return dict(sorted(optional.items()))


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
    return Inventory(entries, frozenset(enums), frozenset(handles), scalars, optional_parameters(text, entries))


def read(path: Path = INVENTORY) -> Inventory:
    """The committed inventory."""
    entries, enums, handles, scalars, optional = {}, set(), set(), {}, {}
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
        elif kind == "optional":
            optional[name] = tuple(int(i) for i in rest[0].split())
        else:
            raise ValueError(f"{path}: unknown line {line!r}")
    return Inventory(entries, frozenset(enums), frozenset(handles), scalars, optional)


def merged(header: Inventory, earlier: Inventory, wheel: dict[str, str]) -> Inventory:
    """cuda.h's inventory, keeping what an earlier one held and the wheel's entry points the header lacks (cuda.h's
    signature wins where both have one)."""
    entries = {**earlier.entry_points, **{k: v for k, v in wheel.items() if k not in header.entry_points},
               **header.entry_points}
    return Inventory(dict(sorted(entries.items())), earlier.enums | header.enums, earlier.handles | header.handles,
                     dict(sorted({**earlier.scalars, **header.scalars}.items())),
                     dict(sorted({**earlier.optional, **header.optional}.items())))


def write(inventory: Inventory, path: Path = INVENTORY, source: str = "") -> None:
    lines = [
        f"# The CUDA driver API's entry points and parameter types, from {source or 'cuda.h'} and the installed",
        "# cuda-bindings wheel's capsules. Generated: python -m guest_runtime.native.gen_libcuda --inventory CUDA_H.",
    ]
    lines += [f"entry {name} {signature}" for name, signature in inventory.entry_points.items()]
    lines += [f"enum {name}" for name in sorted(inventory.enums)]
    lines += [f"handle {name}" for name in sorted(inventory.handles)]
    lines += [f"scalar {name} {ctype}" for name, ctype in inventory.scalars.items()]
    lines += [f"optional {name} {' '.join(map(str, indices))}" for name, indices in inventory.optional.items()]
    path.write_text("\n".join(lines) + "\n")
