"""A real `oriond` given a bad server.conf, flag or environment variable says so in one line and exits non-zero,
before it serves anything (issue 11).

Each case runs `python -m host_agent.daemon.oriond` with a server.conf in a temporary directory whose shm_path_base is
a temporary directory holding a blank region file, and a pid file there too: oriond writes its pid file and
formats a blank region only once it serves, so after a refused start both must be as they were. A good
configuration, started the same way, is the control: it gets as far as its pid file.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.processes import REPO, python_path, stop_process

RUN_TIMEOUT_S = 60.0  # a bound on a refused start (it takes well under a second), never a measured time
REGION_BYTES = 16 << 20

SHM = "[server-shm]\n    shm_path_base = {shm}\n"


def key(section: str, line: str) -> str:
    """A server.conf with one setting in `section` and a good shm_path_base ({shm}: the rig's directory)."""
    return f"[{section}]\n    {line}\n{SHM}"


# Each must be refused.
BAD_CONFS = {
    "vgpu_count superscript": key("server", "vgpu_count = \u00b2"),
    "listen_port superscript": key("server", "listen_port = \u00b3"),
    "listen_port arabic-indic": key("server", "listen_port = \u0669\u0669\u0666\u0660"),
    "listen_port too large": key("server", "listen_port = 65534"),
    "listen_port huge": key("server", "listen_port = " + "9" * 5000),
    "vgpu_count negative": key("server", "vgpu_count = -1"),
    "vgpu_count 101": key("server", "vgpu_count = 101"),
    "unterminated quote": key("server", 'enable_shm = "true'),
    "unterminated quote in path": '[server-shm]\n    shm_path_base = "{shm}\n',
    "boolean not quoted right": key("server", "enable_kvm = yes"),
    "relay address without port": "[server-relay]\n    remote_addr = 10.0.0.2\n",
    "cluster key_file relative": key("cluster", "key_file = cluster.key"),
    "bind_addr empty": key("server", 'bind_addr = ""'),
    "bind_addr with space": key("server", "bind_addr = 10.0.0.1 10.0.0.2"),
    "shm_path_base missing": "[server-shm]\n    shm_path_base = {shm}/not-made\n",
    "shm_path_base a file": "[server-shm]\n    shm_path_base = {shm}/orionsock0\n",
    "shm_path_base relative": "[server-shm]\n    shm_path_base = shm\n",
    "shm_path_base empty": '[server-shm]\n    shm_path_base = ""\n',
    "shm_buffer_size too small": SHM + "    shm_buffer_size = 8\n",
    "shm_buffer_size superscript": SHM + "    shm_buffer_size = \u00b9\u2076\n",
    "shm_user_name empty": SHM + '    shm_user_name = ""\n',
    "log_level unknown": key("server-log", "log_level = LOUD"),
    "log_to_file not 0/1": key("server-log", "log_to_file = yes"),
    "comm_id without port": key("server-nccl", 'comm_id = "127.0.0.1"'),
    "controller_addr without port": key("controller", "controller_addr = 10.0.0.1"),
    "controller_addr port 0": key("controller", "controller_addr = 10.0.0.1:0"),
    "controller_addr port too large": key("controller", "controller_addr = 10.0.0.1:70000"),
    "controller_addr superscript port": key("controller", "controller_addr = 10.0.0.1:9\u00b9\u00b2\u00b3"),
    "line without =": key("server", "vgpu_count 4"),
    "log_dir relative": key("server-log", "log_dir = log"),
    "metrics_addr without port": key("server-metrics", "metrics_addr = 127.0.0.1"),
    "enable_mps not true/false": key("server-mps", "enable_mps = yes"),
    "mps_dir relative": key("server-mps", "enable_mps = true\n    mps_dir = run/mps"),
}

GOOD_CONF = "[server]\n    vgpu_count = 2\n[server-shm]\n    shm_path_base = \"{shm}/\"\n"

# (flags, extra environment); run with GOOD_CONF, so only the flag or variable is wrong.
BAD_FLAGS: dict[str, tuple[list[str], dict[str, str]]] = {
    "--devices x": (["--devices", "x"], {}),
    "--devices 0,,1": (["--devices", "0,,1"], {}),
    "--devices trailing comma": (["--devices", "0,"], {}),
    "--devices empty": (["--devices", ""], {}),
    "--devices twice": (["--devices", "0,1,0"], {}),
    "--devices negative": (["--devices=-1"], {}),
    "--devices superscript": (["--devices", "\u00b9"], {}),
    "-d (daemonise)": (["-d"], {}),
    "--gmem -5": (["--gmem", "-5"], {}),
    "--gmem 0": (["--gmem", "0"], {}),
    "--gmem arabic-indic": (["--gmem", "\u0661\u0660\u0662\u0664"], {}),
    "--gmem float": (["--gmem", "1.5"], {}),
    "--rescan-interval nan": (["--rescan-interval", "nan"], {}),
    "--rescan-interval inf": (["--rescan-interval", "inf"], {}),
    "--rescan-interval -1": (["--rescan-interval", "-1"], {}),
    "--rescan-interval 0": (["--rescan-interval", "0"], {}),
    "--rescan-interval overflow": (["--rescan-interval", "1e999"], {}),
    "-n 0": (["-n", "0"], {}),
    "-p superscript": (["-p", "\u00b3"], {}),
    "-p too large": (["-p", "65534"], {}),
    "-b not an address": (["-b", "not an ip"], {}),
    "--config missing": (["--config", "{tmp}/missing.conf"], {}),
    "--config a directory": (["--config", "{tmp}"], {}),
    "--region missing": (["--region", "{shm}/orionsock9"], {}),
    "--pid-file a directory": (["--pid-file", "{tmp}"], {}),
    "unknown flag": (["--gmen", "1024"], {}),
    "ORION_CONTROLLER without port": ([], {"ORION_CONTROLLER": "10.0.0.1"}),
    "ORION_CONTROLLER port out of range": ([], {"ORION_CONTROLLER": "10.0.0.1:99999"}),
    "ORION_CONTROLLER not an address": ([], {"ORION_CONTROLLER": "http://a b:9123"}),
    "ORION_PID_FILE a directory": ([], {"ORION_PID_FILE": "{tmp}"}),
}


class Rig:
    """A temporary shm_path_base holding a blank region file, a server.conf and a pid file path."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.shm = tmp / "shm"
        self.shm.mkdir()
        self.region = self.shm / "orionsock0"
        with open(self.region, "wb") as f:
            f.truncate(REGION_BYTES)
        self.conf = tmp / "server.conf"
        self.pid_file = tmp / "run" / "oriond.pid"

    def fill(self, text: str) -> str:
        return text.replace("{shm}", str(self.shm)).replace("{tmp}", str(self.tmp))

    def command(self, flags: list[str], extra: dict[str, str]) -> list[str]:
        """oriond with `flags`, plus this rig's --config and --pid-file unless the case sets them."""
        args = [self.fill(flag) for flag in flags]
        if not any(a.startswith("--config") for a in args):
            args = ["--config", str(self.conf), *args]
        if not any(a.startswith("--pid-file") for a in args) and "ORION_PID_FILE" not in extra:
            args += ["--pid-file", str(self.pid_file)]
        return [sys.executable, "-m", "host_agent.daemon.oriond", *args]

    def env(self, extra: dict[str, str]) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ORION_")}
        env["PYTHONPATH"] = python_path()
        env.update({k: self.fill(v) for k, v in extra.items()})
        return env

    def refused(self, flags: list[str], extra: dict[str, str] | None = None) -> str:
        """Run oriond, expecting a refusal: the one line it printed; asserts nothing was served."""
        extra = extra or {}
        result = subprocess.run(self.command(flags, extra), cwd=REPO, env=self.env(extra), stdin=subprocess.DEVNULL,
                                capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
        lines = result.stderr.splitlines()
        assert result.returncode != 0, f"oriond accepted it:\n{result.stderr}"
        assert "Traceback" not in result.stderr, result.stderr
        assert len(lines) == 1, f"expected one line on stderr:\n{result.stderr}"
        assert lines[0].startswith("oriond: "), lines[0]
        assert not self.pid_file.exists(), "oriond wrote its pid file: it had started serving"
        with open(self.region, "rb") as f:
            assert f.read(4096) == bytes(4096), "oriond formatted the region: it had started serving"
        return lines[0]


@pytest.fixture
def rig(tmp_path: Path) -> Rig:
    return Rig(tmp_path)


@pytest.mark.parametrize("case", list(BAD_CONFS))
def test_a_bad_server_conf_is_one_line_and_exit_1(case: str, rig: Rig) -> None:
    rig.conf.write_text(rig.fill(BAD_CONFS[case]), encoding="utf-8")
    line = rig.refused([])
    assert line.startswith("oriond: Error in orion.conf: "), line
    assert str(rig.conf) in line, "the line names the file"


@pytest.mark.parametrize("case", list(BAD_FLAGS))
def test_a_bad_flag_or_variable_is_one_line_naming_it(case: str, rig: Rig) -> None:
    flags, extra = BAD_FLAGS[case]
    rig.conf.write_text(rig.fill(GOOD_CONF))
    line = rig.refused(flags, extra)
    named = flags[0].split("=")[0] if flags else next(iter(extra))
    assert named in line, f"the line names {named}: {line}"


def test_a_missing_shm_path_base_says_to_create_it_and_is_not_created(rig: Rig) -> None:
    missing = rig.tmp / "regions"
    rig.conf.write_text(f"[server-shm]\n    shm_path_base = {missing}/\n")
    line = rig.refused([])
    assert f"mkdir -p {missing}" in line
    assert not missing.exists()


def three_gpus(rig: Rig) -> str:
    """A made-up inventory of GPUs 0, 1 and 2 (host_agent/session/gpu_inventory.py's test override), so that --devices
    is judged the same on a machine with or without GPUs."""
    path = rig.tmp / "gpus.json"
    path.write_text(json.dumps([{"uuid": f"GPU-{i}", "name": "made-up", "memory_mib": 1024} for i in range(3)]))
    return str(path)


def test_devices_this_host_does_not_have_are_refused(rig: Rig) -> None:
    """Sessions would otherwise lose the missing GPUs without a word."""
    rig.conf.write_text(rig.fill(GOOD_CONF))
    line = rig.refused(["--devices", "0,7,2,9"], {"ORION_TEST_GPU_INVENTORY": three_gpus(rig)})
    assert line == ("oriond: argument --devices: 0,7,2,9: this host has no GPU 7,9 (it has 3: 0, 1, 2); name "
                    "only GPUs it has, or leave --devices out to use all"), line


def test_a_good_conf_with_the_same_rig_starts(rig: Rig) -> None:
    """The control: the cases above fail for what they change, not for the rig."""
    rig.conf.write_text(rig.fill(GOOD_CONF))
    log = rig.tmp / "oriond.log"
    flags = ["--devices", "0,2", "--gmem", "1024", "--rescan-interval", "0.5", "-n", "8", "-p", "9960", "-b", "::1"]
    extra = {"ORION_CONTROLLER": "", "ORION_TEST_GPU_INVENTORY": three_gpus(rig)}
    with open(log, "wb") as out:
        proc = subprocess.Popen(rig.command(flags, {}), cwd=REPO, env=rig.env(extra),
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while not rig.pid_file.exists():
            assert proc.poll() is None, f"oriond exited with {proc.returncode}:\n{log.read_text()}"
            assert time.monotonic() < deadline, f"oriond did not write its pid file:\n{log.read_text()}"
            time.sleep(0.05)
    finally:
        assert stop_process(proc) == 0, log.read_text()


def test_a_machine_whose_host_name_was_never_set_names_itself_by_its_address(monkeypatch: pytest.MonkeyPatch) -> None:
    """A guest or container without a host name says "(none)", which cannot name a node in the relay handshake
    (docs/security.md): the relaying oriond then names itself by its bind_addr (issue 27's RDMA guest)."""
    import socket

    from host_agent.relay import handshake
    from host_agent.relay.route import host_name
    monkeypatch.setattr(socket, "gethostname", lambda: "(none)")
    assert not handshake.valid_name("(none)") and host_name("10.0.0.7") == "10.0.0.7"
    monkeypatch.setattr(socket, "gethostname", lambda: "gpu-node-3")
    assert host_name("10.0.0.7") == "gpu-node-3"
