"""Every command line of README.md, run as a user types it after `sudo ./setup.sh` (smoke level).

The README's command lines are read from README.md itself: each line of its ```sh blocks and the first cell
of each row of its command table. Every one must have a smoke run in SMOKES below, keyed by its exact text, so
a new or changed README line without a run fails `test_every_readme_command_line_has_a_smoke_run` (a unit
test: no services). Each run types the line as written, with its placeholders filled in (a temporary DIR,
a free region index, a private etcd and controller on free ports), through bash, from the checkout, with the
PATH a fresh root login has (/usr/local/bin and the system directories; no venv): so `orion-shm` is the link
setup.sh put on PATH and `.venv/bin/python` the set-up's interpreter, whose orion_guest.pth turns forwarding on.
A run checks that the command starts, does its job or prints its help, and exits as the README says, with no
traceback; it measures nothing.

Services: the wire rows use region servers and oriond processes started here on regions of a temporary
directory; the controller rows an etcd and an `orion-controller start` of their own (tests/controller/rig.py);
the libvirt row the running libvirtd (qemu:///system) and a throw-away domain, never started. Without the
set-up (commands on PATH for this checkout's .venv), etcd or libvirtd the runs skip with the reason; under CI
(env CI set) that is a failure, because setup.sh must provide them. Every wait is bounded.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.controller.rig import EtcdServer, etcd_binary, free_port
from tests.processes import stop_process

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
VENV = REPO / ".venv"
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # Debian's root PATH (and sudo's)
LINE_TIMEOUT_S = 300.0  # a bound on one command line (make bench's short run included); never a measured time
READY_TIMEOUT_S = 60.0  # a bound on a daemon becoming ready (oriond reads its GPU inventory first)
SHM_DIR = Path("/dev/shm")
APP = """\
# an unmodified CUDA Python program: nothing of Orion in it
from cuda.bindings import driver
(result,) = driver.cuInit(0)
print("cuInit:", result.name)
"""
EXIT_LINE = re.compile(r"\[INFO\] Client exits with(out)? allocation ID")


def readme_command_lines(text: str) -> list[str]:
    """The README's command lines: each line of its ```sh blocks (without comments), then the first cell of each
    row of its command table (markdown: backticks dropped, `\\|` is a literal |)."""
    lines = []
    for block in re.findall(r"^```sh\n(.*?)^```", text, re.M | re.S):
        lines += [line.split(" #", 1)[0].strip() for line in block.splitlines() if line.split(" #", 1)[0].strip()]
    table = text.split("\n## Commands\n", 1)[1].split("\n## ", 1)[0]
    for row in table.splitlines():
        if row.startswith("| `"):
            cell = re.split(r"(?<!\\)\|", row)[1]
            lines.append(cell.strip().replace("\\|", "|").replace("`", ""))
    return lines


def project_scripts() -> dict[str, str]:
    with open(REPO / "pyproject.toml", "rb") as f:
        return dict(tomllib.load(f)["project"]["scripts"])


def _unavailable(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI must provide it: run ./setup.sh)")
    pytest.skip(reason)


def _stop_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG: no orphan if pytest dies


class Rig:
    """Runs README lines as a user would, and the daemons some of them need; stops every daemon at the end."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.daemons: list[tuple[str, subprocess.Popen[bytes], Path]] = []
        self.etcd: EtcdServer | None = None
        self.regions: list[Path] = []  # in /dev/shm, removed by stop()

    def env(self) -> dict[str, str]:
        """A login's environment: the system PATH, no ORION_* (each line sets its own), a HOME of its own (so no
        ~/.orion/client.conf of the machine's user is read)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("ORION_", "VIRTUAL_ENV"))}
        env.update(PATH=SYSTEM_PATH, HOME=str(self.tmp))
        return env

    def run(self, line: str, *expect: str, codes: tuple[int, ...] = (0,)) -> str:
        """Run one command line through bash from the checkout; check its exit code, its words, no traceback."""
        result = subprocess.run(["bash", "-c", line], cwd=REPO, env=self.env(), capture_output=True, text=True,
                                timeout=LINE_TIMEOUT_S, stdin=subprocess.DEVNULL)
        out = result.stdout + result.stderr
        print(f"$ {line}\n{out}")
        assert result.returncode in codes, f"{line}: exit {result.returncode}, expected {codes}\n{out}"
        assert "Traceback" not in out, f"{line}:\n{out}"
        for words in expect:
            assert words in out, f"{line}: no {words!r} in\n{out}"
        return out

    def until(self, line: str, what: str) -> str:
        """Run `line` until it succeeds (bounded): how a user waits for a daemon they just started."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            result = subprocess.run(["bash", "-c", line], cwd=REPO, env=self.env(), capture_output=True, text=True,
                                    timeout=LINE_TIMEOUT_S, stdin=subprocess.DEVNULL)
            if result.returncode == 0:
                return result.stdout + result.stderr
            assert time.monotonic() < deadline, (f"{what}: '{line}' still fails after {READY_TIMEOUT_S} s:\n"
                                                 f"{result.stdout}{result.stderr}\n{self.logs()}")
            time.sleep(0.2)

    def start(self, line: str) -> Path:
        """Start a daemon's command line (bash execs it, so signals reach it); returns its log file."""
        log = self.tmp / f"daemon{len(self.daemons)}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(["bash", "-c", f"exec env {line}"], cwd=REPO, env=self.env(), stdout=out,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                                    preexec_fn=_stop_with_parent)
        self.daemons.append((line, proc, log))
        return log

    def logs(self) -> str:
        return "\n".join(f"--- {line}\n{log.read_text(errors='replace')[-3000:]}" for line, _, log in self.daemons)

    def stop(self) -> None:
        """Ctrl-C each daemon, as a user in its terminal: each must exit 0 (a clean stop), without a traceback."""
        failures = []
        for line, proc, log in reversed(self.daemons):
            code = stop_process(proc, 20)
            text = log.read_text(errors="replace")
            if code != 0 or "Traceback" in text:
                failures.append(f"{line}: exit {code}\n{text[-3000:]}")
        self.daemons.clear()
        if self.etcd is not None:
            self.etcd.stop()
        for region in self.regions:
            region.unlink(missing_ok=True)
        assert not failures, "\n".join(failures)

    def etcd_url(self) -> str:
        if self.etcd is None:
            binary = etcd_binary()
            if binary is None:
                _unavailable("etcd is not installed (apt-get install etcd-server)")
            assert binary is not None
            self.etcd = EtcdServer(binary, self.tmp / "etcd-data")
            self.etcd.start()
        return self.etcd.url

    def controller(self, config_file: bool = False) -> str:
        """`orion-controller start` on a free port and a key root of its own (`config_file`: its address and etcd
        given in an Orion controller.yaml, `--config-file`); returns HOST:PORT once it answers."""
        port = free_port()
        address = f"127.0.0.1:{port}"
        where = f"--listen {address} --etcd {self.etcd_url()}"
        if config_file:
            yaml_file = self.tmp / "controller.yaml"
            yaml_file.write_text(f"controller:\n  listen_ip: 127.0.0.1\n  listen_port: {port}\n"
                                 f"database:\n  advertise-client-urls: {self.etcd_url()}\n")
            where = f"--config-file {yaml_file}"
        self.start(f"orion-controller start {where} --key-file {self.key()} "
                   f"--key-root /orion-readme-{uuid.uuid4().hex[:8]}/ --log {self.tmp}/controller.log")
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            with contextlib.suppress(OSError), \
                    urllib.request.urlopen(f"http://{address}/api/v1/health", timeout=2) as response:
                if response.status == 200:
                    return address
            assert time.monotonic() < deadline, f"the controller did not answer within {READY_TIMEOUT_S} s\n" \
                                                f"{self.logs()}"
            time.sleep(0.1)

    def key(self) -> Path:
        """The cluster key of this rig's controller and oriond (setup.sh makes /etc/orion/cluster.key, the default;
        the rig keeps one of its own)."""
        path = self.tmp / "cluster.key"
        if not path.exists():
            self.run(f"orion-controller cluster-key {path}")
        return path

    def host(self, controller: str | None = None) -> tuple[Path, Path]:
        """A server.conf whose shm_path_base is a directory of our own, with one region in it, served by `oriond`
        as the README writes it; returns (region, oriond's log). With a `controller`, oriond registers there a
        made-up GPU (ORION_TEST_GPU_INVENTORY, host_agent/session/gpu_inventory.py), so that a machine without a GPU
        has a pool to allocate from."""
        shm = self.tmp / "shm"
        shm.mkdir(exist_ok=True)
        conf = self.tmp / "server.conf"
        text = f'[server-shm]\n    shm_path_base = "{shm}/"\n'
        if controller:
            text += f"[controller]\n    controller_addr = {controller}\n[cluster]\n    key_file = {self.key()}\n"
        conf.write_text(text)
        self.run(f"orion-shm create -i 5 -s 32 -d {shm}", "successfully created")
        region = shm / "orionsock5"
        inventory = ""
        if controller:
            (self.tmp / "gpus.json").write_text(f'[{{"uuid": "GPU-{uuid.uuid4()}", "name": "made-up", '
                                                '"memory_mib": 16384}]')
            inventory = f"ORION_TEST_GPU_INVENTORY={self.tmp}/gpus.json "
        log = self.start(f"{inventory}oriond --config {conf} --gmem 1024 --pid-file {self.tmp}/oriond.pid")
        self.until(f"orion-guest probe --region {region} --round-trips 10 --bulk-mib 1", "oriond serves the region")
        return region, log

    def free_index(self) -> int:
        """A region index whose /dev/shm/orionsock<N> does not exist; that file is removed by stop()."""
        rng = random.Random()
        chosen = next((i for i in (rng.randrange(100, 9999) for _ in range(100))
                       if not (SHM_DIR / f"orionsock{i}").exists()), None)
        if chosen is None:
            pytest.skip("no free region index in 100..9999")
        assert chosen is not None
        self.regions.append(SHM_DIR / f"orionsock{chosen}")
        return chosen

    def app(self) -> Path:
        app = self.tmp / "app.py"
        app.write_text(APP)
        return app


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    rig = Rig(tmp_path)
    try:
        yield rig
    finally:
        rig.stop()


