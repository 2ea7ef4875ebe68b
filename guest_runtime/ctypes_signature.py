"""Turn a Cython capsule signature of cuda-bindings into a ctypes prototype.

Every function of `cuda.bindings.cydriver.__pyx_capi__` (and `cyruntime`) is a PyCapsule whose *name* is its exact C
signature as Cython spells it, for example ``"CUresult (CUdeviceptr, void const *, size_t)"``. To put a ctypes
trampoline behind such a capsule we need, per argument, the ctypes type the C ABI passes it as.

How a type name is classified (the rule, in order):

1. Any ``*`` in the spelling (``T *``, ``T const *``, ``T **``) -> ``c_void_p``. The callee gets the raw address.
2. A C builtin (``int``, ``unsigned int``, ``size_t``, ``unsigned PY_LONG_LONG``, ``float``, ...) -> its ctypes type.
3. An ``enum X`` spelling -> ``c_int``; a ``struct X`` spelling without ``*`` (a struct by value) -> unsupported.
4. Any other name (``CUdeviceptr``, ``CUcontext``, ``CUdevice_attribute``, ``cudaStream_t``, ``GLuint``...) is
   resolved through the typedefs of the wheel's own ``cydriver.pxd``/``cyruntime.pxd`` (shipped next to the
   extension modules): a ``ctypedef enum``/``cdef enum`` is an enum (``c_int``: every CUDA enum is int-sized), a
   ``ctypedef T* X`` or a function-pointer typedef is a pointer (``c_void_p``; this is how every opaque handle —
   CUcontext, CUstream, CUgraph, ... — is declared), a ``struct``/``union`` reached without a pointer is a struct
   by value (unsupported), and a plain ``ctypedef A X`` follows ``A``.

Reading the .pxd files instead of asking `cuda.bindings.driver` which names are enum classes matters: importing
`cuda.bindings.driver` copies the capsule pointers, which is exactly what the hook must come before. (In
cuda-bindings 13.x those enums are not even IntEnum: they are `cuda.bindings._internal._fast_enum.FastEnum`, int
subclasses with `__members__`.) The tests cross-check this classification against the enum classes of
`cuda.bindings.driver` and `runtime` in a separate process. A name found nowhere is unsupported: a wrong guess
would pass garbage through C.

Cython spells its own (non-extern) typedefs mangled, e.g. ``__pyx_t_4cuda_8bindings_8cydriver_GLuint``; the
normalized spelling drops that prefix (``GLuint``) and ``PY_LONG_LONG`` becomes ``long long``.

This module imports only the standard library; it reads the .pxd files lazily, on first use.
"""
from __future__ import annotations

import ctypes
import functools
import importlib.util
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Signature", "TypeTable", "UnsupportedSignature", "classify", "default_type_table", "normalize_type",
           "parse_signature", "split_signature"]

CType = Any  # a ctypes simple type (c_int, c_void_p, ...) or None for void

_BUILTINS: dict[str, CType] = {
    "void": None,
    "char": ctypes.c_char, "signed char": ctypes.c_byte, "unsigned char": ctypes.c_ubyte,
    "short": ctypes.c_short, "unsigned short": ctypes.c_ushort,
    "int": ctypes.c_int, "signed int": ctypes.c_int, "unsigned int": ctypes.c_uint, "unsigned": ctypes.c_uint,
    "long": ctypes.c_long, "unsigned long": ctypes.c_ulong,
    "long long": ctypes.c_int64, "unsigned long long": ctypes.c_uint64,
    "size_t": ctypes.c_size_t, "ssize_t": ctypes.c_ssize_t,
    "intptr_t": ctypes.c_ssize_t, "uintptr_t": ctypes.c_size_t,
    "float": ctypes.c_float, "double": ctypes.c_double, "bool": ctypes.c_bool, "bint": ctypes.c_int,
    "int8_t": ctypes.c_int8, "int16_t": ctypes.c_int16, "int32_t": ctypes.c_int32, "int64_t": ctypes.c_int64,
    "uint8_t": ctypes.c_uint8, "uint16_t": ctypes.c_uint16, "uint32_t": ctypes.c_uint32, "uint64_t": ctypes.c_uint64,
}

# What the capsules of the two modules we hook declare, read from these files next to the extension modules.
_PXD_MODULES = ("cuda.bindings.cydriver", "cuda.bindings.cyruntime")

_ENUM_RE = re.compile(r"^\s*(?:ctypedef|cdef)\s+enum\s+(\w+)")
_STRUCT_RE = re.compile(r"^\s*(?:ctypedef|cdef)\s+(?:packed\s+)?(?:struct|union)\s+(\w+)")
_FUNCPTR_RE = re.compile(r"^\s*ctypedef\s+[\w\s\*]+?\(\s*\*\s*(\w+)")
_ALIAS_RE = re.compile(r"""^\s*ctypedef\s+(?P<base>(?:\w+\s+)*?\w+)\s*(?P<stars>\**)\s*(?P<name>\w+)\s*
                           (?:'[^']*'|"[^"]*")?\s*(?:\#.*)?$""", re.VERBOSE)


class UnsupportedSignature(ValueError):
    """The signature cannot be expressed as a ctypes prototype (a struct by value, an unknown type)."""

    def __init__(self, signature: str, reason: str) -> None:
        super().__init__(f"{signature!r}: {reason}")
        self.signature = signature
        self.reason = reason


@dataclass(frozen=True)
class Signature:
    """A capsule signature as ctypes sees it.

    `restype`/`argtypes` go straight into `ctypes.CFUNCTYPE(restype, *argtypes)`; `arg_ctypes`/`result_ctype` are
    the normalized C spellings ("CUdeviceptr", "void const *", "enum cudaMemcpyKind"), so an implementation can
    tell a `CUdevice_attribute` from an `unsigned int` without re-parsing.
    """

    restype: CType
    argtypes: tuple[CType, ...]
    arg_ctypes: tuple[str, ...]
    result_ctype: str

    @property
    def prototype(self) -> Any:
        return ctypes.CFUNCTYPE(self.restype, *self.argtypes)


def _demangle(name: str) -> str:
    """``__pyx_t_4cuda_8bindings_8cydriver_GLuint`` -> ``GLuint`` (Cython's mangling: length-prefixed components)."""
    if not name.startswith("__pyx_t_"):
        return name
    rest = name[len("__pyx_t_"):]
    while True:
        m = re.match(r"(\d+)", rest)
        if not m:
            return rest
        n = int(m.group(1))
        start = len(m.group(1))
        if rest[start + n:start + n + 1] != "_":
            return rest
        rest = rest[start + n + 1:]


def normalize_type(spelling: str) -> str:
    """Canonical spelling of one C type as Cython writes it: single spaces, ``*`` separated, no Cython mangling."""
    text = spelling.replace("*", " * ")
    words = [_demangle(w) for w in text.split()]
    out = " ".join(words).replace("PY_LONG_LONG", "long long")
    return re.sub(r"\* \*", "**", re.sub(r"\* \*", "**", out))


def split_signature(signature: str) -> tuple[str, list[str]]:
    """``"R (A, B)"`` -> (``"R"``, [``"A"``, ``"B"``]). ``"(void)"`` and ``"()"`` give no arguments."""
    sig = signature.strip()
    if not sig.endswith(")"):
        raise UnsupportedSignature(signature, "does not end with an argument list")
    depth = 0
    for i in range(len(sig) - 1, -1, -1):
        if sig[i] == ")":
            depth += 1
        elif sig[i] == "(":
            depth -= 1
            if depth == 0:
                break
    else:
        raise UnsupportedSignature(signature, "unbalanced parentheses")
    result, inner = sig[:i].strip(), sig[i + 1:-1].strip()
    if not result:
        raise UnsupportedSignature(signature, "no result type")
    args: list[str] = []
    depth, start = 0, 0
    for j, ch in enumerate(inner):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            args.append(inner[start:j].strip())
            start = j + 1
    if inner:
        args.append(inner[start:].strip())
    if args in ([""], ["void"]):
        args = []
    return result, args


STATUS_ENUMS = frozenset({"CUresult", "cudaError_t", "cudaError", "cudaError_enum"})


class TypeTable:
    """Typedef knowledge read from .pxd files: which names are enums, structs, pointers, or aliases of another."""

    def __init__(self) -> None:
        self.enums: set[str] = set()
        self.structs: set[str] = set()
        self.pointers: set[str] = set()
        self.aliases: dict[str, str] = {}  # name -> base spelling (may be a builtin like "unsigned long long")

    @classmethod
    def from_pxd_text(cls, texts: Iterable[str]) -> TypeTable:
        table = cls()
        for text in texts:
            table.add_pxd_text(text)
        return table

    def add_pxd_text(self, text: str) -> None:
        """Learn the typedefs of one .pxd. The first definition of a name wins (cydriver before cyruntime)."""
        for line in text.splitlines():
            if m := _ENUM_RE.match(line):
                self.enums.add(m.group(1))
            elif m := _STRUCT_RE.match(line):
                self.structs.add(m.group(1))
            elif m := _FUNCPTR_RE.match(line):
                self.pointers.add(m.group(1))
            elif m := _ALIAS_RE.match(line):
                name, base = m.group("name"), " ".join(m.group("base").replace("const", " ").split())
                if name in self.aliases or name in self.enums or name in self.structs or name in self.pointers:
                    continue
                if m.group("stars"):
                    self.pointers.add(name)
                elif base in ("enum", "struct", "union"):
                    continue
                else:
                    self.aliases[name] = base

    def resolve(self, name: str) -> tuple[str, CType]:
        """Classify a bare type name: ("scalar", ctype) | ("enum", c_int) | ("pointer", c_void_p) | ("struct", None).

        Raises KeyError for a name that neither the builtins nor the .pxd know.
        """
        seen: set[str] = set()
        while True:
            if name in STATUS_ENUMS:  # however a wheel's .pxd spells them, these are the two status enums
                return "enum", ctypes.c_int
            if name in _BUILTINS:
                return "scalar", _BUILTINS[name]
            if name in self.pointers:
                return "pointer", ctypes.c_void_p
            if name in self.enums:
                return "enum", ctypes.c_int
            if name in self.structs:
                return "struct", None
            if name in seen or name not in self.aliases:
                raise KeyError(name)
            seen.add(name)
            name = self.aliases[name]


def _pxd_path(module: str) -> Path | None:
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / (module.rsplit(".", 1)[-1] + ".pxd")
    return path if path.is_file() else None


@functools.lru_cache(maxsize=1)
def default_type_table() -> TypeTable:
    """The typedefs of the installed wheel's cydriver.pxd and cyruntime.pxd (found without importing them)."""
    texts = []
    for module in _PXD_MODULES:
        path = _pxd_path(module)
        if path is not None:
            texts.append(path.read_text(encoding="utf-8"))
    if not texts:
        raise RuntimeError(f"none of {', '.join(m + '.pxd' for m in _PXD_MODULES)} found: cuda-bindings missing?")
    return TypeTable.from_pxd_text(texts)


def classify(spelling: str, types: TypeTable | None = None) -> tuple[str, CType]:
    """Kind and ctypes type of one normalized C type spelling.

    ("pointer", c_void_p) | ("enum", c_int) | ("scalar", ctype; None for void) | ("struct", None) for a struct by
    value. Raises KeyError for a name unknown to the builtins and to the wheel's .pxd files.
    """
    if "*" in spelling:
        return "pointer", ctypes.c_void_p
    words = [w for w in spelling.split() if w not in ("const", "volatile")]
    if words and words[0] == "enum":
        return "enum", ctypes.c_int
    if words and words[0] in ("struct", "union"):
        return "struct", None
    return (types if types is not None else default_type_table()).resolve(" ".join(words))


def _ctype_of(spelling: str, signature: str, types: TypeTable, *, is_result: bool) -> CType:
    try:
        kind, ctype = classify(spelling, types)
    except KeyError:
        raise UnsupportedSignature(signature, f"unknown type {spelling!r}") from None
    if kind == "struct":
        raise UnsupportedSignature(signature, f"{spelling!r} is a struct passed by value")
    if ctype is None and not is_result:
        raise UnsupportedSignature(signature, "void argument in a list of several")
    return ctype


def parse_signature(signature: str, types: TypeTable | None = None) -> Signature:
    """Parse a capsule name such as ``"CUresult (CUdevice *, int)"`` into a `Signature`.

    Raises `UnsupportedSignature` for what ctypes cannot pass correctly (a struct by value as argument or result,
    a type name unknown to the wheel's .pxd files).
    """
    table = types if types is not None else default_type_table()
    result, args = split_signature(signature)
    result_c = normalize_type(result)
    arg_c = tuple(normalize_type(a) for a in args)
    restype = _ctype_of(result_c, signature, table, is_result=True)
    argtypes = tuple(_ctype_of(a, signature, table, is_result=False) for a in arg_c)
    return Signature(restype=restype, argtypes=argtypes, arg_ctypes=arg_c, result_ctype=result_c)
