"""Packaging tells the truth: both distributions declare exactly what their code imports, and `orion-guest`
carries the guest runtime and the wire, and nothing of the host side.

`pip install ./guest_runtime` must not pull libvirt-python, lxml, an etcd client or pyverbs, and its code
must import where none of those (nor CUDA, nor the host agent) exist. The imports are read with `ast` (module
level and inside functions) and mapped to distributions by DISTRIBUTION; an import missing there fails, so a new
third-party import is declared on purpose.
"""
from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from guest_runtime.native.build import find_compiler

REPO = Path(__file__).resolve().parents[2]
FORBIDDEN = ["libvirt", "lxml", "etcd3", "pyetcd", "etcd3gw", "pyverbs", "cuda", "host_agent", "controller"]
PROJECT = ("ivshmem", "guest_runtime", "host_agent", "controller", "libvirt_hooks", "xml_templates", "tests", "bench")
SHIPPED = ("ivshmem", "guest_runtime", "host_agent", "controller", "libvirt_hooks", "xml_templates")
GUEST = ("ivshmem", "guest_runtime")
# import name (its first two parts for the `cuda` namespace) -> the distribution that provides it
DISTRIBUTION = {
    "aiohttp": "aiohttp", "cuda.bindings": "cuda-bindings", "cuda.core": "cuda-core", "grpc": "grpcio",
    "hypothesis": "hypothesis", "libvirt": "libvirt-python", "lxml": "lxml", "numba": "numba-cuda", "numpy": "numpy",
    "prometheus_client": "prometheus-client", "pyetcd": "etcd-sdk-python", "pytest": "pytest", "pyverbs": "pyverbs",
    "torch": "torch", "cupy": "cupy-cuda13x", "jax": "jax",
}
# Declared though no module of ours imports them, each with the reason (checked below where it can be).
NEEDED_BY_OTHERS = {"protobuf": "etcd-sdk-python's generated etcdrpc modules import google.protobuf, and "
                                "etcd-sdk-python does not declare it"}
# Imported, but installed by the system's package manager, never by pip: each with the reason.
SYSTEM_PACKAGES = {"pyverbs": "rdma-core's python3-pyverbs (apt): PyPI's pyverbs builds and then fails to import "
                              "against Debian's libibverbs (TESTBED.md); setup.sh links Debian's into the venv, and "
                              "without it relay connections use TCP (host_agent/rdma_stream.py imports it lazily)"}
# Run by the build backend at `pip install`, not shipped: their imports are the build system's requirements.
BUILD_HOOKS = {"guest_runtime/hatch_build.py"}
# Imported by the tests only where the test tool or the device machine brings them: never a dependency.
TEST_TOOLING = {"numba-cuda": "tests/gpu/programs/numba_program.py runs on the device machine, which has numba-cuda",
                **{name: "tests/gpu/programs/ (PyTorch, CuPy, JAX programs) run on the device machine, which has it"
                   for name in ("torch", "cupy-cuda13x", "jax")}}


def _name(requirement: str) -> str:
    """A requirement's distribution name, normalised (PEP 503)."""
    match = re.match(r"[A-Za-z0-9._-]+", requirement.strip())
    assert match, requirement
    return re.sub(r"[-_.]+", "-", match.group(0)).lower()


def _declared(pyproject: Path) -> tuple[set[str], dict[str, set[str]]]:
    """(dependencies, {extra: dependencies}) of a pyproject.toml, as normalised names."""
    project = tomllib.loads(pyproject.read_text())["project"]
    extras = project.get("optional-dependencies", {})
    return {_name(r) for r in project["dependencies"]}, {k: {_name(r) for r in v} for k, v in extras.items()}


