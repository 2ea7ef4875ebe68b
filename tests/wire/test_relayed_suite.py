"""The forwarded-call suite, relayed: every test of the forwarding rig's users run again with ORION_TEST_RELAYED=netns
(tests/forwarding_rig.py), so each session crosses a veth pair between two network namespaces to a relay listener
over the fake driver (docs/remote.md). Tests of what only a session on its own host does are marked `local_only`
and skip there, each saying why; what a relay does instead is tested in test_relayed_sessions.py.

It runs as one pytest in a child process (the rig reads the variable when it is imported) and must pass whole.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests import relay_net
from tests.forwarding_rig import RELAYED_ENV

REPO = Path(__file__).resolve().parents[2]
SUITE = ["tests/unit/test_forwarding_roundtrip.py", "tests/unit/test_runtime_shim.py", "tests/unit/test_more_calls.py",
         "tests/unit/test_pinned_and_contexts.py", "tests/unit/test_uva_copy.py", "tests/unit/test_payload_sizes.py",
         "tests/unit/test_quota_usage.py", "tests/unit/test_call_table_hello.py",
         *sorted(str(p.relative_to(REPO)) for p in (REPO / "tests/wire").glob("test_native_*.py")),
         "tests/wire/test_images_by_digest.py"]
SUITE_TIMEOUT_S = 900


@pytest.mark.skipif(bool(relay_net.why_not()), reason=relay_net.why_not() or "")
def test_the_forwarded_call_suite_passes_relayed() -> None:
    env = {**os.environ, RELAYED_ENV: "netns"}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", *SUITE],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=SUITE_TIMEOUT_S)
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[-2000:]
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    passed = re.search(r"(\d+) passed", summary)
    skipped = [line for line in done.stdout.splitlines() if line.startswith("SKIPPED")]
    assert passed and int(passed.group(1)) >= 150, summary  # the suite ran, not an empty collection
    assert all("relayed sessions differ here" in line or "native" in line.lower() for line in skipped), skipped
    print(f"relayed: {summary}")
