"""Fixtures for tests against the real libvirtd (qemu:///system): the connection and throw-away domains.

* `libvirt_conn` (session): makes sure virtlogd and libvirtd run — started by hand with `-d` when they do not,
  as on machines without systemd — waits until `libvirt.open('qemu:///system')` answers, and yields that
  connection. The daemons are never stopped or restarted: other tests (and other engineers' runs) share them.
  Without libvirt-python or the daemons installed the tests skip with the reason; under CI (env CI set) that
  is a failure instead, because the set-up must provide them.
* `define_domain`: a callable `define_domain(xml) -> virDomain` that gives the domain a fresh unique name
  (`orion-test-<hex>`, dropping any `<uuid>`), defines it, and at teardown destroys and undefines every domain
  it defined (or was told about with `define_domain.track(name)`), even when the test failed.

Every wait here is bounded.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from lxml import etree

LIBVIRT_URI = "qemu:///system"
DOMAIN_PREFIX = "orion-test-"
DAEMON_READY_TIMEOUT_S = 60.0  # the first libvirtd start probes QEMU's capabilities (about 8 s here)

try:
    import libvirt
except ImportError:  # pragma: no cover - depends on the machine
    libvirt = None


def _unavailable(reason: str) -> None:
    """Skip with the reason, or fail under CI, where setup.sh must have provided libvirt."""
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI must provide it: run ./setup.sh)")
    pytest.skip(reason)


def _daemon_running(name: str) -> bool:
    """True if a live process whose executable is `name` exists (read from /proc; no pgrep needed)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            comm = Path("/proc", entry, "comm").read_text().strip()
            state = Path("/proc", entry, "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if comm == name and state not in ("Z", "X"):
            return True
    return False


def _ensure_daemon(name: str) -> None:
    """Start `name -d` unless it runs. A concurrent starter losing the pidfile race is harmless."""
    if _daemon_running(name):
        return
    binary = shutil.which(name, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")
    if binary is None:
        _unavailable(f"{name} is not installed (apt: libvirt-daemon-system)")
    subprocess.run([str(binary), "-d"], check=False, timeout=30, capture_output=True)


def _try_open() -> tuple[Any, str]:
    try:
        return libvirt.open(LIBVIRT_URI), ""
    except libvirt.libvirtError as exc:
        return None, str(exc)


@pytest.fixture(scope="session")
def libvirt_conn() -> Iterator[Any]:
    if libvirt is None:
        _unavailable("libvirt-python is not installed (pip install libvirt-python; needs apt libvirt-dev)")
    libvirt.registerErrorHandler(lambda _ctx, _err: None, None)  # errors arrive as exceptions; no stderr noise
    conn, error = _try_open()
    if conn is None:
        _ensure_daemon("virtlogd")
        _ensure_daemon("libvirtd")
        deadline = time.monotonic() + DAEMON_READY_TIMEOUT_S
        while conn is None and time.monotonic() < deadline:
            time.sleep(0.2)
            conn, error = _try_open()
        if conn is None:
            _unavailable(f"libvirtd did not answer on {LIBVIRT_URI} within {DAEMON_READY_TIMEOUT_S:.0f} s: {error}")
    try:
        yield conn
    finally:
        conn.close()


class DomainDefiner:
    """Defines domains under unique `orion-test-` names and removes them all in `cleanup`."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.names: list[str] = []

    @staticmethod
    def new_name() -> str:
        return DOMAIN_PREFIX + uuid.uuid4().hex[:12]

    def track(self, name: str) -> None:
        """Also clean up `name` (a domain the test defined some other way)."""
        if name not in self.names:
            self.names.append(name)

    def __call__(self, xml: str | bytes) -> Any:
        root = etree.fromstring(xml.encode() if isinstance(xml, str) else xml)
        name_el = root.find("name")
        if name_el is None:
            name_el = etree.SubElement(root, "name")
            root.insert(0, name_el)
        name_el.text = self.new_name()
        for stale in root.findall("uuid"):
            root.remove(stale)
        self.track(name_el.text)
        return self.conn.defineXML(etree.tostring(root, encoding="unicode"))

    def cleanup(self) -> None:
        flags = (libvirt.VIR_DOMAIN_UNDEFINE_MANAGED_SAVE | libvirt.VIR_DOMAIN_UNDEFINE_SNAPSHOTS_METADATA
                 | libvirt.VIR_DOMAIN_UNDEFINE_CHECKPOINTS_METADATA | libvirt.VIR_DOMAIN_UNDEFINE_NVRAM)
        for name in self.names:
            try:
                dom = self.conn.lookupByName(name)
            except libvirt.libvirtError:
                continue  # never defined, or the test removed it
            try:
                if dom.isActive():
                    dom.destroy()
            except libvirt.libvirtError:
                pass  # it stopped by itself meanwhile
            try:
                dom.undefineFlags(flags)
            except libvirt.libvirtError:
                dom.undefine()


@pytest.fixture
def define_domain(libvirt_conn: Any) -> Iterator[Callable[[str | bytes], Any]]:
    definer = DomainDefiner(libvirt_conn)
    try:
        yield definer
    finally:
        definer.cleanup()
