"""Starting a job's ranks as torchrun does, for the programs and benches that run one process per device.

Two things a launcher must get right, or a job that failed looks like one that hangs:
- the rendezvous port is one the kernel gave as free, not one guessed from a pid (which can fall in the ephemeral
  range and belong to a live connection);
- when a rank fails, the others are ended at once, and the failure is the job's exit status: the others would
  otherwise wait for it in NCCL's setup until their own timeout (a rank killed by a signal is a failure too, which
  `max()` of the exit codes would miss).

Not here: anything about CUDA or NCCL; the ranks' own arguments and environment are the caller's."""
from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Mapping, Sequence

from tests.processes import free_port  # noqa: F401 - MASTER_PORT: the launchers' import


def run_ranks(argvs: Sequence[Sequence[str]], timeout_s: float, env: Mapping[str, str] | None = None) -> int:
    """Run one process per argv (with `env`, or this process's environment) until all end; 0 when every rank
    succeeded, else the first failure's status (128 + signal for a signal, 124 past `timeout_s`), the other ranks
    killed as soon as one fails."""
    ranks = [subprocess.Popen(list(argv), env=None if env is None else dict(env)) for argv in argvs]
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            codes = [rank.poll() for rank in ranks]
            failed = [(number, code) for number, code in enumerate(codes) if code not in (None, 0)]
            if failed:
                number, code = failed[0]
                status = 128 - code if code < 0 else code
                print(f"rank {number} failed (exit status {status}); ending the other ranks", file=sys.stderr)
                return status
            if all(code == 0 for code in codes):
                return 0
            if time.monotonic() > deadline:
                print(f"the ranks ran past {timeout_s:.0f} s; ending them", file=sys.stderr)
                return 124
            time.sleep(0.05)
    finally:
        for rank in ranks:
            if rank.poll() is None:
                rank.kill()
            rank.wait()
