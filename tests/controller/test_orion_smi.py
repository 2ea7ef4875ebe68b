"""`orion-smi` against a real controller (real etcd): Orion's table shape, one pair of rows per vGPU, and the
pool's used/free vGPUs and reserved memory; a real oriond's GPUs appear in it. Errors are one line."""
from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from ivshmem.shared.controller_client import ControllerClient
from tests.cluster_key import key_file
from tests.controller.oriond_proc import Oriond
from tests.controller.rig import REPO, ControllerProcess, free_port, member_client, wait_until

GPU = {"uuid": "GPU-0c0c0c0c-1111-2222-3333-444444444444", "name": "Tesla P100-PCIE-16GB", "memory_mib": 16000}


def smi(*args: str, key: bool = True, **env: str) -> subprocess.CompletedProcess[str]:
    """orion-smi with the tests' cluster key (`key`: else none, as a user who cannot read /etc/orion/cluster.key)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("ORION_")}
    keyed = ["--key-file", str(key_file() if key else "/nonexistent/cluster.key")]
    return subprocess.run([sys.executable, "-m", "host_agent.admin.orion_smi", *keyed, *args], capture_output=True,
                          text=True, cwd=REPO, env={**base, "PYTHONPATH": str(REPO), **env}, timeout=60)


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


RELAY = "10.0.0.1:43210"  # the relaying oriond, as the GPU host's relay listener saw it


def test_orion_smi_shows_a_relayed_allocation_and_its_transport(
        controllers: Callable[..., ControllerProcess]) -> None:
    """The GPU host's oriond confirms a relayed session's allocation with relay and transport (executor._bind);
    orion-smi then says, under that allocation's row, where it is relayed from and over what. A later confirm
    without them (a local session took the allocation up) clears them; bad values are a 400 and change nothing."""
    ctl = controllers()
    with member_client(ctl.address, "gpu-host-1") as client:  # its oriond: it registers and confirms
        client.register_host("gpu-host-1", [GPU], address="127.0.0.41", vgpu_count=2, ttl_s=600)
        local = client.allocate(1, 4000, ttl_s=600, client="local-job")
        remote = client.allocate(1, 4000, ttl_s=600, client="python3")
        assert client.confirm(local["id"], host="gpu-host-1")["extra"] == {}
        held = client.confirm(remote["id"], host="gpu-host-1", relay=RELAY, transport="tcp")
        assert held["confirmed"] is True and held["extra"] == {"relay": RELAY, "transport": "tcp"}
        assert client.allocation(remote["id"])["extra"] == held["extra"]
        for bad, reason in [({"relay": "10.0.0.1"}, "must be the relaying oriond's address as IP:PORT"),
                            ({"relay": "10.0.0.1:65536"}, "port 1 to 65535"),
                            ({"relay": "10.0.0.1:0"}, "port 1 to 65535"),
                            ({"relay": ":43210"}, "IP:PORT"),
                            ({"relay": "10.0.0.1 :43210"}, "IP:PORT"),
                            ({"relay": "10.0.0.1\n:43210"}, "IP:PORT"),
                            ({"relay": "1" * 80 + ":43210"}, "at most 80 characters"),
                            ({"relay": RELAY, "transport": "TCP\n"}, "transport 'TCP\\n' must be"),
                            ({"relay": RELAY, "transport": "t" * 17}, "at most 16 characters"),
                            ({"relay": 43210}, "relay must be a string"),
                            ({"transport": "tcp"}, "give relay"),
                            ({"relayed": RELAY}, "allowed: host, relay, transport")]:
            answer = client.request("POST", f"/api/v1/allocations/{remote['id']}/confirm",
                                    {"host": "gpu-host-1", **bad})
            assert answer.status == 400 and reason in answer.reason(), (bad, answer.reason())
            assert len(answer.reason().splitlines()) == 1
        assert client.allocation(remote["id"])["extra"] == held["extra"]  # refused: nothing changed
    out = smi("--controller", ctl.address)
    assert out.returncode == 0 and out.stderr == "", out.stderr
    lines = out.stdout.splitlines()
    assert len({len(line) for line in lines if line}) == 1, "ragged table"
    rows = {alloc["id"]: next(i for i, line in enumerate(lines) if alloc["id"] in line) for alloc in (local, remote)}
    assert "python3" in lines[rows[remote["id"]]] and "local-job" in lines[rows[local["id"]]]
    assert lines[rows[remote["id"]] + 1] == f"| {'':<29}{'relayed from ' + RELAY + ' (tcp)':<64} |"
    assert "relayed" not in lines[rows[local["id"]] + 1]
    assert out.stdout.count("relayed from") == 1
    with member_client(ctl.address, "gpu-host-1") as client:
        assert client.confirm(remote["id"], host="gpu-host-1")["extra"] == {}  # taken up by a local session now
    assert "relayed from" not in smi("--controller", ctl.address).stdout


def test_orion_smi_reads_the_address_from_orion_controller(controllers: Callable[..., ControllerProcess]) -> None:
    ctl = controllers()
    out = smi(ORION_CONTROLLER=ctl.address)
    assert out.returncode == 0, out.stderr
    assert "No GPU host is registered" in out.stdout and "vGPUs: 0 total, 0 free" in out.stdout


def test_without_the_cluster_key_orion_smi_shows_the_pool_and_says_why_not_the_allocations(
        controllers: Callable[..., ControllerProcess]) -> None:
    """The allocation list is a member's (docs/security.md): without the key, the pool and one line saying so."""
    ctl = controllers()
    out = smi("--controller", ctl.address, key=False)
    assert out.returncode == 0 and "vGPUs: 0 total, 0 free" in out.stdout
    assert len(out.stderr.splitlines()) == 1 and "allocations not shown" in out.stderr, out.stderr


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
