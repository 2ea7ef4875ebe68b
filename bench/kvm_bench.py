#!/usr/bin/env python3
"""KVM benchmark: the ring's round trip and bulk rates from inside a libvirt guest, next to host-local. Not a test.

One run, one host agent (`oriond`, started here unless one runs), the same probe (`orion-guest probe`: NOP
round trips, then DRAIN/FILL bulk through the staging arenas) in two places:
* host-local: a host process on /dev/shm/orionsock<N> (made with `orion-shm create`);
* in-guest: a libvirt guest (TCG: KVM does not boot a stock kernel on our machines) started from
  `orion-domain render`, the region made by the qemu hook, the probe reaching it through the ivshmem BAR
  (tests/guest/libvirt_guest.py, the same path as the end-to-end tests).
The C wire client (guest_runtime/native/orion_wire.c, as the native guest driver uses it) is timed in both places
too, by bench/native_wire_bench.py's harness (timed in C: ECHO of 8 bytes and NOP), built here into build/ of the
checkout, which the guest sees through its share. Both sides also time their own interpreter (an empty loop step,
a perf_counter_ns call), which shows how much of the guest's round trip is TCG emulating Python rather than the
ring.
Results are checked (bench/verify.py): the probe compares the bytes of its ECHO, DRAIN and FILL calls itself and
fails otherwise (no figures, so no ratio); the C client compares each ECHO reply with its request and reports the
first wrong one, which must be the request on both sides, or its rows print no ratio; on the GPU machine, the
program's RESULT line forwarded (from the host and from the guest) must be the native one, or no ratio. A wrong
result prints a WRONG RESULT line, and the exit status is 1. NOP round trips carry no data.

Run as root after setup.sh: `.venv/bin/python bench/kvm_bench.py [--round-trips N] [--bulk-mib M]`.

On the GPU machine (`--gpu-machine`; no libvirt there): the guest is tests/gpu/gpu_guest.py's (QEMU from the bundle
of tests/gpu/build-guest-bundle.sh, TCG, 2 vCPUs, the host's root over 9p), the host agent a fresh oriond on a region
of its own, and one forwarded program (tests/gpu/programs/driver_program.py, on the Python capsule path) is timed
natively, forwarded from a host process and forwarded from inside the guest, whole process each.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.native_wire_bench import ECHO_REQUEST, harness_rows  # noqa: E402
from bench.verify import Checks  # noqa: E402
from host_agent.daemon import pidfile  # noqa: E402
from host_agent.server_conf import ShmSettings  # noqa: E402
from ivshmem.region import region_path  # noqa: E402
from tests.guest.cuda_guest import python_speed  # noqa: E402
from tests.guest.kvm_demo import free_index, start_agent, stop_agent  # noqa: E402
from tests.guest.libvirt_guest import LibvirtGuest, build_native_harness  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
PROBE = re.compile(r"round-trip n=(\d+) p50=([\d.]+)us p99=([\d.]+)us|to-host=(\d+)MB/s from-host=(\d+)MB/s")
SPEED = re.compile(r"KVM-PYTHON loop=(\d+)ns clock=(\d+)ns")
NATIVE = re.compile(r"KVM-NATIVE \S+ rc=0 echo (\d+) (\d+) \| nop (\d+) (\d+)")
ECHOED = re.compile(r"(?:^|\| )bytes echo (\w*)", re.M)  # the harness's report of its ECHO replies


def parse_probe(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for match in PROBE.finditer(text):
        if match.group(1):
            out.update(p50=float(match.group(2)), p99=float(match.group(3)))
        else:
            out.update(to_host=float(match.group(4)), from_host=float(match.group(5)))
    if len(out) != 4:
        raise SystemExit(f"kvm_bench: the probe did not print its figures:\n{text[-3000:]}")
    return out


def host_local(round_trips: int, bulk_mib: int, directory: str, harness: Path) -> tuple[dict[str, float], str | None]:
    """The host-local figures, and what the C client's ECHO calls got back (hex)."""
    index = free_index(directory)
    subprocess.run([sys.executable, "-m", "host_agent.admin.shm_cli", "create", "-i", str(index), "-s", "256"],
                   check=True, cwd=REPO, capture_output=True)
    try:
        pidfile.notify(pidfile.DEFAULT_PID_FILE)  # serve it now, not at the next rescan
        result = subprocess.run([sys.executable, "-m", "guest_runtime.cli", "probe", "--region",
                                 region_path(index, directory), "--round-trips", str(round_trips),
                                 "--bulk-mib", str(bulk_mib)], capture_output=True, text=True, cwd=REPO, timeout=300)
        if result.returncode:
            raise SystemExit(f"kvm_bench: host-local probe failed: {result.stderr.strip()}")
        native, echoed = harness_rows(harness, region_path(index, directory), str(round_trips))
        return {**parse_probe(result.stdout), "native_p50": native["nop"][0], "native_p99": native["nop"][1]}, echoed
    finally:
        subprocess.run([sys.executable, "-m", "host_agent.admin.shm_cli", "remove", str(index), "--force"], cwd=REPO,
                       capture_output=True)


def in_guest(round_trips: int, bulk_mib: int, directory: str,
             harness: Path) -> tuple[dict[str, float], tuple[float, float], str | None]:
    import libvirt

    conn = libvirt.open("qemu:///system")
    relative = str(harness.relative_to(REPO))
    with LibvirtGuest(conn, "tests/guest/cuda_guest.py", (str(round_trips), str(bulk_mib), relative), memory_mib=1024,
                      prefix="orion-bench-") as guest:
        guest.define([(free_index(directory), 256)])
        run = guest.run(900, progress=lambda line: print(line, file=sys.stderr, flush=True))
    if run.rc != 0 or not run.line("ORION-PROBE ok"):
        raise SystemExit(f"kvm_bench: the guest did not complete its probe:\n{run.serial[-3000:]}")
    speed, native = SPEED.search(run.serial), NATIVE.search(run.serial)
    if speed is None or native is None:
        raise SystemExit(f"kvm_bench: the guest did not time its interpreter or the C client:\n{run.serial[-3000:]}")
    figures = {**parse_probe(run.serial), "native_p50": int(native.group(3)) / 1e3,
               "native_p99": int(native.group(4)) / 1e3}
    echoed = ECHOED.search(native.string[native.start():].splitlines()[0])
    return figures, (float(speed.group(1)), float(speed.group(2))), echoed.group(1) if echoed else None


class GpuMachineRun(NamedTuple):
    local: dict[str, float]  # host-local figures
    guest: dict[str, float]  # in-guest figures
    speed: tuple[float, float]  # the guest's interpreter: loop step, perf_counter_ns (ns)
    seconds: dict[str, float]  # the program's whole process: native, host (forwarded), guest (forwarded)
    echoed: dict[str, str | None]  # what the C client's ECHO calls got back (hex): host, guest
    results: dict[str, str | None]  # the program's RESULT line (JSON): native, host, guest


