"""NVIDIA MPS for the session workers (`[server-mps] enable_mps = true`): tenants' kernels overlap on the GPU.

Without MPS every session worker is a CUDA process of its own, and the GPU time-slices between them: K tenants each
get about 1/K of the time, together about what one process alone does (docs/performance.md, "Tenants"). Under MPS
their kernels run at once, each process limited to its vGPU's share of the GPU's SMs: CUDA_MPS_ACTIVE_THREAD_PERCENTAGE
= 100 / vgpu_count (rounded up), so a GPU carved into N vGPUs gives each tenant 1/N of the SMs, and tenants whose
kernels do not fill the GPU alone (batch-1 inference, small models, launch-bound loops) together do more.

oriond starts its own MPS control daemon (`nvidia-cuda-mps-control -d`) with its own pipe and log directories under
`mps_dir`, so it neither depends on nor disturbs an MPS an administrator runs with the default /tmp/nvidia-mps; one
already answering in `mps_dir` (an oriond restarted) is used as it is. The variables are put in oriond's environment
before any session worker is forked, so each worker's cuInit connects to it; oriond stops a daemon it started when it
exits. Where MPS cannot run (no nvidia-cuda-mps-control on PATH, a directory that cannot be made, a daemon that does
not start) oriond says why in one line and sessions time-slice the GPU as without it: a limit of ours never fails a
session. What MPS itself refuses (pre-Volta GPUs, a GPU in exclusive-process mode held by another process) appears as
the driver's errors, as natively under MPS.

Not here: which sessions share a GPU (the controller's vGPUs) and the memory quotas (session/vgpu_quota.py).
"""
from __future__ import annotations

import logging
import math
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

CONTROL = "nvidia-cuda-mps-control"
DEFAULT_MPS_DIR = "/run/orion/mps"
START_S = 10.0  # how long a starting control daemon may take to open its pipe


@dataclass(frozen=True)
class MpsSettings:
    """[server-mps]: whether session workers run under MPS, and where its pipes and logs live."""

    enabled: bool = False
    directory: str = DEFAULT_MPS_DIR


@dataclass(frozen=True)
class MpsDaemon:
    """An MPS control daemon the session workers use: the variables that lead a CUDA process to it."""

    environment: dict[str, str]
    control: str  # the nvidia-cuda-mps-control binary
    started: bool  # oriond started it (and stops it at exit), rather than found it running

    def stop(self) -> None:
        """`quit`: the daemon ends once its clients have; only one this oriond started."""
        if not self.started:
            return
        try:
            subprocess.run([self.control], input="quit\n", text=True, env=os.environ | self.environment,
                           capture_output=True, timeout=30, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            log.warning("MPS: the control daemon did not take 'quit' (%s); stop it with: echo quit | "
                        "CUDA_MPS_PIPE_DIRECTORY=%s %s", exc, self.environment["CUDA_MPS_PIPE_DIRECTORY"], self.control)


def active_thread_percentage(vgpu_count: int) -> int:
    """A vGPU's share of the GPU's SMs, as MPS takes it: 100 / vgpu_count, rounded up, at least 1."""
    return max(1, min(100, math.ceil(100 / max(1, vgpu_count))))


def _answers(control: str, environment: dict[str, str]) -> bool:
    """Whether a control daemon answers on the pipe directory of `environment`."""
    if not (Path(environment["CUDA_MPS_PIPE_DIRECTORY"]) / "control").exists():
        return False
    try:
        done = subprocess.run([control], input="get_server_list\n", text=True, env=os.environ | environment,
                              capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def start(settings: MpsSettings, vgpu_count: int, export: bool = True) -> MpsDaemon | None:
    """The MPS control daemon of `settings` (started when none answers there), with `export` its variables set in
    this process's environment for the processes it forks (oriond's session workers; a benchmark or test that
    starts native processes under it passes their environment itself); None, said in one line, where MPS cannot
    run here."""
    if not settings.enabled:
        return None
    control = shutil.which(CONTROL)
    if control is None:
        log.warning("MPS: enable_mps is set but %s is not on PATH (it comes with the NVIDIA driver's utilities); "
                    "sessions time-slice the GPU without MPS", CONTROL)
        return None
    base = Path(settings.directory)
    pipes, logs = base / "pipe", base / "log"
    try:
        for directory in (pipes, logs):
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        log.warning("MPS: cannot make %s (%s); set [server-mps] mps_dir to a directory oriond can write; sessions "
                    "time-slice the GPU without MPS", base, exc.strerror or exc)
        return None
    environment = {"CUDA_MPS_PIPE_DIRECTORY": str(pipes), "CUDA_MPS_LOG_DIRECTORY": str(logs),
                   "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(active_thread_percentage(vgpu_count))}
    started = not _answers(control, environment)
    if started:
        try:
            done = subprocess.run([control, "-d"], env=os.environ | environment, capture_output=True, text=True,
                                  timeout=30, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            done = subprocess.CompletedProcess([control], 1, "", str(exc))
        deadline, answering = time.monotonic() + START_S, False
        while done.returncode == 0 and not answering and time.monotonic() < deadline:
            answering = _answers(control, environment)
            time.sleep(0 if answering else 0.1)
        if not answering:
            why = (done.stderr or done.stdout).strip().splitlines()[-1:] or [f"see {logs}/control.log"]
            log.warning("MPS: %s -d did not start (%s); sessions time-slice the GPU without MPS", control, why[0])
            return None
    if export:
        os.environ.update(environment)  # before any session worker is forked: each one's cuInit connects to it
    log.info("MPS: session workers share the GPU through the control daemon in %s (%s), each with %s%% of the SMs",
             pipes, "started" if started else "already running", environment["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"])
    return MpsDaemon(environment, control, started)
