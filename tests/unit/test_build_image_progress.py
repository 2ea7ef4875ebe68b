"""The guest image's debootstrap (about 100 s) says how far it got every 10 s instead of staying silent (issue 31).

tests/guest/build-image.sh runs with a stand-in `debootstrap` first on PATH that logs a line, sleeps past one
progress interval and makes the root directory, in a scratch ORION_GUEST_DIR; the build then stops at its next step
(the stand-in installs no kernel), which is not what this test is about. Root only, as the script is.
"""
from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from tests.processes import REPO

STAND_IN = """#!/bin/sh
root="$4"
echo "I: Retrieving Packages (stand-in)"
sleep 12
echo "I: Base system installed successfully."
mkdir -p "$root"
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="build-image.sh runs as root only")
def test_debootstrap_reports_its_progress_while_it_runs(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "debootstrap"
    fake.write_text(STAND_IN)
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", ORION_GUEST_DIR=str(tmp_path / "guest"),
               ORION_GUEST_MIRROR="http://deb.example/debian")
    done = subprocess.run(["bash", str(REPO / "tests/guest/build-image.sh")], env=env, capture_output=True, text=True,
                          timeout=120)
    progress = [line for line in done.stdout.splitlines() if "debootstrap running for" in line]
    first = progress[0] if progress else ""
    assert first.startswith("build-image: debootstrap running for 10 s: I: Retrieving Packages"), done.stdout
    assert "PHASE debootstrap:" in done.stdout  # and it went on once debootstrap ended
