"""The two Kubernetes images build here and hold what they promise (issue 31).

deploy/kubernetes/build-images.sh builds them with buildah, offline from any registry (its base, debian:12-slim,
made with debootstrap when no registry answers). Then, inside each image (a buildah working container, run with
chroot isolation and no network, removed afterwards):

* the host image (orion-vgpu): oriond, orion-controller, orion-k8s-plugin and etcd answer --version; no C compiler;
  oriond's compiled hot path and relay pump load from ORION_CACHE_DIR=/opt/orion/native as they are, with no
  compiler to build them again (a missing or stale module fails: NativeModule.build has nothing to compile with);
* the client image (orion-client): orion-guest and orion-check answer --version, guest_runtime and cuda.bindings
  import, and the native guest driver libcuda.so.1 built on install is where the start-up hook loads it from;
* neither keeps the build host's CA bundle that the builds' pip trusted (mounted on /mnt for the RUN steps only).

Needs root and buildah (setup.sh installs it). Without them the tests skip with the reason; under CI (env CI set)
they fail, because setup.sh must provide them. A cold build (debootstrap of the base, both images) takes about
2 minutes on a 2-core machine, a later one about 1.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from ivshmem.shared.version import VERSION, version_line
from tests.processes import REPO

pytestmark = pytest.mark.functional

SCRIPT = REPO / "deploy" / "kubernetes" / "build-images.sh"
HOST_IMAGE = f"localhost/orion-vgpu:{VERSION}"
CLIENT_IMAGE = f"localhost/orion-client:{VERSION}"
CACHE = "/opt/orion/native"
BUILD_TIMEOUT_S = 1500
RUN_TIMEOUT_S = 120

# In the host image: each compiled module is the one in the cache (build() compiles only when it is missing, and
# there is no compiler to do it with), it loads, and the cache is left as it was.
LOADS_WITHOUT_A_COMPILER = f"""
import os, shutil
from pathlib import Path
from host_agent.native_build import cache_dir
from host_agent.relay import compiled_pump
from host_agent.session import hot_path
assert shutil.which('cc') is None and shutil.which('gcc') is None, 'a C compiler in the image'
assert cache_dir() == Path({CACHE!r}), f'ORION_CACHE_DIR is {{cache_dir()}}'
before = sorted(os.listdir(cache_dir()))
for program in (hot_path.PROGRAM, compiled_pump.PROGRAM):
    path = program.build()
    module = program.load()
    assert module is not None and Path(module.__file__) == path, f'{{program.what}} did not load from {{path}}'
    print(program.what, path)
assert sorted(os.listdir(cache_dir())) == before, 'the cache changed'
"""

GUEST_DRIVER_LOADS = """
import ctypes, os
from guest_runtime import startup
assert os.path.isfile(startup.NATIVE_LIBRARY), startup.NATIVE_LIBRARY
ctypes.CDLL(startup.NATIVE_LIBRARY).cuInit
print(startup.NATIVE_LIBRARY)
"""


def _unavailable(reason: str) -> None:
    """Skip with the reason, or fail under CI, where setup.sh must have provided it."""
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI must provide it: run ./setup.sh)")
    pytest.skip(reason)


def _buildah(*args: str, env: dict[str, str], timeout: float = RUN_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["buildah", *args], env=env, capture_output=True, text=True, errors="replace",
                          timeout=timeout)


def _containers(env: dict[str, str]) -> set[str]:
    listed = _buildah("containers", "--all", "--noheading", "--format", "{{.ContainerName}}", env=env)
    assert listed.returncode == 0, listed.stderr
    return set(listed.stdout.split())


@pytest.fixture(scope="module")
def buildah_env() -> Iterator[dict[str, str]]:
    """Both images built by build-images.sh; the environment its buildah used (storage driver, isolation)."""
    if shutil.which("buildah") is None:
        _unavailable("buildah is not installed (apt-get install buildah; setup.sh installs it)")
    if os.geteuid() != 0:
        _unavailable("building the images needs root: sudo make test")
    env = dict(os.environ, BUILDAH_ISOLATION="chroot")
    before = _containers(env)
    # Its own process group: on a timeout the whole build (buildah, debootstrap) is stopped, not only bash.
    proc = subprocess.Popen(["bash", str(SCRIPT)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            errors="replace", start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=BUILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"build-images.sh did not finish within {BUILD_TIMEOUT_S} s:\n{out[-4000:]}")
    assert proc.returncode == 0, f"build-images.sh failed (exit {proc.returncode}):\n{out[-6000:]}"
    driver = re.search(r"storage driver: (\w+)", out)
    assert driver, out
    env["STORAGE_DRIVER"] = driver.group(1)
    assert _containers(env) == before, "the build left working containers behind"
    yield env


class ImageShell:
    """A working container of one image; commands run in it with chroot isolation, in a network namespace of their
    own (no network)."""

    def __init__(self, image: str, env: dict[str, str]) -> None:
        self.env = env
        self.name = f"orion-test-{uuid.uuid4().hex[:12]}"
        made = _buildah("from", "--pull=never", "--name", self.name, image, env=env)
        assert made.returncode == 0, f"buildah from {image}: {made.stderr}"

    def run(self, *argv: str, extra_env: tuple[str, ...] = ()) -> str:
        """The command's stdout; fails the test with its output when it exits non-zero."""
        flags = [f"--env={e}" for e in extra_env]
        # chroot isolation keeps the caller's network namespace, so the caller gets one of its own: loopback only.
        done = subprocess.run(["unshare", "--net", "buildah", "run", "--isolation", "chroot", *flags, self.name, "--",
                               *argv], env=self.env, capture_output=True, text=True, errors="replace",
                              timeout=RUN_TIMEOUT_S)
        assert done.returncode == 0, f"{' '.join(argv)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
        return done.stdout

    def remove(self) -> None:
        _buildah("rm", self.name, env=self.env)


