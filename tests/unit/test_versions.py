"""Every command answers --version with the release, as an operator expects (issue 31), and does nothing else:
`orion-wire-demo --help` used to run the whole demo. Both distributions carry the one release number."""
from __future__ import annotations

import subprocess
import sys
import tomllib

import pytest

from ivshmem.shared.version import VERSION, version_line
from tests.processes import REPO, python_path

PYPROJECTS = (REPO / "pyproject.toml", REPO / "guest_runtime" / "pyproject.toml")
SCRIPTS: dict[str, str] = {}
for _file in PYPROJECTS:
    SCRIPTS |= tomllib.loads(_file.read_text())["project"]["scripts"]
RUN_S = 60  # a bound on a command that only prints, never a measured time


def run(command: str, *args: str) -> subprocess.CompletedProcess[str]:
    """The console script `command` as its entry point runs it, with `args`, outside any Orion environment."""
    module, function = SCRIPTS[command].split(":")
    code = (f"import sys; sys.argv = [{command!r}, *sys.argv[1:]]; from {module} import {function}; "
            f"sys.exit({function}())")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": python_path(), "HOME": "/nonexistent"}
    return subprocess.run([sys.executable, "-c", code, *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=RUN_S)


def test_both_distributions_are_this_release() -> None:
    assert [tomllib.loads(f.read_text())["project"]["version"] for f in PYPROJECTS] == [VERSION, VERSION]
    assert len(SCRIPTS) >= 10  # every console script of both, the guest's among them


@pytest.mark.parametrize("command", sorted(SCRIPTS))
def test_every_command_answers_version_and_nothing_else(command: str) -> None:
    done = run(command, "--version")
    assert (done.returncode, done.stdout, done.stderr) == (0, version_line(command) + "\n", "")


def test_the_wire_demo_prints_its_help_and_runs_nothing() -> None:
    done = run("orion-wire-demo", "--help")
    assert done.returncode == 0 and done.stdout.startswith("usage: orion-wire-demo"), done.stdout + done.stderr
    assert "$ " not in done.stdout  # no step of the demo ran (each prints its command line first)


def test_orion_controller_takes_orions_help_form() -> None:
    """`orion-controller help start` (Orion's guide) shows start's options, as `start --help` does; it was refused."""
    done = run("orion-controller", "help", "start")
    assert done.returncode == 0 and done.stdout == run("orion-controller", "start", "--help").stdout
    assert "--listen" in done.stdout and "--etcd" in done.stdout
    top = run("orion-controller", "help")
    assert top.returncode == 0 and "cluster-key" in top.stdout and "start" in top.stdout
