"""Runs inside the test guest (python3 of the guest image, this checkout on PYTHONPATH over 9p).

  wire_guest.py good  probe the region, then two probe processes at once (they must get distinct channels)
  wire_guest.py bad   probe every ivshmem device; print what each one says (they are broken on purpose)
Lines starting with WIRE- are what tests/guest/test_guest_wire.py reads.
"""
import subprocess
import sys

from guest_runtime.cli import main as orion_guest
from ivshmem.region import find_ivshmem_devices


def probe_process(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "guest_runtime.cli", "probe", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def good() -> int:
    rc = orion_guest(["probe", "--round-trips", "3000", "--bulk-mib", "8"])
    if rc:
        return rc
    procs = [probe_process("--round-trips", "300", "--bulk-mib", "1") for _ in range(2)]
    for proc in procs:
        out, _ = proc.communicate(timeout=120)
        channel = next((w.split("=")[1] for line in out.splitlines() if line.startswith("ORION-PROBE region=")
                        for w in line.split() if w.startswith("channel=")), "none")
        print(f"WIRE-CONCURRENT rc={proc.returncode} channel={channel}")
        if proc.returncode:
            print(out)
    return 0


def bad() -> int:
    devices = find_ivshmem_devices()
    print(f"WIRE-DEVICES {len(devices)}")
    for dev in devices:
        bdf = dev.rsplit("/", 1)[1]
        proc = probe_process("--region", bdf, "--round-trips", "10", "--bulk-mib", "1")
        out, _ = proc.communicate(timeout=120)
        print(f"WIRE-BAD {bdf} rc={proc.returncode} says: {out.strip()}")
    if not devices:
        proc = probe_process()
        out, _ = proc.communicate(timeout=120)
        print(f"WIRE-NONE rc={proc.returncode} says: {out.strip()}")
    return 0


if __name__ == "__main__":
    sys.exit({"good": good, "bad": bad}[sys.argv[1]]())
