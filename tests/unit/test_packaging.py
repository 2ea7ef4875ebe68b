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
    "torch": "torch", "cupy": "cupy-cuda13x", "jax": "jax", "google": "protobuf", "grpc_tools": "grpcio-tools",
    "hatchling": "hatchling", "yaml": "pyyaml", "cupyx": "cupy-cuda13x", "transformers": "transformers",
    "torchvision": "torchvision", "triton": "triton",
}
# Declared though no module of ours imports them, each with the reason (checked below where it can be).
NEEDED_BY_OTHERS: dict[str, str] = {}
# Imported, but installed by the system's package manager, never by pip: each with the reason.
SYSTEM_PACKAGES = {"pyverbs": "rdma-core's python3-pyverbs (apt): PyPI's pyverbs builds and then fails to import "
                              "against Debian's libibverbs (TESTBED.md); setup.sh links Debian's into the venv, and "
                              "without it relay connections use TCP (host_agent/relay/rdma_stream.py imports "
                              "it lazily)"}
# Run by the build backend at `pip install`, not shipped: their imports are the build system's requirements.
BUILD_HOOKS = {"guest_runtime/hatch_build.py": "guest_runtime/pyproject.toml", "hatch_build.py": "pyproject.toml"}
# Imported by the tests only where the test tool or the device machine brings them: never a dependency.
TEST_TOOLING = {"numba-cuda": "tests/gpu/programs/numba_program.py runs on the device machine, which has numba-cuda",
                **{name: "tests/gpu/programs/ (PyTorch, CuPy, JAX programs) run on the device machine, which has it"
                   for name in ("torch", "cupy-cuda13x", "jax", "transformers", "torchvision", "triton")}}


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


