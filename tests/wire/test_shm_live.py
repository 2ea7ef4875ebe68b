"""`orion-shm inspect` and `remove` on a region that a real agent serves and a real client uses."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from ivshmem import ClientChannel, Region

REPO = Path(__file__).resolve().parents[2]


def shm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "host_agent.admin.shm_cli", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=60)


def test_inspect_shows_the_agent_and_the_claimed_channel_and_remove_refuses(
        tmp_path: Path, server_factory: Callable[..., object]) -> None:
    path = tmp_path / "orionsock5"
    with open(path, "wb") as f:
        f.truncate(32 << 20)
    server = server_factory(str(path))
    with Region.open(path) as region, ClientChannel.claim(region) as channel:
        out = shm("inspect", "5", "-d", str(tmp_path))
        assert out.returncode == 0, out.stderr
        assert re.search(r"^  state\s+serving \(1\)", out.stdout, re.M)
        assert re.search(rf"^  pid\s+{server.pid} \(running\)", out.stdout, re.M)  # type: ignore[attr-defined]
        assert re.search(rf"^\s+{channel.index} in use .*client_pid={os.getpid()} .*host_status=serving",
                         out.stdout, re.M), out.stdout
        assert "channels (1/" in out.stdout

        removed = shm("remove", "5", "-d", str(tmp_path))
        assert removed.returncode == 1 and str(server.pid) in removed.stderr  # type: ignore[attr-defined]
        assert path.exists()