def _imported(packages: tuple[str, ...]) -> dict[str, str]:
    """{distribution: 'file:line' of one import} of every third-party import in `packages`; an import that
    DISTRIBUTION does not know maps to '?name'."""
    found: dict[str, str] = {}
    for package in packages:
        for path in sorted((REPO / package).rglob("*.py")):
            if str(path.relative_to(REPO)) in BUILD_HOOKS:
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                    names = [node.module if node.module != "cuda" else f"cuda.{node.names[0].name}"]
                else:
                    continue
                for name in names:
                    top = name.split(".")[0]
                    if top in sys.stdlib_module_names or top in PROJECT or top == "__future__":
                        continue
                    key = ".".join(name.split(".")[:2]) if top == "cuda" else top
                    found.setdefault(DISTRIBUTION.get(key, f"?{key}"), f"{path.relative_to(REPO)}:{node.lineno}")
    return found


def _difference(imported: dict[str, str], declared: set[str], allowed_unimported: set[str]) -> list[str]:
    lines = [f"{where} imports {dist[1:]}, which DISTRIBUTION does not map to a distribution" for dist, where in
             imported.items() if dist.startswith("?")]
    lines += [f"{where} imports from {dist}, which is not declared" for dist, where in imported.items()
              if not dist.startswith("?") and dist not in declared]
    lines += [f"{dist} is declared but nothing imports it" for dist in sorted(declared - set(imported))
              if dist not in allowed_unimported]
    return lines


def test_the_host_distribution_declares_exactly_what_its_packages_import() -> None:
    dependencies, _extras = _declared(REPO / "pyproject.toml")
    imported = {dist: where for dist, where in _imported(SHIPPED).items() if dist not in SYSTEM_PACKAGES}
    wrong = _difference(imported, dependencies, set(NEEDED_BY_OTHERS))
    assert not wrong, "pyproject.toml [project] dependencies:\n" + "\n".join(wrong)


def test_protobuf_is_declared_only_because_the_etcd_client_forgets_it() -> None:
    """When etcd-sdk-python declares protobuf itself, our line goes; until then our floor is the protoc version its
    generated modules were made with (they refuse an older runtime at import)."""
    requires = importlib.metadata.requires("etcd-sdk-python") or []
    assert not any(_name(r) == "protobuf" for r in requires), "etcd-sdk-python now declares protobuf: drop ours"
    spec = importlib.util.find_spec("pyetcd.etcdrpc.kv_pb2")
    assert spec is not None and spec.origin is not None
    generated = Path(spec.origin).read_text()
    assert "from google.protobuf import" in generated
    made_with = re.search(r"^# Protobuf Python Version: (\S+)$", generated, re.M)
    assert made_with is not None
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert f"protobuf>={made_with.group(1)}" in project["dependencies"]


def test_the_guest_distribution_declares_exactly_what_its_code_imports() -> None:
    """Nothing but the standard library is required; what forwarding hooks (cuda-bindings) is the `cuda` extra."""
    dependencies, extras = _declared(REPO / "guest_runtime" / "pyproject.toml")
    assert dependencies == set(), f"the guest wheel requires {sorted(dependencies)}: it needs the stdlib only"
    declared = set().union(*extras.values())
    wrong = _difference(_imported(GUEST), declared, set())
    assert not wrong, "guest_runtime/pyproject.toml [project.optional-dependencies]:\n" + "\n".join(wrong)


def test_the_guest_build_hook_needs_only_the_build_systems_requirements() -> None:
    requires = {_name(r) for r in tomllib.loads((REPO / "guest_runtime" / "pyproject.toml").read_text())
                ["build-system"]["requires"]}
    for hook in BUILD_HOOKS:
        tree = ast.parse((REPO / hook).read_text())
        third_party = {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                       and not n.level} - set(sys.stdlib_module_names) - set(PROJECT) - {"__future__"}
        assert third_party <= requires, f"{hook} imports {sorted(third_party - requires)}"


