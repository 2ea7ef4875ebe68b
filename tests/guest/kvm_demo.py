"""The README's main job: a libvirt guest (TCG) whose CUDA program reaches the host agent through ivshmem.

    sudo ./setup.sh                      # installs everything, then runs this
    sudo .venv/bin/python -m tests.guest.kvm_demo     # again, later

What it does, each step through the real component a user would use (and says so as it goes):
1. makes sure `oriond` runs (starts it with the system pid file, which the qemu hook wakes, unless one runs);
2. `orion-domain render` writes the domain XML (kernel and disk of the test guest image, one region), and
   libvirt defines it; `virDomainCreate` runs the installed qemu hook, which creates the region;
3. inside the guest, the checkout's runtime (installed there as a .pth hook) finds the ivshmem device by
   itself: `orion-guest probe` prints the ring's round trip and bulk rates, and an unmodified cuda-python
   program calls cuInit: CUDA_ERROR_NO_DEVICE on a host without a GPU, the device's name on one with a GPU;
4. the guest powers off, the release hook removes the region; the domain is undefined, and an oriond the
   demo started is stopped. Exit status 0 only if the guest reached the agent.
Needs: setup.sh done (hook installed, libvirtd running) and the guest image (tests/guest/build-image.sh).
"""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from host_agent.daemon import pidfile
from host_agent.server_conf import ShmSettings
from ivshmem.region import region_path
from tests.processes import stop_process

from .libvirt_guest import LibvirtGuest, LibvirtGuestError, start_system_agent

REPO = Path(__file__).resolve().parents[2]
REGION_MIB = 64
AGENT_LOG = Path("/var/log/orion/kvm-demo-oriond.log")
GUEST_LINES = ("KVM-DEVICES", "ORION-PROBE", "CUDA-PROGRAM", "KVM-CUDA")


def say(text: str) -> None:
    print(f"   {text}", flush=True)


def start_agent() -> subprocess.Popen[bytes] | None:
    """Start oriond unless one runs; None when one was already running."""
    running = pidfile.running_agent(pidfile.DEFAULT_PID_FILE)
    if running is not None:
        say(f"oriond already runs (pid {running}); using it")
        return None
    AGENT_LOG.parent.mkdir(parents=True, exist_ok=True)
    agent = start_system_agent(AGENT_LOG)
    say(f"started oriond (pid {agent.pid}, log {AGENT_LOG})")
    return agent


def stop_agent(agent: subprocess.Popen[bytes] | None) -> None:
    if agent is not None:
        say(f"stopped the oriond it started (exit {stop_process(agent)})")


def free_index(directory: str) -> int:
    return next(i for i in range(10000) if not Path(region_path(i, directory)).exists())


def main() -> int:
    import libvirt

    libvirt.registerErrorHandler(lambda _ctx, _err: None, None)
    print("\n== KVM demo: a libvirt guest (TCG) reaching the host agent through an ivshmem region", flush=True)
    status = subprocess.run([sys.executable, "-m", "libvirt_hooks.cli", "status"], capture_output=True, text=True,
                            cwd=REPO, timeout=60)
    if status.returncode:
        print(f"kvm-demo: the Orion qemu hook is not active; run ./setup.sh first:\n{status.stdout}",
              file=sys.stderr)
        return 1
    try:
        conn = libvirt.open("qemu:///system")
    except libvirt.libvirtError as exc:
        print(f"kvm-demo: libvirtd does not answer ({exc}); run ./setup.sh, which starts it", file=sys.stderr)
        return 1
    directory = ShmSettings.load().path_base
    index = free_index(directory)
    region = Path(region_path(index, directory))
    t0 = time.monotonic()
    try:
        agent = start_agent()
    except LibvirtGuestError as exc:
        print(f"kvm-demo: {exc}", file=sys.stderr)
        return 1
    try:
        with LibvirtGuest(conn, "tests/guest/cuda_guest.py", ("2000", "8"), prefix="orion-demo-") as guest:
            guest.define([(index, REGION_MIB)])
            say(f"defined domain {guest.name} from `orion-domain render` (region {region}, {REGION_MIB} MiB, TCG)")
            seen: list[str] = []
            run = guest.run(300, on_start=lambda _dom: seen.append(
                f"prepare hook made {region}" if region.exists() else f"{region} missing after start"),
                progress=say)
            say(f"libvirt started it; {seen[0]}" if seen else "libvirt started it")
            for line in run.serial.splitlines():
                if line.startswith(GUEST_LINES):
                    say(f"guest | {line.rstrip()}")
            deadline = time.monotonic() + 20
            while region.exists() and time.monotonic() < deadline:
                time.sleep(0.1)
            say(f"guest powered off; release hook {'kept' if region.exists() else 'removed'} {region}")
    except (LibvirtGuestError, libvirt.libvirtError) as exc:
        print(f"kvm-demo: {exc}", file=sys.stderr)
        return 1
    finally:
        stop_agent(agent)
    reached = run.rc == 0 and bool(run.line("ORION-PROBE ok")) and bool(run.line("CUDA-PROGRAM"))
    say(f"{'done' if reached else 'FAILED'} in {time.monotonic() - t0:.0f} s")
    if not reached:
        print(run.serial[-3000:], file=sys.stderr)
    return 0 if reached else 1


if __name__ == "__main__":
    sys.exit(main())
