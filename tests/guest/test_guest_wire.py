"""A real QEMU guest (TCG) with the region attached as ivshmem-plain, running this checkout's client code.

Needs the image from tests/guest/build-image.sh (`make test` builds it). The host side is the real region
server in its own process; the guest finds the PCI device by itself.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator

import pytest

from ivshmem import layout
from ivshmem.layout import Geometry
from ivshmem.region import Region

from .vm import image_ready, run_guest

pytestmark = [
    pytest.mark.guest,
    pytest.mark.skipif(not image_ready() and not os.environ.get("CI"),
                       reason="guest image not built: run `bash tests/guest/build-image.sh` (make test does)"),
]
SIZE_MIB = 32


def _blank_region() -> str:
    path = f"/dev/shm/orion-guest-test-{uuid.uuid4().hex[:8]}"
    with open(path, "wb") as f:
        f.truncate(SIZE_MIB << 20)
    return path


@pytest.fixture
def served_region() -> Iterator[str]:
    path = _blank_region()
    server = subprocess.Popen([sys.executable, "-m", "host_agent.daemon.region_server", path, "--heartbeat-timeout",
                               "5"])
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                with Region.open(path) as region:
                    if region.agent_words()[2] == layout.AGENT_SERVING:
                        break
            except Exception:
                pass
            assert server.poll() is None and time.monotonic() < deadline, "region server did not start"
            time.sleep(0.05)
        yield path
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(10)
        os.unlink(path)


def _say(request: pytest.FixtureRequest, text: str) -> None:
    """Print past pytest's capture: the issue asks for the round trip to be shown, not only asserted."""
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    if capture is not None and reporter is not None:
        with capture.global_and_fixture_disabled():
            reporter.write_line("\n" + text)


def test_guest_exchanges_records_with_host(served_region: str, request: pytest.FixtureRequest) -> None:
    result = run_guest("tests/guest/wire_guest.py", ["good"], shm=[(served_region, SIZE_MIB)], timeout=300)
    assert result.rc == 0, result.serial[-3000:]
    probe = result.line("ORION-PROBE region=")
    assert probe and "kind=pci" in probe, result.serial[-3000:]
    assert result.line("ORION-PROBE ok"), result.serial[-3000:]
    concurrent = result.lines("WIRE-CONCURRENT")
    assert len(concurrent) == 2 and all("rc=0" in line for line in concurrent), result.serial[-3000:]
    channels = {re.search(r"channel=(\S+)", line).group(1) for line in concurrent}  # type: ignore[union-attr]
    assert len(channels) == 2, f"two guest processes shared a channel: {concurrent}"
    _say(request, f"guest (TCG) {result.line('ORION-PROBE round-trip')} | {result.line('ORION-PROBE bulk')} "
                  f"| boot+run {result.wall_s:.1f} s")


def test_guest_reports_broken_regions_clearly() -> None:
    blank = _blank_region()  # what QEMU or truncate leaves: no header, no agent
    unserved = _blank_region()  # formatted, but no agent serves it
    try:
        with Region.open(unserved) as region:
            region.format(Geometry.build(region.size, 4, name="unserved"))
        result = run_guest("tests/guest/wire_guest.py", ["bad"], shm=[(blank, SIZE_MIB), (unserved, SIZE_MIB)],
                           timeout=300)
    finally:
        os.unlink(blank)
        os.unlink(unserved)
    assert result.rc == 0, result.serial[-3000:]
    assert result.line("WIRE-DEVICES 2"), result.serial[-3000:]
    lines = result.lines("WIRE-BAD")
    assert len(lines) == 2, result.serial[-3000:]
    blank_line, unserved_line = lines  # devices are listed in PCI order, the same order as attached
    assert "rc=1" in blank_line and "holds no header yet" in blank_line and "start the host agent" in blank_line
    assert "rc=1" in unserved_line and "no host agent is serving this region" in unserved_line
    assert "Traceback" not in result.serial


def test_guest_without_region_says_so() -> None:
    result = run_guest("tests/guest/wire_guest.py", ["bad"], timeout=300)
    assert result.rc == 0, result.serial[-3000:]
    assert result.line("WIRE-DEVICES 0")
    line = result.line("WIRE-NONE")
    assert line and "rc=1" in line and "no Orion region found" in line, result.serial[-3000:]
    assert "Traceback" not in result.serial