def _floor(requirement: str) -> tuple[int, ...]:
    """The ``>=`` version of `requirement` among [project] dependencies, as numbers."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    (line,) = [r for r in project["dependencies"] if _name(r) == requirement]
    match = re.search(r">=\s*([0-9.]+)", line)
    assert match, line
    return tuple(int(n) for n in match.group(1).split("."))


def test_the_protobuf_and_grpcio_floors_admit_every_generated_module() -> None:
    """Generated modules refuse, at import, a runtime older than what generated them: etcd-sdk-python's (which does
    not declare protobuf itself) and ours, which hatch_build.py compiles with the pinned grpcio-tools."""
    made_with = {}
    for module in ("pyetcd.etcdrpc.kv_pb2", "host_agent.k8s.deviceplugin_pb2"):
        spec = importlib.util.find_spec(module)
        assert spec is not None and spec.origin is not None, f"{module} is missing: pip install -e . generates ours"
        found = re.search(r"^# Protobuf Python Version: (\S+)$", Path(spec.origin).read_text(), re.M)
        assert found is not None, module
        made_with[module] = tuple(int(n) for n in found.group(1).split("."))
        assert made_with[module] <= _floor("protobuf"), (module, made_with[module])
    spec = importlib.util.find_spec("host_agent.k8s.deviceplugin_pb2_grpc")
    assert spec is not None and spec.origin is not None
    found = re.search(r"^GRPC_GENERATED_VERSION = '(\S+)'$", Path(spec.origin).read_text(), re.M)
    assert found is not None
    assert tuple(int(n) for n in found.group(1).split(".")) <= _floor("grpcio")
    build = tomllib.loads((REPO / "pyproject.toml").read_text())["build-system"]["requires"]
    assert f"grpcio-tools=={found.group(1)}" in build  # the pin is what made them


def test_the_guest_distribution_declares_exactly_what_its_code_imports() -> None:
    """Nothing but the standard library is required; what forwarding hooks (cuda-bindings) is the `cuda` extra."""
    dependencies, extras = _declared(REPO / "guest_runtime" / "pyproject.toml")
    assert dependencies == set(), f"the guest wheel requires {sorted(dependencies)}: it needs the stdlib only"
    declared = set().union(*extras.values())
    wrong = _difference(_imported(GUEST), declared, set())
    assert not wrong, "guest_runtime/pyproject.toml [project.optional-dependencies]:\n" + "\n".join(wrong)


def test_the_build_hooks_need_only_their_build_systems_requirements() -> None:
    for hook, pyproject in BUILD_HOOKS.items():
        requires = {_name(r) for r in tomllib.loads((REPO / pyproject).read_text())["build-system"]["requires"]}
        tree = ast.parse((REPO / hook).read_text())
        third_party = {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                       and not n.level} - set(sys.stdlib_module_names) - set(PROJECT) - {"__future__"}
        needed = {DISTRIBUTION.get(name, name) for name in third_party}
        assert needed <= requires, f"{hook} imports {sorted(needed - requires)}"


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
    expected = {f"{pkg}/{p.name}" for pkg in ("guest_runtime", "ivshmem", "ivshmem/shared")
                for p in (REPO / pkg).glob("*.py") if f"{pkg}/{p.name}" not in BUILD_HOOKS}
    expected.add("orion_guest.pth")  # the start-up hook that activates forwarding under Orion's environment
    expected.add("ivshmem/cuda_h.txt")  # the driver API's inventory the call table is built from (cuda_header.py)
    if find_compiler() is not None:  # the native driver, compiled by the build hook (docs/native-driver.md)
        expected |= {"guest_runtime/native/lib/libcuda.so.1", "guest_runtime/native/lib/libcuda.so",
                     "guest_runtime/native/lib/libnvidia-ml.so.1"}
    assert names == expected, f"missing: {sorted(expected - names)}, unexpected: {sorted(names - expected)}"


def test_the_guest_wheel_is_one_platform_wheel_for_any_python_3(guest_wheel: zipfile.ZipFile) -> None:
    """The library is plain C against the C library: one wheel serves every Python 3 of that platform."""
    if find_compiler() is None:
        pytest.skip("no C compiler here: the wheel is pure Python")
    name = Path(str(guest_wheel.filename)).name
    assert re.fullmatch(r"orion_guest-[^-]+-py3-none-linux_\w+\.whl", name), name


def test_the_guest_wheel_installs_offline_with_no_compiler_and_its_driver_loads(
        guest_wheel: zipfile.ZipFile, tmp_path: Path) -> None:
    """`make wheels` once, then `pip install --no-index` where no compiler is: the native driver is in it."""
    if find_compiler() is None:
        pytest.skip("no C compiler here to build the wheel with the driver")
    target = tmp_path / "site"
    no_compiler = {"PATH": str(Path(sys.executable).parent), "CC": "/nonexistent/cc", "HOME": str(tmp_path)}
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--target", str(target),
                    str(guest_wheel.filename)], check=True, capture_output=True, env=no_compiler, timeout=300)
    library = target / "guest_runtime" / "native" / "lib" / "libcuda.so.1"
    loaded = subprocess.run([sys.executable, "-c", f"import ctypes; ctypes.CDLL({str(library)!r}).cuDriverGetVersion"],
                            capture_output=True, text=True, env=no_compiler, timeout=60)
    assert loaded.returncode == 0, loaded.stderr


def test_the_guest_runtime_installs_again_over_itself(tmp_path: Path) -> None:
    """A second `pip install ./guest_runtime` in an environment that has one: the installed start-up hook imports the
    installed guest_runtime at the build's start, which holds no build code (it failed: "No module named
    'guest_runtime.native.build'")."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    for attempt in ("install", "install again"):
        done = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps",
                               "--force-reinstall", str(REPO / "guest_runtime")],
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"{attempt}: {done.stdout[-2000:]}{done.stderr[-3000:]}"
    installed = next((venv / "lib").glob("python3*/site-packages/guest_runtime"))
    assert not (installed / "native" / "build.py").exists()  # the case that failed: no build code installed


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
