"""The `orion-guest` distribution carries the guest runtime and the wire, and nothing of the host side.

`pip install ./guest_runtime` must not pull libvirt-python, lxml, an etcd client or pyverbs, and its code
must import where none of those (nor CUDA, nor the host agent) exist.
"""
from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FORBIDDEN = ["libvirt", "lxml", "etcd3", "pyetcd", "etcd3gw", "pyverbs", "cuda", "host_agent", "controller"]


@pytest.fixture(scope="module")
def guest_wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out),
                    str(REPO / "guest_runtime")], check=True, capture_output=True)
    (wheel,) = out.glob("orion_guest-*.whl")
    return zipfile.ZipFile(wheel)


def test_guest_wheel_holds_exactly_the_guest_runtime_and_the_wire(guest_wheel: zipfile.ZipFile) -> None:
    names = {n for n in guest_wheel.namelist() if ".dist-info/" not in n}
    expected = {f"{pkg}/{p.name}" for pkg in ("guest_runtime", "ivshmem") for p in (REPO / pkg).glob("*.py")}
    expected.add("orion_guest.pth")  # the start-up hook that activates forwarding under Orion's environment
    assert names == expected, f"missing: {sorted(expected - names)}, unexpected: {sorted(names - expected)}"


def test_guest_wheel_depends_on_posix_ipc_only(guest_wheel: zipfile.ZipFile) -> None:
    (metadata,) = [n for n in guest_wheel.namelist() if n.endswith(".dist-info/METADATA")]
    requires = [line.split(":", 1)[1].strip() for line in guest_wheel.read(metadata).decode().splitlines()
                if line.startswith("Requires-Dist:")]
    assert [r.replace("_", "-").lower() for r in requires if "extra ==" not in r] == ["posix-ipc>=1.1"]
    assert not any(name in r.lower() for r in requires for name in ("libvirt", "lxml", "etcd", "pyverbs", "cuda"))


def test_guest_code_imports_without_any_host_side_module() -> None:
    modules = [f"{pkg}.{p.stem}" for pkg in ("ivshmem", "guest_runtime") for p in (REPO / pkg).glob("*.py")
               if p.stem != "__init__"]
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


def test_guest_code_needs_no_posix_ipc_to_open_a_pci_region() -> None:
    """Inside a QEMU guest there is no pip: the BAR path must work with the standard library alone."""
    script = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "posix_ipc":
            raise ImportError("blocked")
sys.meta_path.insert(0, Block())
from guest_runtime.cli import main
from ivshmem.region import Region
assert "posix_ipc" not in sys.modules
print("ok")
"""
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr
