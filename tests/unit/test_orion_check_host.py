"""orion-check without a controller: the README's bare `install`, the CUDA row (a real driver, not a toolkit
directory), and the runtime checks never claiming a configuration file that gave them nothing.

The CLI runs as a real process (`python -m guest_runtime.orion_check`) with HOME in a temporary directory.
The CUDA cases build tiny stand-ins for libcuda.so.1 with the C compiler (skipped without one) and put them
first on LD_LIBRARY_PATH: one answers cuDriverGetVersion as a driver does, one as the toolkit's stub library.
"""
from __future__ import annotations

import ctypes
import io
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from guest_runtime import check_host, orion_check
from guest_runtime.client_config import SYSTEM_CONF, ControllerSetting

REPO = Path(__file__).resolve().parents[2]
CUDA_ERROR_STUB_LIBRARY = 34
no_system_conf = pytest.mark.skipif(SYSTEM_CONF.exists(), reason=f"{SYSTEM_CONF} exists on this machine")


def orion_check_cli(*args: str, home: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("ORION_")}
    full.update(HOME=str(home), PYTHONPATH=str(REPO), **env)
    return subprocess.run([sys.executable, "-m", "guest_runtime.orion_check", *args], cwd=REPO, env=full,
                          capture_output=True, text=True, timeout=120)


def unreachable_address() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"  # closed again: nothing listens there


def rows(stdout: str) -> dict[str, str]:
    found = {}
    for line in stdout.splitlines():
        name, sep, value = line.partition(" :")
        if sep and value.strip().startswith("["):
            found[name.strip()] = value.strip()[1:-1]
    return found


# --- install ---------------------------------------------------------------------------------------------
def test_bare_install_prints_the_whole_summary(tmp_path: Path) -> None:
    """The README's `orion-check install` was 'Invalid usage'; it now means `install all`."""
    bare = orion_check_cli("install", home=tmp_path)
    assert bare.returncode == 0, bare.stdout + bare.stderr
    assert bare.stdout.splitlines()[1] == "Installation summaries :"
    everything = orion_check_cli("install", "all", home=tmp_path)
    assert set(rows(bare.stdout)) == set(rows(everything.stdout))
    assert {"CUDA", "NVIDIA GPU", "Orion client runtime", "etcd"} <= set(rows(bare.stdout))


@pytest.mark.parametrize("args", [["install", "nothing"], ["install", "all", "more"], ["runtime"]])
def test_other_usage_is_still_refused(args: list[str], tmp_path: Path) -> None:
    done = orion_check_cli(*args, home=tmp_path)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stdout.splitlines()[0] in ("Invalid parameters.", "Invalid usage for Orion Health Check Tool.")


def driver_loads_here() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


@pytest.mark.skipif(driver_loads_here(), reason="this machine has a CUDA driver")
def test_cuda_is_no_without_a_driver_even_with_a_toolkit(tmp_path: Path) -> None:
    """Orion looked for /usr/local/cuda*; a toolkit (or cuda-python) on a GPU-less host is no driver."""
    done = orion_check_cli("install", "server", home=tmp_path)
    assert rows(done.stdout)["CUDA"] == "No", done.stdout


def fake_libcuda(directory: Path, answer: int, version: int) -> Path:
    """A libcuda.so.1 whose cuDriverGetVersion returns `answer` and writes `version`."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler to build a stand-in libcuda.so.1")
    directory.mkdir()
    source = directory / "fake.c"
    source.write_text(f"int cuDriverGetVersion(int *v) {{ *v = {version}; return {answer}; }}\n"
                      "int cuInit(unsigned int flags) { (void)flags; return 0; }\n")
    subprocess.run([compiler, "-shared", "-fPIC", "-o", str(directory / "libcuda.so.1"), str(source)],
                   check=True, capture_output=True, timeout=60)
    return directory


def test_cuda_is_yes_with_a_loadable_driver(tmp_path: Path) -> None:
    lib = fake_libcuda(tmp_path / "driver", 0, 12040)
    done = orion_check_cli("install", "server", home=tmp_path, LD_LIBRARY_PATH=str(lib))
    assert rows(done.stdout)["CUDA"] == "Yes", done.stdout


def test_cuda_is_no_with_the_toolkits_stub_library(tmp_path: Path) -> None:
    lib = fake_libcuda(tmp_path / "stub", CUDA_ERROR_STUB_LIBRARY, 0)
    done = orion_check_cli("install", "server", home=tmp_path, LD_LIBRARY_PATH=str(lib))
    assert rows(done.stdout)["CUDA"] == "No", done.stdout


def test_cuda_driver_reads_the_version(tmp_path: Path) -> None:
    lib = fake_libcuda(tmp_path / "driver", 0, 12040)
    code = "from guest_runtime.check_host import cuda_driver; print(cuda_driver())"
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "LD_LIBRARY_PATH": str(lib), "PYTHONPATH": str(REPO)})
    assert done.stdout.strip() == "12.4", done.stderr


# --- runtime: where the controller address came from ------------------------------------------------------
@no_system_conf
def test_runtime_client_without_configuration_says_it_uses_the_default(tmp_path: Path) -> None:
    done = orion_check_cli("runtime", "client", home=tmp_path)
    lines = done.stdout.splitlines()
    assert not any("Using Orion Controller configuration" in line for line in lines), lines
    assert not any("in configuration file" in line for line in lines), lines
    assert lines[0].startswith("[Info] No Orion Controller is configured") and "client.conf" in lines[0]
    assert lines[2] == ("Orion Controller addrress is set as 127.0.0.1:9123 by default. Using this address to "
                        "diagnose Orion Controller")


@no_system_conf
def test_runtime_client_names_the_file_the_address_came_from_and_only_that(tmp_path: Path) -> None:
    conf = tmp_path / ".orion" / "client.conf"
    conf.parent.mkdir()
    conf.write_text("[controller]\n    # no address here\n")
    address = unreachable_address()
    from_env = orion_check_cli("runtime", "client", home=tmp_path, ORION_CONTROLLER=address)
    assert "Using Orion Controller configuration" not in from_env.stdout
    assert f"set as {address} in environment variable ORION_CONTROLLER." in from_env.stdout
    empty_file = orion_check_cli("runtime", "client", home=tmp_path)
    assert f"configuration in {conf}" not in empty_file.stdout and "by default" in empty_file.stdout
    conf.write_text(f"[controller]\n    controller_addr = {address}\n")
    from_file = orion_check_cli("runtime", "client", home=tmp_path)
    assert from_file.stdout.splitlines()[0] == f"Using Orion Controller configuration in {conf}"
    assert f"set as {address} in configuration file." in from_file.stdout


def test_runtime_server_without_a_controller_setting_says_so(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """No oriond running and no server.conf: the check used to claim the missing file named the address."""
    checked: list[ControllerSetting] = []
    monkeypatch.setattr(orion_check, "SERVER_CONF", tmp_path / "server.conf")
    monkeypatch.setattr(check_host, "oriond", lambda: None)
    monkeypatch.setattr(check_host, "gpus", lambda: None)
    monkeypatch.setattr(orion_check, "check_controller", lambda setting, out: checked.append(setting) or False)
    out = io.StringIO()
    assert orion_check.runtime_server(out) == 1
    assert [s.source for s in checked] == ["default"]  # check_controller.DEFAULT_SOURCE: says "by default"
    info = [line for line in out.getvalue().splitlines() if line.startswith("[Info] No Orion Controller")]
    assert len(info) == 1 and str(tmp_path / "server.conf") in info[0] and "registers with none" in info[0]


# --- runtime server: the Orion Server network -------------------------------------------------------------
def runtime_server_lines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, conf_text: str,
                         *flags: str) -> tuple[int, list[str]]:
    """orion_check.runtime_server with an oriond running as `oriond --config <conf> <flags>` and a controller
    that answers; the exit status and the lines printed."""
    conf = tmp_path / "server.conf"
    conf.write_text(conf_text)
    proc = check_host.Process(4242, "root", ["/usr/bin/oriond", "--config", str(conf), *flags], {})
    monkeypatch.setattr(check_host, "oriond", lambda: proc)
    monkeypatch.setattr(check_host, "gpus", lambda: ("550.54.15", ["Tesla V100-PCIE-16GB"]))
    monkeypatch.setattr(check_host, "mps_running", lambda: False)
    monkeypatch.setattr(orion_check, "check_controller", lambda setting, out: True)
    out = io.StringIO()
    code = orion_check.runtime_server(out)
    return code, out.getvalue().splitlines()


def network_section(lines: list[str]) -> list[str]:
    """Orion's lines from 'Binding IP Address :' to the network test's answer."""
    start = next(i for i, line in enumerate(lines) if line.startswith("Binding IP Address :"))
    return lines[start:start + 5]


def test_runtime_server_reaches_orionds_listen_port(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        code, lines = runtime_server_lines(tmp_path, monkeypatch,
                                           f"[server]\n    bind_addr = 127.0.0.1\n    listen_port = {port}\n")
        listener.settimeout(5)
        listener.accept()[0].close()  # the check really connected to this socket
    assert network_section(lines) == [f"{'Binding IP Address :':<40}127.0.0.1", f"{'Listening Port :':<40}{port}",
                                      "", "Testing the Orion Server network ...",
                                      f"Orion Server can be reached through 127.0.0.1:{port}"]
    assert code == 0, lines


def test_runtime_server_says_what_an_unreachable_listen_port_means(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    port = unreachable_address().rpartition(":")[2]
    code, lines = runtime_server_lines(tmp_path, monkeypatch,
                                       f"[server]\n    bind_addr = 127.0.0.1\n    listen_port = {port}\n")
    section = network_section(lines)
    assert section[:4] == [f"{'Binding IP Address :':<40}127.0.0.1", f"{'Listening Port :':<40}{port}", "",
                           "Testing the Orion Server network ..."]
    answer = section[4]
    assert answer.startswith(f"[Error] Orion Server cannot be reached through 127.0.0.1:{port} (Connection refused): "
                             f"other hosts cannot relay sessions to this host"), answer
    assert "oriond runs" in answer and f"bind_addr and listen_port in {tmp_path / 'server.conf'}" in answer
    assert "firewall" in answer and "Orion Server can be reached" not in "\n".join(lines)
    assert code == 1


def test_runtime_server_tests_the_address_orionds_flags_give(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """-b and -p override server.conf in oriond (so in the check too); a wildcard bind_addr is reached on the
    loopback; a listen_port that is no port is said to be one, without trying it."""
    closed = unreachable_address().rpartition(":")[2]
    conf = f"[server]\n    bind_addr = 10.255.255.1\n    listen_port = {closed}\n"
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        code, lines = runtime_server_lines(tmp_path, monkeypatch, conf, "-b", "0.0.0.0", f"-p{port}")
    assert network_section(lines)[::4] == [f"{'Binding IP Address :':<40}0.0.0.0",
                                           f"Orion Server can be reached through 127.0.0.1:{port} (bind_addr "
                                           f"0.0.0.0: every address of this host)"]
    assert code == 0, lines
    code, lines = runtime_server_lines(tmp_path, monkeypatch, "[server]\n    listen_port = 99999\n")
    answer = network_section(lines)[4]
    assert answer.startswith("[Error] Listening Port '99999' is not a port number (1 to 65535)"), answer
    assert code == 1
