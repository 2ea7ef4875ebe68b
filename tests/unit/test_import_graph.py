"""The import rules of docs/architecture.md, read from the source with `ast` (no module is imported or run).

* ivshmem/ is the wire: it imports the standard library and itself, nothing else of the project or outside it.
* No import cycle among the project's modules, counting imports inside functions and type-only ones (a cycle is a
  cycle, even when a lazy import hides it until the day someone moves that import to the top).
* ivshmem/shared/ holds what both sides share besides the wire (ini, controller_client, compiler): like the rest of
  ivshmem, the standard library only.
* guest_runtime/ imports only ivshmem and itself, and nothing but the guest (and tests, benches) imports
  guest_runtime: the host side (host_agent, controller, libvirt_hooks, xml_templates) never does, so the floors read
  one way (host and guest above, ivshmem below).
* host_agent/'s folders, one job each (docs/architecture.md), import its ground floor (the modules outside every
  folder, which import no folder) and only the folders FOLDER_ALLOWS names: session/ (the executor) none, relay/ the
  executor's page-locked pool and hot path, daemon/ the executor and the relay, kvm/ none, admin/ (commands: leaves
  nobody imports) the daemon's configuration and controller link and kvm/, k8s/ the daemon's configuration.
* controller/ imports no host_agent, libvirt or cuda; libvirt_hooks/ never libvirt (a hook runs while libvirt
  holds its locks).
* The guest wheel (guest_runtime/ and ivshmem/) imports nothing outside itself and the standard library except
  what a guest may have: cuda (the program's own cuda-python) and pyverbs (RDMA, from the distribution).

Each violation is one line: file:line, the importing module and what it imports, and the rule it breaks.
"""
from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("ivshmem", "guest_runtime", "host_agent", "controller", "libvirt_hooks", "xml_templates", "tests", "bench")
HOST_SIDE = ("host_agent", "controller", "libvirt_hooks", "xml_templates")
GUEST_WHEEL = ("guest_runtime", "ivshmem")
GUEST_OPTIONAL = frozenset({"cuda", "pyverbs"})
STDLIB = frozenset(sys.stdlib_module_names) | {"__future__"}
FORBIDDEN_OUTSIDE = {"controller": frozenset({"libvirt", "cuda"}), "libvirt_hooks": frozenset({"libvirt"})}


@dataclass(frozen=True)
class Edge:
    """`source` imports `target`: a project module (dotted) or the top-level name of anything else."""

    source: str
    target: str
    path: str
    line: int
    type_only: bool  # under `if TYPE_CHECKING:`: never executed

    @property
    def internal(self) -> bool:
        return self.target.split(".")[0] in PACKAGES

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.source} imports {self.target}"


def _modules() -> dict[str, Path]:
    """Every module of ours, except the guest wheel's build hook (run by the build backend, never imported)."""
    found = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            if path == REPO / "guest_runtime" / "hatch_build.py":
                continue
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


MODULES = _modules()


def _known(name: str) -> str:
    """The longest prefix of `name` that is a project module (`ivshmem.channel.Ctrl` -> `ivshmem.channel`)."""
    parts = name.split(".")
    while parts and ".".join(parts) not in MODULES:
        parts.pop()
    return ".".join(parts) or name


def _type_only_nodes(tree: ast.Module) -> set[int]:
    """ids of the import nodes under `if TYPE_CHECKING:` (or `typing.TYPE_CHECKING`)."""
    hidden: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            for inner in node.body:
                hidden.update(id(n) for n in ast.walk(inner))
    return hidden


def _targets(module: str, is_package: bool, node: ast.Import | ast.ImportFrom) -> Iterator[str]:
    if isinstance(node, ast.Import):
        for alias in node.names:
            yield _known(alias.name) if alias.name.split(".")[0] in PACKAGES else alias.name.split(".")[0]
        return
    if node.level:
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[:len(base) - node.level + 1] + ([node.module] if node.module else [])
        start = ".".join(base)
    else:
        start = node.module or ""
    if start.split(".")[0] not in PACKAGES:
        yield start.split(".")[0]
        return
    for alias in node.names:  # `from pkg import mod` imports the module pkg.mod; `from mod import name`, mod
        yield _known(f"{start}.{alias.name}")