def _set_up() -> list[str]:
    """What `sudo ./setup.sh` leaves, for this checkout: its .venv runs these tests, and each command of
    [project.scripts] is on the system PATH as a link to that venv's script. Returns what is missing."""
    missing = []
    if Path(sys.prefix).resolve() != VENV.resolve():
        missing.append(f"these tests run in {sys.prefix}, not the set-up's {VENV}")
    for name in project_scripts():
        found = shutil.which(name, path=SYSTEM_PATH)
        if found is None or Path(found).resolve() != (VENV / "bin" / name).resolve():
            missing.append(f"{name} on PATH is {found or 'missing'}, not {VENV / 'bin' / name}")
    return missing


@pytest.fixture(scope="module")
def set_up() -> None:
    missing = _set_up()
    if missing:
        _unavailable(f"the set-up is not done for this checkout: {'; '.join(missing)}; run sudo ./setup.sh")


# --- one smoke run per README line ---------------------------------------------------------------------------
SMOKES: dict[str, Callable[[Rig], None]] = {}


def smoke(readme_line: str) -> Callable[[Callable[[Rig], None]], Callable[[Rig], None]]:
    """Register `run` as the smoke run of the README line `readme_line` (its exact text)."""
    def register(run: Callable[[Rig], None]) -> Callable[[Rig], None]:
        SMOKES[readme_line] = run
        return run
    return register


@smoke("sudo ./setup.sh")
def _setup(rig: Rig) -> None:
    """What it left (the `set_up` fixture checked the commands on PATH), its usage, and bad input refused."""
    assert not _set_up()
    rig.run("./setup.sh --help", "sudo ./setup.sh --no-demo")
    rig.run("./setup.sh --demo-please", "unknown argument '--demo-please'", codes=(2,))
    rig.run("orion-hooks status", "runs qemu hooks")  # the hook is in place and libvirtd runs it
    rig.run(".venv/bin/python -c 'import sysconfig; print(open(sysconfig.get_paths()[\"purelib\"] + "
            "\"/orion_guest.pth\").read())'", "guest_runtime.startup")


@smoke("sudo make test")
def _make_test(rig: Rig) -> None:
    rig.run("make -n test", "ruff check", "mypy", "pytest")  # what it would run: the whole suite runs it for real


@smoke("orion-shm [-i N] [-s MiB] [-d DIR]")
def _orion_shm(rig: Rig) -> None:
    rig.run(f"orion-shm -i 3 -s 32 -d {rig.tmp}", f"{rig.tmp}/orionsock3 is successfully created.")
    assert (rig.tmp / "orionsock3").stat().st_size == 32 << 20
    rig.run(f"orion-shm -i 3 -s 32 -d {rig.tmp}", "already exists", codes=(1,))


@smoke("orion-shm create/list/inspect N/remove N")
def _orion_shm_commands(rig: Rig) -> None:
    rig.run(f"orion-shm create -i 4 -s 32 -d {rig.tmp}", "successfully created")
    rig.run(f"orion-shm list -d {rig.tmp}", "32 MiB")
    rig.run(f"orion-shm inspect 4 -d {rig.tmp}", "orionsock4")
    rig.run(f"orion-shm remove 4 -d {rig.tmp}")
    assert not (rig.tmp / "orionsock4").exists()


@smoke("orion-guest probe [--region PATH|PCI-ADDRESS]")
def _probe(rig: Rig) -> None:
    region, _log = rig.host()
    rig.run(f"orion-guest probe --region {region}", "ORION-PROBE round-trip", "ORION-PROBE ok")


@smoke("oriond [--config FILE] [--gmem MiB]")
def _oriond(rig: Rig) -> None:
    rig.host()  # started as written, serving its region (probed), stopped with Ctrl-C: exit 0
    rig.run("oriond --help", "--config", "--gmem")


@smoke("ORION_SHM=/dev/shm/orionsock0 .venv/bin/python app.py")
def _forwarded_app(rig: Rig) -> None:
    region, log = rig.host()
    sessions = log.read_text().count("Creating session")
    out = rig.run(f"ORION_SHM={region} .venv/bin/python {rig.app()}", "cuInit: CUDA_")
    assert "no GPU through Orion" not in out  # the host agent answered, not a missing region
    assert log.read_text().count("Creating session") > sessions, log.read_text()


@smoke("ORION_STATS=1 ORION_SHM=/dev/shm/orionsock0 .venv/bin/python app.py")
def _forwarded_app_with_stats(rig: Rig) -> None:
    region, _log = rig.host()
    out = rig.run(f"ORION_STATS=1 ORION_SHM={region} .venv/bin/python {rig.app()}", "cuInit: CUDA_", "orion-stats: pid")
    assert re.search(r"^cuInit +1 ", out, re.M), out  # the program's one cuInit, counted


@smoke("orion-shm attach DOMAIN [-i N] [-s MiB] [--live] [--config] / detach")
def _attach_detach(rig: Rig) -> None:
    if subprocess.run(["virsh", "-c", "qemu:///system", "version"], capture_output=True, timeout=60,
                      env=rig.env()).returncode:
        _unavailable("libvirtd does not answer on qemu:///system")
    name, first, index = f"orion-readme-{uuid.uuid4().hex[:8]}", rig.free_index(), rig.free_index()
    xml, kernel = rig.tmp / "domain.xml", rig.tmp / "vmlinuz"
    kernel.write_bytes(b"")  # never booted: the domain is only defined
    rig.run(f"orion-domain render --name {name} --kernel {kernel} --region {first}:32 --type qemu -o {xml}")
    rig.run(f"virsh -c qemu:///system define {xml}", name)
    try:
        rig.run(f"orion-shm attach {name} -i {index} -s 32 --config")
        rig.run(f"virsh -c qemu:///system dumpxml --inactive {name}", f"orionsock{index}")
        rig.run(f"orion-shm attach {name} -i {index} -s 32 --config")  # idempotent
        rig.run(f"orion-shm detach {name} -i {index} --config")
        assert f"orionsock{index}" not in rig.run(f"virsh -c qemu:///system dumpxml --inactive {name}")
    finally:
        subprocess.run(["virsh", "-c", "qemu:///system", "undefine", name], capture_output=True, timeout=60)


@smoke("orion-domain render --name N --kernel K --region 0:128 …")
def _render(rig: Rig) -> None:
    (rig.tmp / "vmlinuz").write_bytes(b"")  # render checks that the kernel is a file; nothing boots it
    rig.run(f"orion-domain render --name readme --kernel {rig.tmp}/vmlinuz --region 0:128 --region 1:64",
            "<domain", "orionsock0", "orionsock1", "ivshmem-plain")


@smoke("orion-hooks install [--root DIR] / uninstall / status")
def _hooks(rig: Rig) -> None:
    root = rig.tmp / "root"
    (root / "etc/libvirt").mkdir(parents=True)
    rig.run(f"orion-hooks install --root {root}", "installed")
    rig.run(f"orion-hooks status --root {root}", "(ok)", "libvirtd: not running")
    rig.run(f"orion-hooks uninstall --root {root}", "removed")
    rig.run(f"orion-hooks status --root {root}", "not installed", codes=(1,))
    rig.run("orion-hooks status", "runs qemu hooks")  # the real one, installed by setup.sh


@smoke("orion-controller start [--config-file controller.yaml] [--listen 0.0.0.0:9123] [--etcd URL]")
def _controller(rig: Rig) -> None:
    address = rig.controller()  # started as written, answering, stopped with Ctrl-C: exit 0
    rig.run(f"orion-smi --controller {address} --key-file {rig.key()}")
    from_file = rig.controller(config_file=True)  # its address and etcd from Orion's controller.yaml
    rig.run(f"orion-smi --controller {from_file} --key-file {rig.key()}")


@smoke("orion-smi [--controller HOST:PORT]")
def _orion_smi(rig: Rig) -> None:
    address = rig.controller()
    rig.run(f"orion-smi --controller {address} --key-file {rig.key()}")
    rig.run(f"ORION_CONTROLLER={address} orion-smi --key-file {rig.key()}")
    rig.run(f"orion-smi --controller 127.0.0.1:{free_port()}", codes=(1,))


@smoke("orion-k8s-plugin [-controller HOST:PORT]")
def _k8s_plugin(rig: Rig) -> None:
    """Beside this host's oriond, as on a node: the node's vGPUs Healthy, its socket served in kubelet's directory
    (no kubelet here: tests/controller/test_k8s_plugin.py plays it)."""
    rig.run("orion-k8s-plugin --help", "-controller", "-device-plugin-dir")
    address = rig.controller()
    rig.host(controller=address)  # oriond registers one made-up GPU as 127.0.0.1, server.conf's default bind_addr
    rig.run(f"chmod 0700 {rig.tmp}/shm")  # the regions' directory must be sealed (docs/kubernetes.md)
    kubelet_dir = Path(tempfile.mkdtemp(prefix="orion-kubelet-", dir="/tmp"))  # a socket path is at most 107 bytes
    try:
        log = rig.start(f"orion-k8s-plugin -controller {address} -config {rig.tmp}/server.conf "
                        f"-device-plugin-dir {kubelet_dir}")
        deadline = time.monotonic() + READY_TIMEOUT_S
        while "4 vGPU(s) of this node are Healthy" not in log.read_text():
            assert time.monotonic() < deadline, rig.logs()
            time.sleep(0.1)
        assert (kubelet_dir / "orion-vgpu.sock").is_socket(), rig.logs()
    finally:
        shutil.rmtree(kubelet_dir, ignore_errors=True)


@smoke("orion-check install [server|client|controller|all] / orion-check runtime server|client")
def _orion_check(rig: Rig) -> None:
    rig.run("orion-check install", "Installation summaries", "Orion client runtime")
    # the server check diagnoses whichever oriond runs here; without a GPU it reports an error and exits 1
    rig.run("orion-check runtime server", "Checking Orion Server status", codes=(0, 1))
    address = rig.controller()
    rig.run(f"ORION_CONTROLLER={address} orion-check runtime client", address)


@smoke("ORION_CONTROLLER=HOST:9123 ORION_VGPU=1 ORION_GMEM=4096 .venv/bin/python app.py")
def _allocating_app(rig: Rig) -> None:
    address = rig.controller()
    region, _log = rig.host(controller=address)
    # ORION_SHM keeps the program on our region (other regions may exist in /dev/shm on a shared machine). On a
    # host without a GPU oriond registers none, so the controller refuses: cuInit answers CUDA_ERROR_NO_DEVICE
    # with Orion's exit line; with a GPU the vGPU is granted and released at exit.
    out = rig.run(f"ORION_SHM={region} ORION_CONTROLLER={address} ORION_VGPU=1 ORION_GMEM=4096 "
                  f".venv/bin/python {rig.app()}", "cuInit: CUDA_")
    assert EXIT_LINE.search(out), out


@smoke(".venv/bin/python -m host_agent.daemon.region_server PATH")
def _region_server(rig: Rig) -> None:
    region = rig.tmp / "orionsock6"
    rig.run(f"orion-shm create -i 6 -s 32 -d {rig.tmp}", "successfully created")
    rig.start(f".venv/bin/python -m host_agent.daemon.region_server {region}")
    out = rig.until(f"orion-guest probe --region {region} --round-trips 10 --bulk-mib 1", "the region is served")
    assert "ORION-PROBE ok" in out


@smoke("make bench")
def _bench(rig: Rig) -> None:
    rig.run("make bench BENCH_ARGS='--round-trips 200 --sizes 1 --repeats 1 --idle-seconds 0.5'",
            "round trip", "bulk", "idle")


# --- the tests ----------------------------------------------------------------------------------------------
def test_every_readme_command_line_has_a_smoke_run() -> None:
    lines = readme_command_lines(README.read_text())
    assert len(lines) == len(set(lines)), f"a README command line appears twice: {lines}"
    assert set(lines) == set(SMOKES), (f"README lines without a smoke run: {sorted(set(lines) - set(SMOKES))}; "
                                       f"smoke runs for lines the README no longer has: "
                                       f"{sorted(set(SMOKES) - set(lines))}")


def test_the_readme_parser_finds_both_blocks_and_table_rows() -> None:
    text = ("# T\n```sh\nsudo ./a.sh   # set up\n\nmake b\n```\n```\nnot a command\n```\n## Commands\n\n"
            "| command | what |\n|---|---|\n| `x [-i N]` | one |\n| `y a\\|b` / `z` | two |\n\n## Next\n| `no` | x |\n")
    assert readme_command_lines(text) == ["sudo ./a.sh", "make b", "x [-i N]", "y a|b / z"]


@pytest.mark.functional
def test_the_projects_commands_are_on_path_after_setup() -> None:
    """The issue's `orion-shm: command not found`: after set-up each [project.scripts] command is on PATH."""
    missing = _set_up()
    if missing and not os.environ.get("CI") and not (VENV / "bin" / "python").exists():
        pytest.skip(f"no set-up in this checkout ({VENV} is missing): run sudo ./setup.sh")
    assert not missing, "; ".join(missing)


@pytest.mark.functional
@pytest.mark.parametrize("line", list(SMOKES))
def test_readme_command_line(line: str, set_up: None, rig: Rig) -> None:
    SMOKES[line](rig)
