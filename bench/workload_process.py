"""How a benchmark runs one workload in a process of its own, natively or on the native guest driver against an
oriond: the driver and the oriond of the run (`forwarding`), the process's command line and environment
(`command`), and its RESULT line (`result_of`, `run`). Shared by bench/framework_bench.py, inference_bench.py and
tenants_bench.py; what the workload does, and how it is timed and checked, is each benchmark's own."""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
# First in a forwarded workload's code: the native guest driver (the argument after the code) loaded before anything
# opens the CUDA driver, as the start-up hook loads it.
LOAD = "import sys; from guest_runtime.startup import load_native; load_native(sys.argv[1])\n"
Forwarded = tuple[Path, Path]  # an oriond's region, and the native guest driver to load


@contextlib.contextmanager
def forwarding(vgpu_count: int = 1, mps: bool = False, relayed: bool = False,
               region_mib: int = 256) -> Iterator[Forwarded]:
    """For the run: the native guest driver, built, and an oriond serving a region of its own of `region_mib` MiB
    (its GPU carved into `vgpu_count` vGPUs; `mps`: its session workers under NVIDIA MPS, host_agent/daemon/mps.py;
    `relayed`: a second oriond serves the region and relays every session over TCP loopback to the first,
    docs/remote.md); stopped after."""
    from guest_runtime.native.build import build_driver
    from tests.gpu.test_forwarded_programs import Oriond

    with tempfile.TemporaryDirectory() as tmp:
        library = build_driver(Path(tmp) / "libcuda.so.1")
        sections = f"[server-mps]\n    enable_mps = true\n    mps_dir = {tmp}/mps\n" if mps else ""
        agent = Oriond(Path(tmp), vgpu_count=vgpu_count, sections=sections, region_mib=region_mib)
        relay = Oriond(Path(tmp) / "relay", relay_to=f"127.0.0.1:{agent.listen_port}",
                       region_mib=region_mib) if relayed else None
        try:
            yield (relay or agent).region, library
        finally:
            if relay is not None:
                relay.stop()
            agent.stop()
        said = agent.log.read_text(errors="replace")
        if mps and "session workers share the GPU" not in said:  # a measurement without MPS must not pass for one
            why = [line for line in said.splitlines() if "MPS" in line] or ["no MPS line in oriond's log"]
            raise RuntimeError(f"oriond ran without MPS: {why[-1]}")


def command(code: str, forwarded: Forwarded | None) -> tuple[list[str], dict[str, str]]:
    """The command line and environment of a process running `code`: natively (`forwarded` None), or on the native
    guest driver talking to the oriond of `forwarded`. None of the caller's Orion variables are passed on."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORION_")} | {"PYTHONPATH": str(REPO)}
    if forwarded is None:
        return [sys.executable, "-c", code], env
    region, library = forwarded
    return [sys.executable, "-c", LOAD + code, str(library)], env | {
        "ORION_SHM": str(region), "ORION_NATIVE": "1", "ORION_NATIVE_LIB": str(library)}


def result_of(stdout: str) -> dict[str, Any] | None:
    """The workload's `RESULT {json}` line, read; None when it printed none."""
    line = next((text for text in stdout.splitlines() if text.startswith("RESULT ")), None)
    return json.loads(line[len("RESULT "):]) if line is not None else None


def run(name: str, code: str, forwarded: Forwarded | None, timeout_s: float,
        env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run workload `name` once (with `env` added) and return its RESULT; RuntimeError with its stderr's end."""
    argv, base = command(code, forwarded)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, env=base | (env or {}), cwd=REPO)
    result = result_of(done.stdout)
    if done.returncode != 0 or result is None:
        raise RuntimeError(f"{name} failed: {done.stderr[-1500:]}")
    return result


def why(exc: BaseException) -> str:
    """A failed workload's reason in one line: the last line of its error (its stderr's end), for a FAILED row."""
    text = str(exc)
    return text.splitlines()[-1] if text.strip() else repr(exc)
