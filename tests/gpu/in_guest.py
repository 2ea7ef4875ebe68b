"""Runs inside the GPU machine's test guest (tests/gpu/gpu_guest.py boots it; the root is the host's own, read-only).

Argument: a job file the host wrote (JSON: "env", what every process gets besides the guest's own environment;
"runs", each {"name", "argv": the interpreter's arguments ("{bdf}" stands for the region's PCI address), "env":
more, "raw": optional}: a tests/gpu program started forwarded, on the Python capsule path or the native guest driver,
as the host's own tests start it, or for bench/kvm_bench.py a probe whose every line it wants, `raw`). Printed, for
the host's test to read:

  GUEST-NVIDIA <paths>|none     the /dev/nvidia* nodes the guest has (none: it cannot reach the GPU directly)
  GUEST-IVSHMEM <n>             the ivshmem-plain devices on its PCI bus (the Orion regions)
  GUEST-NATIVE <CUresult>       cuInit of the host's own driver library, without Orion: not CUDA_SUCCESS here
  GUEST-RESULT <name> <json>    a run's RESULT line (ORION_VGPU=1: the runtime finds the ivshmem device itself)
  GUEST-SAID <name> <line>      its other lines that start with REAL_LIBCUDA (which libraries it mapped); a raw
                                run's every line
  GUEST-TIME <name> <s>         its wall time in the guest
  GUEST-FAILED <name> rc=<rc> <stderr's tail>
Every child has a timeout, so the guest always reaches its power-off.
"""
import glob
import json
import os
import subprocess
import sys
import time

NATIVE = "from cuda.bindings import driver; print(int(driver.cuInit(0)[0]))"
CHILD_TIMEOUT_S = 400


def ivshmem_devices() -> list:
    found = []
    for device in sorted(glob.glob("/sys/bus/pci/devices/*")):
        with open(f"{device}/vendor") as vendor, open(f"{device}/device") as product:
            if (vendor.read().strip(), product.read().strip()) == ("0x1af4", "0x1110"):
                found.append(os.path.basename(device))
    return found


def main() -> int:
    with open(sys.argv[1]) as f:
        job = json.load(f)
    env = {**os.environ, **job["env"]}
    print("GUEST-NVIDIA", " ".join(sorted(glob.glob("/dev/nvidia*"))) or "none", flush=True)
    devices = ivshmem_devices()
    print("GUEST-IVSHMEM", len(devices), flush=True)
    native = subprocess.run([sys.executable, "-c", NATIVE], env=env, capture_output=True, text=True,
                            timeout=CHILD_TIMEOUT_S)
    print("GUEST-NATIVE", native.stdout.strip() or f"failed: {native.stderr.strip()[-300:]}", flush=True)
    failed = 0
    for entry in job["runs"]:
        name = entry["name"]
        started = time.monotonic()
        try:
            argv = [a.replace("{bdf}", devices[0] if devices else "none") for a in entry["argv"]]
            run = subprocess.run([sys.executable, *argv], env={**env, "ORION_VGPU": "1", **entry["env"]},
                                 capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            print(f"GUEST-FAILED {name} rc=timeout after {CHILD_TIMEOUT_S} s", flush=True)
            failed += 1
            continue
        line = next((text for text in run.stdout.splitlines() if text.startswith("RESULT ")), None)
        if entry.get("raw") and not run.returncode:
            line = "RESULT {}"
        if run.returncode or line is None:
            tail = (run.stdout[-500:] + run.stderr[-1500:]).replace("\n", " | ")
            print(f"GUEST-FAILED {name} rc={run.returncode} {tail}", flush=True)
            failed += 1
            continue
        print(f"GUEST-RESULT {name} {line[len('RESULT '):]}", flush=True)
        for said in run.stdout.splitlines():
            if said.startswith("REAL_LIBCUDA") or entry.get("raw"):
                print(f"GUEST-SAID {name} {said}", flush=True)
        print(f"GUEST-TIME {name} {time.monotonic() - started:.1f} s", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
