"""Runs inside a libvirt test guest (tests/guest/libvirt_guest.py boots it; init.sh starts this as PID 1's job).

First it installs this checkout's guest runtime the way `pip install orion-guest` leaves it: one .pth file in
the guest's site directory puts the share (and the cuda-python bundled under site/) on sys.path, then runs
orion-guest's autoload hook. Then, for what the host end of the test reads:

  KVM-PYTHON loop=<ns> clock=<ns>     this interpreter's speed here (one loop step, one perf_counter_ns call):
                                      under TCG every Python step is emulated, which bounds the round trip
  KVM-DEVICES <n> <bdf>...            the ivshmem devices the guest's PCI bus shows
  KVM-PROBE <bdf> rc=<rc> <line>      `orion-guest probe --region <bdf>` on each (its ORION-PROBE lines follow)
  KVM-NATIVE <bdf> rc=<rc> <lines>    with a third argument, the C wire client's round trips through the same BAR
                                      (bench/kvm_bench.py builds that harness in the share): "echo|nop P50 P99" ns
  CUDA-PROGRAM init=... / KVM-CUDA rc=<rc> stderr=<what the runtime said>
                                      the unmodified program cuda_program.py, with ORION_VGPU=1 as Orion's
                                      users set it; the runtime finds the ivshmem device by itself
Usage: cuda_guest.py [ROUND_TRIPS [BULK_MIB [NATIVE_HARNESS]]]   (probe sizes; defaults 2000 and 8; the harness's
path relative to the share)
Every child is bounded by a timeout, so the guest always reaches its power-off.
"""
import os
import subprocess
import sys
import sysconfig
import time

SHARE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHILD_TIMEOUT_S = 240


def install_runtime() -> None:
    site_dir = sysconfig.get_paths()["purelib"]  # /usr/local/lib/python3.11/dist-packages on Debian
    os.makedirs(site_dir, exist_ok=True)
    with open(os.path.join(SHARE, "guest_runtime", "orion_guest.pth")) as hook:
        autoload = hook.read()
    with open(os.path.join(site_dir, "orion_guest.pth"), "w") as pth:
        pth.write(f"{SHARE}\n{os.path.join(SHARE, 'site')}\n{autoload}")


def run(argv: list, env: dict | None = None) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # only what the .pth gives
    environment.update(env or {})
    try:
        return subprocess.run(argv, env=environment, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        return subprocess.CompletedProcess(argv, 124, exc.stdout or "", f"timed out after {CHILD_TIMEOUT_S} s")


def python_speed(steps: int = 20000) -> tuple[float, float]:
    """(ns per empty loop step, ns per perf_counter_ns call) of this interpreter on this (virtual) CPU."""
    clock = time.perf_counter_ns
    start = clock()
    for _ in range(steps):
        pass
    loop = (clock() - start) / steps
    start = clock()
    for _ in range(steps):
        clock()
    return loop, (clock() - start) / steps - loop


def one_line(text: str) -> str:
    return " | ".join(line.strip() for line in text.strip().splitlines()) or "-"


def main() -> int:
    given, defaults = sys.argv[1:4], ["2000", "8", ""]
    round_trips, bulk_mib, native = given + defaults[len(given):]
    install_runtime()
    loop_ns, clock_ns = python_speed()
    print(f"KVM-PYTHON loop={loop_ns:.0f}ns clock={clock_ns:.0f}ns", flush=True)
    from ivshmem.region import find_ivshmem_devices

    devices = [path.rsplit("/", 1)[1] for path in find_ivshmem_devices()]
    print(f"KVM-DEVICES {len(devices)} {' '.join(devices)}".rstrip(), flush=True)
    for bdf in devices:
        probe = run([sys.executable, "-m", "guest_runtime.cli", "probe", "--region", bdf,
                     "--round-trips", round_trips, "--bulk-mib", bulk_mib])
        print(f"KVM-PROBE {bdf} rc={probe.returncode} {one_line(probe.stderr)}", flush=True)
        sys.stdout.write(probe.stdout)
        if native:
            timed = run([os.path.join(SHARE, native), bdf, round_trips])
            print(f"KVM-NATIVE {bdf} rc={timed.returncode} {one_line(timed.stdout)} {one_line(timed.stderr)}",
                  flush=True)
    program = run([sys.executable, os.path.join(SHARE, "tests", "guest", "cuda_program.py")], {"ORION_VGPU": "1"})
    sys.stdout.write(program.stdout)
    print(f"KVM-CUDA rc={program.returncode} stderr={one_line(program.stderr)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
