"""On a GPU host: the real oriond registers the real GPUs (cuda-python inventory) with a real controller, and a
guest's vGPU of 4,096 MiB, taken up by its session, is what the real driver then enforces and reports.

Device machine only (skipped without an NVIDIA GPU); the same path with a fake driver runs in CI
(test_guest_allocation.py).
"""
from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from ivshmem.shared.controller_client import ControllerClient
from tests.controller.oriond_proc import Oriond
from tests.controller.rig import ControllerProcess, wait_until
from tests.controller.test_guest_allocation import EXIT_LINE, MIB, OUT_OF_MEMORY, first_line, guest
from tests.controller.test_leases import gone
from tests.processes import stop_process

HAS_GPU = os.path.exists("/dev/nvidia0") or shutil.which("nvidia-smi") is not None
pytestmark = [pytest.mark.gpu, pytest.mark.functional,
              pytest.mark.skipif(not HAS_GPU, reason="needs an NVIDIA GPU (device machine)")]


def test_a_granted_vgpu_on_a_real_gpu_has_its_quota(controllers: Callable[..., ControllerProcess],
                                                     tmp_path: Path) -> None:
    ctl = controllers()
    client = ControllerClient(ctl.address)
    oriond = Oriond(tmp_path / "host", "127.0.0.1", ctl.address, gpus=None)
    region = oriond.shm / "orionsock0"
    with open(region, "wb") as f:
        f.truncate(64 * MIB)  # blank: oriond formats it
    oriond.start()
    try:
        wait_until("oriond to register the GPUs and serve the region",
                   lambda: client.pool()["hosts"] and "Using SHM" in oriond.log(), timeout=60, log=oriond.log)
        gpus = client.pool()["hosts"][0]["gpus"]
        assert gpus and all(g["uuid"].startswith("GPU-") and g["memory_mib"] > 4096 for g in gpus)
        proc = guest({"ORION_CONTROLLER": ctl.address, "ORION_VGPU": "1", "ORION_GMEM": "4096"}, tmp_path, region)
        try:
            seen = first_line(proc)
            if seen["cuInit"] != 0:
                _, err = proc.communicate("\n", timeout=60)
                pytest.fail(f"cuInit answered {seen['cuInit']}; guest: {err}\noriond:\n{oriond.log()}")
            assert seen["count"] == 1 and seen["total"] == [4096 * MIB]
            assert (seen["alloc_too_much"], seen["alloc_1mib"]) == (OUT_OF_MEMORY, 0)
            assert seen["mem_info"] == [4095 * MIB, 4096 * MIB]
            held = client.allocation(str(seen["id"]))
            assert held["confirmed"] is True and held["vgpus"][0]["uuid"] == gpus[held["vgpus"][0]["gpu"]]["uuid"]
            _, err = proc.communicate("\n", timeout=60)
            assert EXIT_LINE.findall(err) == [seen["id"]], err
            assert gone(client, str(seen["id"]))
        finally:
            stop_process(proc, 5)
        assert "Resource successfully confirmed with controller" in oriond.log()
    finally:
        oriond.stop()