def gpu_machine(round_trips: int, bulk_mib: int, harness: Path) -> GpuMachineRun:
    """The GPU machine's run: host-local and in-guest figures, the guest's interpreter speed, and the program's
    seconds and results natively, forwarded from a host process and forwarded from inside the guest."""
    import tempfile
    import time

    from tests.gpu.gpu_guest import boot_script, bundle_dir
    from tests.gpu.test_forwarded_programs import FORWARD, PROGRAMS, Oriond, _env

    program = str(PROGRAMS / "driver_program.py")

    results: dict[str, str | None] = {}

    def timed(name: str, command: list[str], env: dict[str, str]) -> float:
        started = time.monotonic()
        done = subprocess.run(command, cwd=REPO, env=env, check=True, capture_output=True, text=True, timeout=600)
        took = time.monotonic() - started
        results[name] = next((line[len("RESULT "):] for line in done.stdout.splitlines()
                              if line.startswith("RESULT ")), None)
        return took

    agent = Oriond(Path(tempfile.mkdtemp(prefix="orion-kvm-bench-")))
    shared = bundle_dir() / f"bench-{os.getpid()}"  # the guest sees this machine's files, not its /tmp
    try:
        region = str(agent.region)
        probe = subprocess.run([sys.executable, "-m", "guest_runtime.cli", "probe", "--region", region,
                                "--round-trips", str(round_trips), "--bulk-mib", str(bulk_mib)], capture_output=True,
                               text=True, cwd=REPO, timeout=300, env=_env())
        if probe.returncode:
            raise SystemExit(f"kvm_bench: host-local probe failed: {probe.stderr.strip()}")
        native, host_echoed = harness_rows(harness, region, str(round_trips))
        local = {**parse_probe(probe.stdout), "native_p50": native["nop"][0], "native_p99": native["nop"][1]}
        seconds = {"native": timed("native", [sys.executable, program], _env()),
                   "host": timed("host", [sys.executable, "-c", FORWARD, program],
                                 _env(ORION_SHM=region, CUDA_VISIBLE_DEVICES=""))}
        shared.mkdir()
        runs = [{"name": "probe", "raw": True, "env": {}, "argv": ["-m", "guest_runtime.cli", "probe", "--region",
                                                                    "{bdf}", "--round-trips", str(round_trips),
                                                                    "--bulk-mib", str(bulk_mib)]},
                {"name": "speed", "raw": True, "env": {},
                 "argv": ["-c", "from tests.guest.cuda_guest import python_speed; print('SPEED', *python_speed())"]},
                {"name": "harness", "raw": True, "env": {}, "argv": [
                    "-c", "import subprocess, sys; sys.exit(subprocess.call(sys.argv[1:]))", str(harness), "{bdf}",
                    str(round_trips)]},
                {"name": "program", "env": {"ORION_NATIVE": "0"}, "argv": ["-c", FORWARD, program]}]
        (shared / "job.json").write_text(json.dumps({"env": {"PYTHONPATH": str(REPO)}, "runs": runs}))
        run = boot_script(REPO / "tests/gpu/in_guest.py", [str(shared / "job.json")], regions=[(region, 256)],
                          timeout=580)
    finally:
        agent.stop()
        shutil.rmtree(shared, ignore_errors=True)
    said = "\n".join(line.split(" ", 2)[2] for line in run.lines("GUEST-SAID "))
    took = run.line("GUEST-TIME program")
    speed = re.search(r"SPEED ([\d.]+) ([\d.]+)", said)
    nop = re.search(r"^nop (\d+) (\d+)", said, re.M)
    if run.rc != 0 or took is None or speed is None or nop is None:
        raise SystemExit(f"kvm_bench: the guest run failed:\n{run.serial[-3000:]}")
    guest = {**parse_probe(said), "native_p50": int(nop.group(1)) / 1e3, "native_p99": int(nop.group(2)) / 1e3}
    seconds["guest"] = float(took.split()[2])
    result = run.line("GUEST-RESULT program ")
    results["guest"] = result.split(" ", 2)[2] if result else None
    echoed = ECHOED.search(said)
    return GpuMachineRun(local, guest, (float(speed.group(1)), float(speed.group(2))), seconds,
                         {"host": host_echoed, "guest": echoed.group(1) if echoed else None}, results)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--round-trips", type=int, default=20000)
    parser.add_argument("--bulk-mib", type=int, default=32)
    parser.add_argument("--gpu-machine", action="store_true", help="the GPU machine's guest (no libvirt there)")
    args = parser.parse_args()
    harness = REPO / build_native_harness()
    seconds: dict[str, float] = {}
    results: dict[str, str | None] = {}
    if args.gpu_machine:
        machine = gpu_machine(args.round_trips, args.bulk_mib, harness)
        local, guest, (guest_loop, guest_clock), seconds = machine.local, machine.guest, machine.speed, machine.seconds
        echoed, results = machine.echoed, machine.results
        where = "QEMU from the bundle (TCG), 2 vCPUs, the host's root over 9p"
    else:
        directory = ShmSettings.load().path_base
        agent = start_agent()
        try:
            local, host_echoed = host_local(args.round_trips, args.bulk_mib, directory, harness)
            guest, (guest_loop, guest_clock), guest_echoed = in_guest(args.round_trips, args.bulk_mib, directory,
                                                                      harness)
        finally:
            stop_agent(agent)
        echoed = {"host": host_echoed, "guest": guest_echoed}
        where = "libvirt domain type qemu (TCG), 1 vCPU"
    checks = Checks()
    c_right = all([checks.same(f"C client ECHO, {side}", ECHO_REQUEST.hex(), got, "its request")
                   for side, got in echoed.items()])
    host_loop, host_clock = python_speed()
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.machine())
    print(f"\nKVM benchmark, {datetime.datetime.now():%Y-%m-%d %H:%M}, {cpu}, {os.cpu_count()} cores; guest: {where}; "
          f"{args.round_trips} round trips, {args.bulk_mib} MiB bulk each way")
    print(f"{'':24}{'host-local':>12}{'in-guest':>12}{'guest/host':>12}")
    rows = [("round trip p50 (us)", "p50"), ("round trip p99 (us)", "p99"),
            ("C client p50 (us)", "native_p50"), ("C client p99 (us)", "native_p99"),
            ("bulk to host (MB/s)", "to_host"), ("bulk from host (MB/s)", "from_host")]
    for label, key in rows:
        ratio = f"{guest[key] / local[key]:>11.2f}x" if c_right or not key.startswith("native") else f"{'WRONG':>12}"
        print(f"{label:24}{local[key]:>12.2f}{guest[key]:>12.2f}{ratio}")
    print(f"{'python loop step (ns)':24}{host_loop:>12.0f}{guest_loop:>12.0f}{guest_loop / host_loop:>11.2f}x")
    print(f"{'perf_counter_ns (ns)':24}{host_clock:>12.0f}{guest_clock:>12.0f}{guest_clock / host_clock:>11.2f}x")
    if seconds:
        right = all([checks.same(f"driver_program.py's results, forwarded from the {side}", results["native"],
                                 results[side]) for side in ("host", "guest")])
        ratio = f"{seconds['guest'] / seconds['native']:.1f}x native" if right else "WRONG"
        print(f"driver_program.py, whole process: native {seconds['native']:.1f} s, forwarded from the host "
              f"{seconds['host']:.1f} s, forwarded in the guest {seconds['guest']:.1f} s ({ratio})")
    return checks.exit_status()


if __name__ == "__main__":
    sys.exit(main())
