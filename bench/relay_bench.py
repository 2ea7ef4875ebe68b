#!/usr/bin/env python3
"""Relayed sessions over TCP loopback (docs/remote.md), next to a local region and native, with a raw-socket
baseline measured in the same run. GPU machine only.

Starts two orionds on this host: the GPU host's (it serves a region of its own, for the local column, and takes
relayed sessions on its listen_port) and a relaying one (`[server-relay] remote_addr` = the first's port), whose
region the relayed column's program uses. Each column is bench/cuda_bench.py's measure() in a child process on the
native guest driver (native: the machine's libcuda), bulk rows at SIZES_MIB. The baseline is two fresh processes on
the same loopback: a 32-byte ping-pong (the round trip a synchronous relayed call adds) and a 256 MiB stream in
1 MiB writes (what bulk copies can reach), from and into one reused 1 MiB buffer (cache-hot: the best a socket
does), and once more from and into 256 MiB buffers (as a copy's bytes come from and land in memory of the copy's
size). Printed: each measure
per column, relayed/local and relayed/native, and the issue's aims:
- a synchronous call costs at most local + one raw round trip (launch+sync, 4-byte copies, pageable and pinned);
- bulk relayed >= 0.8x the raw stream, page-locked >= 0.9x (the reused buffer's stream; the ratio to the
  whole-buffer stream is printed too);
- async launches pipelined (relayed async launch close to local: no round trip per launch).

Every call's status is checked: a row whose calls failed (a copy the relay refuses, say) prints as refused with the
status, never as a speed. So is every result (bench/cuda_bench.measure, bench/verify.py): a copy row's bytes read
back after the timed copies must be its source's in the native run and the native run's in the local and relayed
ones, the workload's data the native run's bit for bit; a wrong one prints a WRONG RESULT line and no ratio or aim
for it, and the exit status is 1 (a relayed small page-locked read that returned zeros with CUDA_SUCCESS went
unnoticed before, issue 26). Bulk rows go up to 512 MiB: a relayed copy is carried in pieces, so any size a local
session takes is relayed too.

Run: python3 bench/relay_bench.py   (from the repository root)
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.cuda_bench import child, right_results  # noqa: E402
from bench.verify import Checks  # noqa: E402

SIZES_MIB = (64, 256, 512)


RAW_SERVER = r"""
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
buf = bytearray(1 << 20)
whole = memoryview(bytearray(b"w") * (256 << 20)) if sys.argv[2] == "whole" else None  # written: its pages are in
while True:  # echo 32-byte pings until 32 'S', then sink everything until the peer closes
    n = s.recv_into(memoryview(buf)[:32], 32, socket.MSG_WAITALL)
    if n < 32 or buf[:32] == b"S" * 32:
        break
    s.sendall(memoryview(buf)[:32])
total = 0
while True:  # into one reused 1 MiB buffer, or through a buffer of the stream's size as a copy's destination is
    n = s.recv_into(buf if whole is None else whole[total % len(whole):][:1 << 20])
    if n == 0:
        break
    total += n
