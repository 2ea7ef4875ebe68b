"""What the README and docs/ name exists: every repository path they cite (a folder or file under one of the
project's folders, `module.attribute` forms read as the module's file), every command they show (a code span that
starts with `orion-…` or `oriond`) is a console script of pyproject.toml, and docs/native-driver.md's map of the
native driver's layers names every C and header file of guest_runtime/native. A stale path or command in a doc is a
bug a newcomer trips on; this fails on the first."""
from __future__ import annotations

import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FOLDERS = ("host_agent", "guest_runtime", "ivshmem", "controller", "libvirt_hooks", "xml_templates", "tests", "docs",
           "bench", "deploy", ".ci")
PATH = re.compile(r"(?<![\w/.-])((?:" + "|".join(map(re.escape, FOLDERS)) + r")/[\w./-]*\w)")
COMMAND_SPAN = re.compile(r"`((?:orion-[a-z0-9-]+|oriond))(?=[\s`])")
SCRIPTS = set(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"])
# Names of Orion's that look like commands in a code span and are not (a hook's file, Kubernetes objects).
NOT_COMMANDS = {"orion-vgpu", "orion-system", "orion-cluster-key", "orion-plugin-daemonset",
                "orion-kubernetes-deploy", "orion-relay-client", "orion-relay-server"}


def _exists(cited: str) -> bool:
    """A path, or `path/module.attribute`: the module's file."""
    if (REPO / cited).exists():
        return True
    head, _, _attribute = cited.rpartition(".")
    return bool(head) and (REPO / f"{head}.py").exists()


def test_every_path_the_docs_cite_exists() -> None:
    missing = [f"{doc.relative_to(REPO)}: {cited}" for doc in DOCS for cited in
               sorted({m.group(1) for m in PATH.finditer(doc.read_text())}) if not _exists(cited)]
    assert not missing, "\n".join(missing)


def test_every_command_the_docs_show_is_installed() -> None:
    unknown = [f"{doc.relative_to(REPO)}: {name}" for doc in DOCS for name in
               sorted({m.group(1) for m in COMMAND_SPAN.finditer(doc.read_text())})
               if name not in SCRIPTS and name not in NOT_COMMANDS]
    assert not unknown, "\n".join(unknown)
    assert not NOT_COMMANDS & SCRIPTS  # a name listed as no command that became one


def test_the_native_drivers_file_map_names_every_source_file() -> None:
    text = (REPO / "docs" / "native-driver.md").read_text()
    start = text.index("## Layers of the library")
    layers = text[start:text.index("\n## ", start + 3)]
    named = set(re.findall(r"`([\w]+\.[ch])`", layers))
    for stem, suffixes in re.findall(r"`([\w]+)\.\{([ch,]+)\}`", layers):  # `integrity.{h,c}`
        named |= {f"{stem}.{suffix}" for suffix in suffixes.split(",")}
    sources = {p.name for p in (REPO / "guest_runtime" / "native").glob("*.[ch]")}
    assert sources - named == set(), f"docs/native-driver.md's layers miss {sorted(sources - named)}"
