"""This host's GPUs as the controller wants them: uuid, name and total memory of each, read with cuda-python.

oriond registers this list with the Orion Controller (controller_link.py). A host without libcuda or without a
GPU has nothing to register; ``read()`` then returns no GPUs and the reason, for one log line.

For tests only: ``ORION_TEST_GPU_INVENTORY`` names a JSON file ``[{"uuid", "name", "memory_mib"}, ...]`` used
instead of the driver, so that a real oriond on a machine without a GPU (CI) can register a made-up inventory.
It is not a deployment setting.
"""
from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass
from typing import Any

from ..errors import UnavailableError

TEST_INVENTORY_ENV = "ORION_TEST_GPU_INVENTORY"
INVENTORY_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class GpuInfo:
    index: int
    uuid: str
    name: str
    memory_mib: int

    def as_json(self) -> dict[str, Any]:
        return {"index": self.index, "uuid": self.uuid, "name": self.name, "memory_mib": self.memory_mib}


class InventoryError(UnavailableError):
    """The test inventory file is unreadable or malformed (one line saying which and how)."""


def _uuid_text(raw: bytes) -> str:
    """nvidia-smi's spelling of a CUDA device UUID: ``GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx``."""
    h = raw.hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def _from_driver() -> tuple[list[GpuInfo], str]:
    try:
        from cuda.bindings import driver
        (err,) = driver.cuInit(0)
    except (ImportError, RuntimeError, OSError) as exc:  # no cuda-python, or no libcuda (DynamicLibNotFound)
        return [], f"no CUDA driver on this host ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})"
    if int(err) != 0:
        return [], f"cuInit failed with {err}"
    gpus = of_driver(driver)
    return gpus, "" if gpus else "the CUDA driver sees no GPU"


def of_driver(driver: Any) -> list[GpuInfo]:
    """The GPUs an initialised cuda.bindings.driver (or a stand-in with its API) sees."""
    err, count = driver.cuDeviceGetCount()
    gpus = []
    for ordinal in range(count if int(err) == 0 else 0):
        _, device = driver.cuDeviceGet(ordinal)
        _, name = driver.cuDeviceGetName(256, device)
        _, uuid = driver.cuDeviceGetUuid(device)
        _, total = driver.cuDeviceTotalMem(device)
        gpus.append(GpuInfo(ordinal, _uuid_text(bytes(uuid.bytes)[:16]),
                            bytes(name).split(b"\0", 1)[0].decode(errors="replace"), int(total) // (1 << 20)))
    return gpus


def _from_file(path: str) -> list[GpuInfo]:
    try:
        with open(path, encoding="utf-8") as f:
            items = json.load(f)
    except (OSError, ValueError) as exc:
        raise InventoryError(f"{TEST_INVENTORY_ENV}={path}: cannot read a JSON inventory ({exc})") from None
    if not isinstance(items, list):
        raise InventoryError(f"{TEST_INVENTORY_ENV}={path}: expected a JSON list of {{uuid, name, memory_mib}}")
    gpus = []
    for i, item in enumerate(items):
        try:
            gpus.append(GpuInfo(int(item.get("index", i)), str(item["uuid"]), str(item["name"]),
                                int(item["memory_mib"])))
        except (AttributeError, KeyError, TypeError, ValueError):
            raise InventoryError(f"{TEST_INVENTORY_ENV}={path}: item {i} needs uuid, name and memory_mib "
                                 f"(integer MiB)") from None
    return gpus


@functools.cache
def _from_driver_process() -> tuple[list[GpuInfo], str]:
    """The driver's inventory, read in a child interpreter, once per process (oriond asks at start, to check
    --devices and to register with the controller). oriond forks a worker per session, and CUDA does not
    survive a fork: a parent that had called cuInit leaves every worker's cuInit failing with
    CUDA_ERROR_NOT_INITIALIZED. So the process that serves regions must never initialise CUDA itself."""
    try:
        done = subprocess.run([sys.executable, "-m", __name__], capture_output=True, text=True,
                              timeout=INVENTORY_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        return [], f"reading the GPU inventory took more than {INVENTORY_TIMEOUT_S} s (is the driver hung?)"
    except OSError as exc:
        return [], f"could not start {sys.executable} to read the GPU inventory ({exc})"
    try:
        answer = json.loads(done.stdout)
        return [GpuInfo(**g) for g in answer["gpus"]], str(answer["why"])
    except (ValueError, KeyError, TypeError):
        detail = (done.stderr.strip().splitlines() or ["it printed nothing"])[-1]
        return [], f"could not read the GPU inventory ({detail})"


def read() -> tuple[list[GpuInfo], str]:
    """(GPUs, why there are none): the test inventory if ORION_TEST_GPU_INVENTORY is set, else the driver's,
    read in a child process so that this one stays free of CUDA (see _from_driver_process)."""
    path = os.environ.get(TEST_INVENTORY_ENV)
    if path:
        gpus = _from_file(path)
        return gpus, "" if gpus else f"the test inventory {path} lists no GPU"
    return _from_driver_process()


if __name__ == "__main__":  # the child of _from_driver_process: one JSON object on stdout
    found, why = _from_driver()
    print(json.dumps({"gpus": [asdict(g) for g in found], "why": why}))
