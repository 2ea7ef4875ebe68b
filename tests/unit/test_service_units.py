"""What setup.sh installs to run Orion vGPU as services (issue 31): the documented, all-default /etc/orion/server.conf
and controller.yaml (deploy/), and the oriond and orion-controller systemd units (deploy/systemd/).

The files in the checkout are held to what the programs read: server.conf names every key oriond knows and, all
commented, gives Orion's defaults; controller.yaml gives the controller's defaults; each unit's ExecStart is a
command line its program accepts, with the stop signal the program stops on. Where setup.sh has run (CI runs it
first), the installed files are checked too, and each unit's ExecStart line runs (with --version added: the
command is there and starts)."""
from __future__ import annotations

import configparser
import dataclasses
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from controller.cli import _parser, start_config
from controller.config_file import start_flags
from host_agent.daemon import oriond
from host_agent.daemon.config import KNOWN_KEYS, ServerConfig
from ivshmem.shared.version import version_line
from tests.processes import REPO

DEPLOY = REPO / "deploy"
UNITS = {"oriond": "oriond", "orion-controller": "orion-controller"}  # unit -> the command it runs
INSTALLED = Path("/etc/systemd/system")


def unit(path: Path) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None, strict=True)
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # systemd's keys are case-sensitive
    parser.read_string(path.read_text())
    return parser


def exec_start(path: Path, bin_dir: str) -> list[str]:
    return shlex.split(unit(path)["Service"]["ExecStart"].replace("@BIN@", bin_dir))


def test_the_shipped_server_conf_names_every_key_and_changes_no_default(tmp_path: Path) -> None:
    shipped = DEPLOY / "server.conf"
    text = shipped.read_text()
    for section, keys in KNOWN_KEYS.items():
        if section == "dev":
            continue  # Orion's internal section: accepted, not documented
        for key in keys:
            assert f"{key} =" in text, f"[{section}] {key} is not shown in deploy/server.conf"
    loaded, defaults = ServerConfig.load(str(shipped)), ServerConfig.load(str(tmp_path / "missing.conf"))
    assert loaded.unknown_keys == ()
    assert dataclasses.replace(loaded, path=None) == defaults  # every key commented: Orion's defaults


def test_the_shipped_controller_yaml_gives_the_controllers_defaults() -> None:
    flags, unknown = start_flags(str(DEPLOY / "controller.yaml"))
    assert unknown == []
    shipped = start_config(_parser().parse_args(["start", "--config-file", str(DEPLOY / "controller.yaml")]))
    assert shipped == start_config(_parser().parse_args(["start"]))


def test_each_units_exec_start_is_a_command_line_its_program_takes() -> None:
    for name in UNITS:
        service = unit(DEPLOY / "systemd" / f"{name}.service")
        assert service["Service"]["KillSignal"] == "SIGINT"  # what both stop cleanly on (Ctrl-C)
        assert service["Install"]["WantedBy"] == "multi-user.target"
    argv = exec_start(DEPLOY / "systemd" / "oriond.service", "/usr/local/bin")
    assert argv[0] == "/usr/local/bin/oriond" and "/etc/orion/server.conf" in argv
    shipped = [str(DEPLOY / "server.conf") if a == "/etc/orion/server.conf" else a for a in argv[1:]]
    args = oriond._parse(shipped)  # (the installed file may not be here: the shipped one stands for it)
    assert args.config == str(DEPLOY / "server.conf") and not args.d  # in the foreground: its -d is refused
    assert unit(DEPLOY / "systemd" / "oriond.service")["Service"]["ExecReload"] == "/bin/kill -HUP $MAINPID"
    argv = exec_start(DEPLOY / "systemd" / "orion-controller.service", "/usr/local/bin")
    assert argv[:3] == ["/usr/local/bin/orion-controller", "start", "--config-file"]
    assert _parser().parse_args(argv[1:]).config_file == "/etc/orion/controller.yaml"


@pytest.mark.skipif(shutil.which("logrotate") is None, reason="no logrotate here")
def test_logrotate_takes_the_shipped_rules() -> None:
    done = subprocess.run(["logrotate", "--debug", str(DEPLOY / "logrotate.conf")], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0 and "error" not in done.stderr.lower(), done.stderr


@pytest.mark.skipif(not (INSTALLED / "oriond.service").exists(), reason="setup.sh has not run on this machine")
def test_what_setup_sh_installed_runs() -> None:
    for name in ("server.conf", "controller.yaml"):
        assert Path("/etc/orion", name).is_file(), f"/etc/orion/{name} is missing"
    if Path("/etc/logrotate.d").is_dir():
        assert Path("/etc/logrotate.d/orion").read_text() == (DEPLOY / "logrotate.conf").read_text()
    for name, command in UNITS.items():
        installed = INSTALLED / f"{name}.service"
        argv = exec_start(installed, "")
        assert "@BIN@" not in installed.read_text() and Path(argv[0]).name == command
        expected = exec_start(DEPLOY / "systemd" / f"{name}.service", str(Path(argv[0]).parent))
        assert argv == expected  # the shipped unit, with the directory setup.sh linked the commands into
        done = subprocess.run([argv[0], "--version"], capture_output=True, text=True, timeout=60)
        assert (done.returncode, done.stdout.strip()) == (0, version_line(command)), done.stderr  # it is there
    # and its arguments, with the files installed, are what the programs start with
    argv = exec_start(INSTALLED / "oriond.service", "")
    assert ServerConfig.load(oriond._parse(argv[1:]).config).unknown_keys == ()
    argv = exec_start(INSTALLED / "orion-controller.service", "")
    assert start_config(_parser().parse_args(argv[1:])).listen == "0.0.0.0:9123"