def _edges() -> list[Edge]:
    edges = []
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        hidden = _type_only_nodes(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                for target in _targets(module, path.name == "__init__.py", node):
                    edges.append(Edge(module, target, str(path.relative_to(REPO)), node.lineno, id(node) in hidden))
    return edges


EDGES = _edges()


def _top(name: str) -> str:
    return name.split(".")[0]


def _report(bad: list[str]) -> str:
    return f"{len(bad)} import(s) break the rule:\n" + "\n".join(bad)


def test_the_wire_imports_nothing_but_itself_and_the_standard_library() -> None:
    bad = [f"{e} (ivshmem/ is the wire: it imports the standard library and itself only)" for e in EDGES
           if _top(e.source) == "ivshmem" and _top(e.target) != "ivshmem" and e.target not in STDLIB]
    assert not bad, _report(bad)


def _cycle(graph: dict[str, set[str]], start: str) -> list[str] | None:
    """The shortest import path from `start` back to itself, or None."""
    paths = {start: [start]}
    queue = [start]
    while queue:
        current = queue.pop(0)
        for nxt in sorted(graph.get(current, ())):
            if nxt == start:
                return [*paths[current], start]
            if nxt not in paths:
                paths[nxt] = [*paths[current], nxt]
                queue.append(nxt)
    return None


def test_no_import_cycle() -> None:
    graph: dict[str, set[str]] = {}
    where: dict[tuple[str, str], str] = {}
    for e in EDGES:
        if e.internal and e.target in MODULES and e.target != e.source:
            graph.setdefault(e.source, set()).add(e.target)
            where.setdefault((e.source, e.target), f"{e.path}:{e.line}")
    cycles: list[str] = []
    seen: set[frozenset[str]] = set()
    for module in sorted(graph):
        cycle = _cycle(graph, module)
        if cycle is None or frozenset(cycle) in seen:
            continue
        seen.add(frozenset(cycle))
        steps = ", ".join(where[(a, b)] for a, b in zip(cycle, cycle[1:], strict=False))
        cycles.append(f"import cycle: {' -> '.join(cycle)} ({steps})")
    assert not cycles, _report(cycles)


def test_guest_runtime_imports_only_the_wire_and_itself() -> None:
    bad = [f"{e} (guest_runtime/ may import ivshmem and itself only)" for e in EDGES
           if _top(e.source) == "guest_runtime" and e.internal and _top(e.target) not in GUEST_WHEEL]
    assert not bad, _report(bad)


def test_the_host_side_never_imports_the_guest() -> None:
    bad = [f"{e} (the host side imports no guest_runtime module: what both share lies in ivshmem/shared/)"
           for e in EDGES if _top(e.source) in HOST_SIDE and _top(e.target) == "guest_runtime"]
    assert not bad, _report(bad)


# host_agent's folders, one job each (docs/architecture.md), and what each may import of the rest of host_agent besides
# itself and the ground floor (host_agent's modules outside every folder: errors, handler, session_loop, ...).
FOLDERS = ("daemon", "session", "relay", "kvm", "admin", "k8s")
FOLDER_ALLOWS = {
    "host_agent.session": set(),  # the executor: a handler any session loop drives
    "host_agent.relay": {"host_agent.session.pinned_pool", "host_agent.session.hot_path"},  # the GPU host's worker
    "host_agent.daemon": {"host_agent.session", "host_agent.relay"},  # oriond composes them
    "host_agent.kvm": set(),
    "host_agent.admin": {"host_agent.daemon.config", "host_agent.daemon.controller_link", "host_agent.kvm"},
    "host_agent.k8s": {"host_agent.daemon.config", "host_agent.daemon.cli_args", "host_agent.daemon.pidfile"},
}


def _in(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _folder(module: str) -> str | None:
    """The host_agent folder `module` lies in; None for the ground floor (and outside host_agent)."""
    parts = module.split(".")
    return f"host_agent.{parts[1]}" if len(parts) > 2 and parts[0] == "host_agent" and parts[1] in FOLDERS else None


def test_every_folder_has_a_rule() -> None:
    on_disk = {f"host_agent.{p.name}" for p in (REPO / "host_agent").iterdir() if (p / "__init__.py").exists()}
    assert on_disk == set(FOLDER_ALLOWS), "a host_agent folder without an import rule here, or a rule for none"


def test_host_agents_folders_import_what_their_job_needs_only() -> None:
    bad = []
    for e in EDGES:
        if not _in(e.source, "host_agent") or not _in(e.target, "host_agent"):
            continue
        source, target = _folder(e.source), _folder(e.target)
        if target is None or target == source:
            continue  # the ground floor, or the folder itself
        if source is None:
            bad.append(f"{e} (host_agent's ground floor imports none of its folders)")
        elif not any(_in(e.target, allowed) for allowed in FOLDER_ALLOWS[source]):
            allowed = ", ".join(sorted(FOLDER_ALLOWS[source])) or "nothing"
            bad.append(f"{e} ({source} may import of host_agent's folders {allowed})")
    assert not bad, _report(bad)


def test_controller_and_hooks_keep_out_of_the_gpu_host_and_libvirt() -> None:
    bad = [f"{e} (controller/ imports no host_agent)" for e in EDGES
           if _top(e.source) == "controller" and _top(e.target) == "host_agent"]
    bad += [f"{e} ({_top(e.source)}/ must not import {e.target})" for e in EDGES
            if e.target in FORBIDDEN_OUTSIDE.get(_top(e.source), ())]
    assert not bad, _report(bad)


def test_the_guest_wheel_needs_only_the_standard_library_and_what_a_guest_brings() -> None:
    bad = [f"{e} (the guest wheel may import the standard library, itself, and optionally "
           f"{' and '.join(sorted(GUEST_OPTIONAL))} only)" for e in EDGES
           if _top(e.source) in GUEST_WHEEL and not e.internal and e.target not in STDLIB
           and e.target not in GUEST_OPTIONAL]
    assert not bad, _report(bad)


def test_the_reader_resolves_relative_function_local_and_type_only_imports() -> None:
    """The reader itself: a rule is only as good as the edges it is given."""
    tree = ast.parse("from . import layout\nfrom .channel import Ctrl\nimport host_agent.admin.shm_cli\n"
                     "def f():\n    from host_agent import shm_admin\n"
                     "if TYPE_CHECKING:\n    import cuda.bindings.driver\n")
    imports = [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)]
    targets = {t: id(node) for node in imports for t in _targets("ivshmem.ring", False, node)}
    assert set(targets) == {"ivshmem.layout", "ivshmem.channel", "host_agent.admin.shm_cli", "host_agent.shm_admin",
                            "cuda"}
    assert {t for t, node in targets.items() if node in _type_only_nodes(tree)} == {"cuda"}
