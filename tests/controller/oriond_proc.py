"""A real oriond process for the controller tests: its own server.conf, region dir and (made-up) GPU inventory.

No GPU is needed: the inventory comes from ORION_TEST_GPU_INVENTORY (host_agent/session/gpu_inventory.py, a test-only
override) and the region dir is empty, so oriond registers and heartbeats but never opens a CUDA session.
Every wait is bounded; ``stop`` never hangs (SIGINT, then SIGKILL).
"""
from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.cluster_key import key_file as relay_key_file
from tests.controller.rig import REPO, cluster_key_file
from tests.processes import python_path, stop_process


def _stop_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG: no orphan if pytest dies



class Oriond:
    def __init__(self, tmp: Path, bind_addr: str, controller: str | None, gpus: list[dict[str, object]] | None,
                 vgpu_count: int = 4, listen_port: int = 9960, rdma: str | None = None, relay_to: str = "",
                 sections: str = "") -> None:
        """`rdma`: enable_rdma, with that ibverbs_device ("": none named); `relay_to`: [server-relay] remote_addr;
        `sections`: more of server.conf, as written."""
        tmp.mkdir(parents=True, exist_ok=True)
        self.shm = tmp / "shm"
        self.shm.mkdir(exist_ok=True)
        self.conf = tmp / "server.conf"
        text = (f"[server]\n    bind_addr = {bind_addr}\n    listen_port = {listen_port}\n"
                f"    vgpu_count = {vgpu_count}\n")
        if rdma is not None:
            text += "    enable_rdma = true\n" + (f"    ibverbs_device = {rdma}\n" if rdma else "")
        text += f"[server-shm]\n    shm_path_base = \"{self.shm}/\"\n"
        text += f"[server-log]\n    log_dir = {tmp}/log\n"  # its server.log and session logs beside its other files
        if relay_to:
            text += f"[server-relay]\n    remote_addr = {relay_to}\n"
        if controller:
            text += f"[controller]\n\tcontroller_addr = {controller}\n"
            text += f"[cluster]\n    key_file = {cluster_key_file()}\n"  # a member of the tests' cluster
        else:  # relays without a controller: the tests' fixed key, which the relay listeners they dial hold too
            text += f"[cluster]\n    key_file = {relay_key_file()}\n"
        self.conf.write_text(text + sections)
        self.inventory: Path | None = None
        if gpus is not None:
            self.inventory = tmp / "inventory.json"
            self.inventory.write_text(json.dumps(gpus))
        self.pid_file = tmp / "oriond.pid"
        self.log_path = tmp / "oriond.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Oriond:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ORION_")}
        env["PYTHONPATH"] = python_path()
        if self.inventory is not None:
            env["ORION_TEST_GPU_INVENTORY"] = str(self.inventory)
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "host_agent.daemon.oriond", "--config", str(self.conf), "--pid-file",
                 str(self.pid_file)], cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=_stop_with_parent)
        return self

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self, whole_host: bool = True) -> None:
        """SIGKILL. `whole_host`: oriond and every process of it (its controller link, its region supervisors), as
        when the host dies, so only the host lease takes it out of the pool; else oriond's own process only,
        whose link process then dies with it (and unregisters)."""
        if self.alive():
            assert self.proc is not None
            if whole_host:
                os.killpg(self.proc.pid, signal.SIGKILL)  # start_new_session: oriond leads its process group
            else:
                self.proc.kill()
            self.proc.wait(10)

    def stop(self) -> int | None:
        return None if self.proc is None else stop_process(self.proc, 20)
