"""`orion-smi` against a real controller (real etcd): Orion's table shape, one pair of rows per vGPU, and the
pool's used/free vGPUs and reserved memory; a real oriond's GPUs appear in it. Errors are one line."""
from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from guest_runtime.controller_client import ControllerClient
from tests.controller.oriond_proc import Oriond
from tests.controller.rig import REPO, ControllerProcess, free_port, wait_until

GPU = {"uuid": "GPU-0c0c0c0c-1111-2222-3333-444444444444", "name": "Tesla P100-PCIE-16GB", "memory_mib": 16000}


def smi(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("ORION_")}
    return subprocess.run([sys.executable, "-m", "host_agent.orion_smi", *args], capture_output=True, text=True,
                          cwd=REPO, env={**base, "PYTHONPATH": str(REPO), **env}, timeout=60)


def test_orion_smi_shows_every_vgpu_of_an_oriond_host_with_used_and_free(
        controllers: Callable[..., ControllerProcess], tmp_path: Path) -> None:
    ctl = controllers(extra=["--host-ttl", "600"])
    agent = Oriond(tmp_path, "127.0.0.31", ctl.address, [GPU, {**GPU, "uuid": GPU["uuid"].replace("0c", "0d")}],
                   vgpu_count=2).start()
    try:
        with ControllerClient(ctl.address) as client:
            wait_until("oriond did not register", lambda: client.pool()["hosts"], log=agent.log)
            alloc = client.allocate(1, 6740, ttl_s=600, client="python3")
        out = smi("--controller", ctl.address)
        assert out.returncode == 0 and out.stderr == "", out.stderr
        lines = out.stdout.splitlines()
        assert lines[0].startswith("| ORION-SMI 1.0") and "CUDA Version: N/A" in lines[0]
        assert lines[1].startswith("| IP                vGPU Name        Persistence-M|")
        assert lines[3] == "|" + "+".join("=" * w for w in (49, 22, 22)) + "|"
        table = [line for line in lines if line.startswith("| 127.0.0.31") and "Orion vGPU" in line]
        assert table == ["| 127.0.0.31        Orion vGPU                Off |  N/A             Off |"
                         "                  N/A |"] * 4
        rows = [line for line in lines if "Tesla P100-PCIE-16GB" in line]
        assert [r.split()[1:3] for r in rows] == [["0", "0"], ["0", "1"], ["1", "0"], ["1", "1"]]
        used = [r for r in rows if "|  6740MiB /  6740MiB  |" in r]
        # the claim takes the lowest slot of one GPU (which one is the controller's tie-break between equal GPUs)
        assert len(used) == 1 and used[0].split()[2] == "0", rows
        free = [r for r in rows if r is not used[0]]
        assert all("|     0MiB /  8000MiB  |" in r for r in free)  # a free vGPU: GPU memory / vgpu_count
        assert "vGPUs: 4 total, 3 free" in out.stdout
        assert alloc["id"] in out.stdout and "python3" in out.stdout
        assert len({len(line) for line in lines if line}) == 1, "ragged table"
    finally:
        agent.stop()


def test_orion_smi_reads_the_address_from_orion_controller(controllers: Callable[..., ControllerProcess]) -> None:
    ctl = controllers()
    out = smi(ORION_CONTROLLER=ctl.address)
    assert out.returncode == 0, out.stderr
    assert "No GPU host is registered" in out.stdout and "vGPUs: 0 total, 0 free" in out.stdout


def test_an_unreachable_controller_is_one_line(tmp_path: Path) -> None:
    out = smi("--controller", f"127.0.0.1:{free_port()}")
    assert out.returncode == 1 and out.stdout == ""
    assert len(out.stderr.splitlines()) == 1 and "cannot reach the Orion Controller" in out.stderr, out.stderr


def test_a_bad_address_is_one_line() -> None:
    out = smi("--controller", "ftp://somewhere")
    assert out.returncode == 2 and len(out.stderr.splitlines()) == 1 and "HOST:PORT" in out.stderr, out.stderr


def test_a_bad_server_conf_is_one_line(tmp_path: Path) -> None:
    conf = tmp_path / "server.conf"
    conf.write_text("controller_addr = 1.2.3.4:9123\n")
    out = smi("--config", str(conf))
    assert out.returncode == 2 and len(out.stderr.splitlines()) == 1 and "[section]" in out.stderr, out.stderr
