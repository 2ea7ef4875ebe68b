"""Guest-side smoke test (run inside the VM by tests/guest/vm.py): reports the guest's Python version and the
ivshmem PCI devices (vendor 0x1af4, device 0x1110) it sees, then exits 0."""
import json
import platform
from pathlib import Path


def ivshmem_devices() -> list[str]:
    found = []
    for dev in sorted(Path("/sys/bus/pci/devices").iterdir()):
        try:
            ids = ((dev / "vendor").read_text().strip(), (dev / "device").read_text().strip())
        except OSError:
            continue
        if ids == ("0x1af4", "0x1110"):
            found.append(dev.name)
    return found


if __name__ == "__main__":
    devices = json.dumps(ivshmem_devices(), separators=(",", ":"))
    print(f"GUEST-SMOKE python={platform.python_version()} ivshmem_devices={devices}")
