"""The guest runtime's allocation against a real etcd and a real controller process.

A guest here is a separate Python process (allocating_guest.py) whose first CUDA call goes through the real
Forwarder; ORION_SHM points at a region that does not exist, so after the controller has granted vGPUs the
channel itself is unreachable and cuInit answers CUDA_ERROR_NO_DEVICE — the grant is what these tests check.
Expiry waits are bounded and assert etcd's state afterwards, never how long it took.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from controller.client import ControllerClient
from tests.controller.rig import ControllerProcess, free_port
from tests.controller.test_leases import gone, register, wait_until
from tests.processes import stop_process

pytestmark = pytest.mark.functional

GUEST = Path(__file__).with_name("allocating_guest.py")
NO_DEVICE = 100
EXIT_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \[INFO\] Client exits with allocation ID (\S+)$", re.M)


def guest(env: dict[str, str], tmp_path: Path) -> subprocess.Popen[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("ORION_")}
    full.update(HOME=str(tmp_path), ORION_SHM=str(tmp_path / "no-such-region"), **env)
    return subprocess.Popen([sys.executable, str(GUEST)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=full, start_new_session=True)


def first_line(proc: subprocess.Popen[str]) -> dict[str, object]:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        proc.wait(10)
        raise AssertionError(proc.stderr.read() if proc.stderr else "no output")
    return dict(json.loads(line))


def test_a_guest_gets_vgpus_and_releases_them_at_exit(controllers: Callable[..., ControllerProcess],
                                                       tmp_path: Path) -> None:
    ctl = controllers()
    client = ControllerClient(ctl.address)
    register(client, "h1")
    proc = guest({"ORION_CONTROLLER": ctl.address, "ORION_VGPU": "2", "ORION_GMEM": "6000"}, tmp_path)
    try:
        seen = first_line(proc)
        assert seen["id"] and seen["host"] == "h1"
        held = client.allocation(str(seen["id"]))
        assert len(held["vgpus"]) == 2 and all(v["memory_mib"] == 6000 for v in held["vgpus"])
        assert client.pool()["vgpus_free"] == 6
        out, err = proc.communicate("\n", timeout=30)
        assert proc.returncode == 0, err
        assert "[INFO] Using Orion resource (" in err and f") {seen['id']} : {held['address']}:{held['port']}/" in err
        assert EXIT_LINE.findall(err) == [seen["id"]]
        assert gone(client, str(seen["id"])) and client.pool()["vgpus_free"] == 8
    finally:
        stop_process(proc, 5)


def test_the_controller_in_the_users_client_conf_is_used(controllers: Callable[..., ControllerProcess],
                                                         tmp_path: Path) -> None:
    ctl = controllers()
    client = ControllerClient(ctl.address)
    register(client, "h1")
    (tmp_path / ".orion").mkdir()
    (tmp_path / ".orion" / "client.conf").write_text(f"[controller]\n    controller_addr = {ctl.address}\n")
    proc = guest({"ORION_VGPU": "1"}, tmp_path)
    try:
        seen = first_line(proc)
        assert client.allocation(str(seen["id"]))["id"] == seen["id"]
        _, err = proc.communicate("\n", timeout=30)
        assert EXIT_LINE.findall(err) == [seen["id"]]
    finally:
        stop_process(proc, 5)


def test_a_killed_guest_is_reclaimed_after_its_lease(controllers: Callable[..., ControllerProcess],
                                                    tmp_path: Path) -> None:
    ctl = controllers(extra=["--lease-ttl", "2", "--host-ttl", "2"])
    client = ControllerClient(ctl.address)
    register(client, "h1")
    proc = guest({"ORION_CONTROLLER": ctl.address, "ORION_VGPU": "1"}, tmp_path)
    try:
        seen = first_line(proc)
        alloc_id = str(seen["id"])
        # the guest's daemon thread keeps the 2 s lease alive over several lifetimes
        time.sleep(3 * 2)
        assert proc.poll() is None and client.allocation(alloc_id)["id"] == alloc_id
        proc.kill()
        proc.wait(10)
        wait_until("the killed guest's allocation to expire", lambda: gone(client, alloc_id))
        assert client.pool()["vgpus_free"] == 8
    finally:
        stop_process(proc, 5)


@pytest.mark.parametrize(("env", "expected"), [
    ({"ORION_VGPU": "3", "ORION_GMEM": "99999"}, "Fail to get resource from controller"),
    ({"ORION_VGPU": "many"}, "ORION_VGPU='many' is not a positive whole number of vGPUs"),
])
def test_a_refused_request_is_one_line_and_no_device(controllers: Callable[..., ControllerProcess],
                                                     tmp_path: Path, env: dict[str, str], expected: str) -> None:
    ctl = controllers()
    client = ControllerClient(ctl.address)
    register(client, "h1")
    proc = guest({"ORION_CONTROLLER": ctl.address, **env}, tmp_path)
    try:
        seen = first_line(proc)
        assert seen == {"cuInit": NO_DEVICE, "id": None, "host": None}
        _, err = proc.communicate("\n", timeout=30)
        lines = err.splitlines()
        assert lines[0].startswith("orion: no GPU through Orion: ") and expected in lines[0], err
        assert lines[1].endswith("[INFO] Client exits without allocation ID.") and len(lines) == 2, err
        assert "Traceback" not in err and client.allocations() == []
    finally:
        stop_process(proc, 5)


def test_an_unreachable_controller_is_one_line_and_no_device(tmp_path: Path) -> None:
    proc = guest({"ORION_CONTROLLER": f"127.0.0.1:{free_port()}", "ORION_VGPU": "1"}, tmp_path)
    try:
        assert first_line(proc)["cuInit"] == NO_DEVICE
        _, err = proc.communicate("\n", timeout=30)
        assert "cannot reach the Orion Controller at 127.0.0.1:" in err.splitlines()[0]
        assert "Traceback" not in err
    finally:
        stop_process(proc, 5)