def test_both_distributions_ask_for_the_same_cuda_bindings() -> None:
    def spec(pyproject: Path, extra: str | None) -> set[str]:
        project = tomllib.loads(pyproject.read_text())["project"]
        lines = project["optional-dependencies"][extra] if extra else project["dependencies"]
        return {r.replace(" ", "") for r in lines if _name(r) == "cuda-bindings"}
    host, guest = spec(REPO / "pyproject.toml", None), spec(REPO / "guest_runtime" / "pyproject.toml", "cuda")
    assert host == guest == {"cuda-bindings>=13,<14"}, (host, guest)


def test_tests_and_benchmarks_import_only_declared_distributions() -> None:
    dependencies, extras = _declared(REPO / "pyproject.toml")
    declared = dependencies | extras["test"] | set(TEST_TOOLING) | set(SYSTEM_PACKAGES)
    wrong = _difference(_imported(("tests", "bench")), declared, declared)
    assert not wrong, "pyproject.toml [project.optional-dependencies] test:\n" + "\n".join(wrong)


@pytest.fixture(scope="module")
def guest_wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out),
                    str(REPO / "guest_runtime")], check=True, capture_output=True)
    (wheel,) = out.glob("orion_guest-*.whl")
    return zipfile.ZipFile(wheel)


def test_guest_wheel_holds_exactly_the_guest_runtime_and_the_wire(guest_wheel: zipfile.ZipFile) -> None:
    names = {n for n in guest_wheel.namelist() if ".dist-info/" not in n}
    expected = {f"{pkg}/{p.name}" for pkg in ("guest_runtime", "ivshmem") for p in (REPO / pkg).glob("*.py")
                if f"{pkg}/{p.name}" not in BUILD_HOOKS}
    expected.add("orion_guest.pth")  # the start-up hook that activates forwarding under Orion's environment
    if find_compiler() is not None:  # the native driver, compiled by the build hook (docs/native-driver.md)
        expected |= {"guest_runtime/native/lib/libcuda.so.1", "guest_runtime/native/lib/libcuda.so",
                     "guest_runtime/native/lib/libnvidia-ml.so.1"}
    assert names == expected, f"missing: {sorted(expected - names)}, unexpected: {sorted(names - expected)}"


def test_guest_wheel_requires_nothing_but_offers_cuda_bindings(guest_wheel: zipfile.ZipFile) -> None:
    (metadata,) = [n for n in guest_wheel.namelist() if n.endswith(".dist-info/METADATA")]
    requires = [line.split(":", 1)[1].strip() for line in guest_wheel.read(metadata).decode().splitlines()
                if line.startswith("Requires-Dist:")]
    assert [r for r in requires if "extra ==" not in r] == []
    assert [r.replace(" ", "").replace("'", '"') for r in requires] == ['cuda-bindings<14,>=13;extra=="cuda"']
    assert not any(name in r.lower() for r in requires for name in ("libvirt", "lxml", "etcd", "pyverbs"))


def test_guest_code_imports_without_any_host_side_module() -> None:
    modules = [f"{pkg}.{p.stem}" for pkg in ("ivshmem", "guest_runtime") for p in (REPO / pkg).glob("*.py")
               if p.stem != "__init__" and f"{pkg}/{p.name}" not in BUILD_HOOKS]
    script = f"""
import importlib, importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {FORBIDDEN!r}:
            raise ImportError("blocked: " + name)
sys.meta_path.insert(0, Block())
for module in {modules!r}:
    importlib.import_module(module)
print("imported", len({modules!r}))
"""
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert f"imported {len(modules)}" in result.stdout


def test_guest_code_needs_only_the_standard_library_to_open_a_region() -> None:
    """Inside a QEMU guest there is no pip: the BAR path (and a /dev/shm file) must work with the stdlib alone."""
    script = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        top = name.split(".")[0]
        if top not in sys.stdlib_module_names and top not in ("ivshmem", "guest_runtime"):
            raise ImportError("blocked: " + name)
sys.meta_path.insert(0, Block())
from guest_runtime.cli import main
from ivshmem.region import Region
print("ok")
"""
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr
