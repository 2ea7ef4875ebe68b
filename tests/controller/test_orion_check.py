"""``orion-check runtime client`` against a real controller (real etcd): Orion's lines, with our pool's numbers.

Run as a separate process through ``python -m guest_runtime.orion_check``, as a user would, with HOME pointing
at a temporary directory so only the configuration the test writes is seen.
"""
from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from ivshmem.shared.controller_client import ControllerClient
from tests.controller.rig import REPO, ControllerProcess, free_port
from tests.controller.test_leases import register

pytestmark = pytest.mark.functional


def orion_check(args: list[str], home: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("ORION_")}
    full.update(HOME=str(home), PYTHONPATH=str(REPO), **env)
    return subprocess.run([sys.executable, "-m", "guest_runtime.orion_check", *args], cwd=REPO, env=full,
                          capture_output=True, text=True, timeout=60)


def test_runtime_client_reports_the_pool_through_the_users_client_conf(
        controllers: Callable[..., ControllerProcess], tmp_path: Path) -> None:
    ctl = controllers()
    client = ControllerClient(ctl.address)
    register(client, "h1")  # 2 GPUs x 4 vGPUs
    client.allocate(3, 1000)
    conf = tmp_path / ".orion" / "client.conf"
    conf.parent.mkdir()
    conf.write_text(f"[controller]\n    controller_addr = {ctl.address}\n")
    done = orion_check(["runtime", "client"], tmp_path, {})
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines() == [
        f"Using Orion Controller configuration in {conf}",
        "",
        f"Orion Controller addrress is set as {ctl.address} in configuration file. Using this address to diagnose "
        "Orion Controller",
        f"Checking Orion Controller ({ctl.address}) status ...",
        "[Info] Orion Controller setting may be different in different SHELL.",
        "[Info] Environment variable ORION_CONTROLLER has the first priority.",
        "",
        "Orion Controller Version Infomation : data_version=0.2,api_version=0.2",
        "There are 8 vGPU under managered by Orion Controller. 5 vGPU are free now.",
    ]


def test_runtime_client_prefers_orion_controller_and_says_so(
        controllers: Callable[..., ControllerProcess], tmp_path: Path) -> None:
    ctl = controllers()
    done = orion_check(["runtime", "client"], tmp_path, {"ORION_CONTROLLER": ctl.address})
    assert done.returncode == 0, done.stdout
    assert f"set as {ctl.address} in environment variable ORION_CONTROLLER." in done.stdout
    assert "There are 0 vGPU under managered by Orion Controller. 0 vGPU are free now." in done.stdout


def test_runtime_client_names_an_unreachable_controller(tmp_path: Path) -> None:
    address = f"127.0.0.1:{free_port()}"
    done = orion_check(["runtime", "client"], tmp_path, {"ORION_CONTROLLER": address})
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stdout.splitlines()[-1] == (f"[Error] Can not reach {address}. Please make sure Orion Controller "
                                            "is launched at the address, and the firewall is correctly set.")


@pytest.mark.parametrize(("args", "first"), [([], "Invalid usage for Orion Health Check Tool."),
                                             (["runtime", "nowhere"], "Invalid parameters."),
                                             (["-h"], "NAME: Orion Health Check Tool")])
def test_usage(tmp_path: Path, args: list[str], first: str) -> None:
    done = orion_check(args, tmp_path, {})
    assert done.stdout.splitlines()[0] == first and done.returncode == (0 if args == ["-h"] else 1)