"""


def raw_baseline(whole: bool = False) -> dict[str, float]:
    """Round trip (us, median of 5 x 5000) and stream bandwidth (GB/s) between this process and a fresh one: 256 MiB
    in 1 MiB writes, from and into one reused 1 MiB buffer, or (`whole`) from and into buffers of 256 MiB, as a
    copy's bytes come from and go to memory of the copy's size (pages already in)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    far = subprocess.Popen([sys.executable, "-c", RAW_SERVER, str(listener.getsockname()[1]),
                            "whole" if whole else "reused"])
    conn, _ = listener.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    ping, back = b"p" * 32, bytearray(32)
    samples = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(5000):
            conn.sendall(ping)
            conn.recv_into(back, 32, socket.MSG_WAITALL)
        samples.append((time.perf_counter() - start) / 5000 * 1e6)
    conn.sendall(b"S" * 32)
    source = memoryview(bytearray(b"s") * ((256 if whole else 1) << 20))
    start = time.perf_counter()
    for i in range(256):
        conn.sendall(source[(i << 20) % len(source):][:1 << 20])
    conn.shutdown(socket.SHUT_WR)
    far.wait(60)
    seconds = time.perf_counter() - start
    conn.close()
    listener.close()
    return {"round trip us": sorted(samples)[2], "stream GB/s": (256 << 20) / seconds / 1e9}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _oriond(work: Path, name: str, port: int, relay_to: str = "") -> tuple[subprocess.Popen[bytes], str]:
    from controller.cluster_key import make_key_file
    from host_agent.shm_admin import create

    shm = work / name
    shm.mkdir()
    region = create(0, 4096, str(shm), channels=2).path  # a 512 MiB page-locked buffer fits a channel's slice
    conf = shm / "server.conf"
    key = work / "cluster.key"  # both orionds are members of one cluster (docs/security.md)
    if not key.exists():
        make_key_file(key)
    conf.write_text(f"[server]\n    vgpu_count = 1\n    listen_port = {port}\n"
                    f'[server-shm]\n    shm_path_base = "{shm}/"\n[cluster]\n    key_file = {key}\n'
                    + (f"[server-relay]\n    remote_addr = {relay_to}\n" if relay_to else ""))
    log = open(shm / "oriond.log", "wb")  # noqa: SIM115 - the process keeps it
    agent = subprocess.Popen([sys.executable, "-m", "host_agent.daemon.oriond", "--config", str(conf), "--pid-file",
                              str(shm / "oriond.pid")], cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while b"Using SHM" not in (shm / "oriond.log").read_bytes():
        if agent.poll() is not None or time.monotonic() > deadline:
            raise SystemExit((shm / "oriond.log").read_text())
        time.sleep(0.1)
    return agent, region


def main() -> int:
    from guest_runtime.native.build import build_driver

    with tempfile.TemporaryDirectory(dir="/dev/shm") as tmp:  # tmpfs: the pool's pages can be page-locked
        work = Path(tmp)
        library = str(build_driver(work / "native" / "libcuda.so.1"))
        port = _free_port()
        gpu, local_region = _oriond(work, "gpu-host", port)
        relay, relay_region = _oriond(work, "relay-host", _free_port(), f"127.0.0.1:{port}")
        try:
            raw = raw_baseline()
            native = child("native", None, "", SIZES_MIB)
            local = child("native-lib", local_region, library, SIZES_MIB)
            relayed = child("native-lib", relay_region, library, SIZES_MIB)
            raw_after = raw_baseline()
            raw_whole = raw_baseline(whole=True)
        finally:
            for agent in (relay, gpu):
                agent.send_signal(signal.SIGINT)
                agent.wait(20)
    rtt = min(raw["round trip us"], raw_after["round trip us"])
    stream = max(raw["stream GB/s"], raw_after["stream GB/s"])
    whole = raw_whole["stream GB/s"]
    print(f"# relay benchmark (TCP loopback), {time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} CPUs")
    print(f"# raw loopback: round trip {raw['round trip us']:.2f} / {raw_after['round trip us']:.2f} us, "
          f"stream {raw['stream GB/s']:.2f} / {raw_after['stream GB/s']:.2f} GB/s (before / after), "
          f"{whole:.2f} GB/s between 256 MiB buffers")
    print(f"{'measure':<26} {'native':>9} {'local':>9} {'relayed':>9} {'rel/local':>9} {'rel/nat':>8}  aim")
    checks = Checks()
    for key, value in native["rows"].items():
        here, there = local["rows"][key], relayed["rows"][key]
        if isinstance(value, str) or isinstance(here, str) or isinstance(there, str):
            print(f"{key:<26} {value!s:>9} {here!s:>9} {there!s:>9}  (a failed status: no speed)")
            continue
        right = right_results(checks, key, {"native": native, "local": local, "relayed": relayed})
        if not (right["local"] and right["relayed"]):
            rel_nat = f"{there / value:8.2f}" if right["relayed"] else f"{'WRONG':>8}"
            print(f"{key:<26} {value:9.2f} {here:9.2f} {there:9.2f} {'WRONG':>9} {rel_nat}  (a wrong result: no aim)")
            continue
        aim = ""
        if key in ("launch+sync us", "4-byte HtoD us", "4-byte DtoH us", "pinned 4-byte HtoD us",
                   "pinned 4-byte DtoH us"):
            aim = f"<= local + raw RTT = {here + rtt:.2f}: {'met' if there <= here + rtt else 'not met'}"
        elif key == "async launch us":
            pipelined = "yes" if there < here + rtt else "no"
            aim = f"pipelined: {pipelined} (a round trip each would be {here + rtt:.2f})"
        elif "GB/s" in key:  # issue 30's aim for page-locked bulk, issue 14's for pageable
            floor = 0.9 if key.startswith("pinned") else 0.8
            aim = (f">= {floor} x raw stream: {there / stream:.2f}x, {'met' if there >= floor * stream else 'not met'} "
                   f"({there / whole:.2f}x between 256 MiB buffers)")
        print(f"{key:<26} {value:9.2f} {here:9.2f} {there:9.2f} {there / here:9.2f} {there / value:8.2f}  {aim}")
    return checks.exit_status()


if __name__ == "__main__":
    sys.exit(main())