@pytest.fixture(scope="module")
def host_image(buildah_env: dict[str, str]) -> Iterator[ImageShell]:
    shell = ImageShell(HOST_IMAGE, buildah_env)
    yield shell
    shell.remove()
    assert shell.name not in _containers(buildah_env)


@pytest.fixture(scope="module")
def client_image(buildah_env: dict[str, str]) -> Iterator[ImageShell]:
    shell = ImageShell(CLIENT_IMAGE, buildah_env)
    yield shell
    shell.remove()
    assert shell.name not in _containers(buildah_env)


@pytest.mark.parametrize("command", ["oriond", "orion-controller", "orion-k8s-plugin"])
def test_the_host_image_s_commands_answer(host_image: ImageShell, command: str) -> None:
    assert host_image.run(command, "--version").strip() == version_line(command)


def test_the_host_image_carries_etcd(host_image: ImageShell) -> None:
    assert "etcd Version: 3." in host_image.run("etcd", "--version")


def test_the_host_image_has_no_compiler(host_image: ImageShell) -> None:
    compilers = r"^(cc|c89|c99|gcc|[a-z0-9_-]+-gcc)(-[0-9.]+)?$"
    found = host_image.run("sh", "-c", f"ls /usr/bin /usr/local/bin | grep -E '{compilers}' || true")
    assert found.split() == []
    packages = host_image.run("dpkg-query", "-W", "-f", "${Package}\\n").split()
    assert [p for p in packages if re.fullmatch(r"(gcc|cpp|clang)(-[0-9.]+)?", p)] == []


def test_oriond_loads_its_compiled_modules_without_a_compiler(host_image: ImageShell) -> None:
    out = host_image.run("python", "-c", LOADS_WITHOUT_A_COMPILER, extra_env=("CC=/nonexistent/cc",))
    assert f"compiled hot path {CACHE}/_orion_hot_dispatch-" in out, out
    assert f"compiled relay pump {CACHE}/_orion_relay_pump-" in out, out


@pytest.mark.parametrize("command", ["orion-guest", "orion-check"])
def test_the_client_image_s_commands_answer(client_image: ImageShell, command: str) -> None:
    assert client_image.run(command, "--version").strip() == version_line(command)


def test_the_client_image_has_the_runtime_and_its_native_driver(client_image: ImageShell) -> None:
    client_image.run("python", "-c", "import guest_runtime, cuda.bindings.driver")
    path = client_image.run("python", "-c", GUEST_DRIVER_LOADS).strip()
    assert Path(path).name == "libcuda.so.1" and path.startswith("/opt/app/"), path


@pytest.mark.parametrize("image", ["host", "client"])
def test_no_build_host_ca_stays_in_the_image(request: pytest.FixtureRequest, image: str) -> None:
    shell: ImageShell = request.getfixturevalue(f"{image}_image")
    assert shell.run("ls", "-A", "/mnt").split() == []
