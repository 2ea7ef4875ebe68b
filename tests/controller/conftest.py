"""Fixtures for the controller tests: a real etcd and real controller processes.

* ``etcd`` (session): one etcd on loopback shared by the tests that do not stop it; each test works under its
  own key root (``key_root``), so they cannot see each other's pools.
* ``private_etcd``: an etcd of the test's own, for the tests that kill and restart it; ``etcd_with(flags)``
  starts one with extra flags (e.g. ``--max-txn-ops``).
* ``pool``: a GpuPool on ``etcd`` under the test's key root, in this process (no HTTP), for carving and packing.
* ``controllers``: ``controllers(etcd_url=..., extra=[...])`` starts a controller process on the test's key
  root and waits until it answers; all are stopped at teardown.

Without an etcd binary the tests skip with the reason; under CI (env CI set) that is a failure, because the
set-up must install etcd-server.
"""
from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from controller.keys import Keys
from controller.pool import GpuPool
from controller.store import EtcdStore
from tests.controller.rig import ControllerProcess, EtcdServer, etcd_binary


def _need_etcd() -> str:
    binary = etcd_binary()
    if binary is None:
        reason = "etcd is not installed (apt-get install etcd-server)"
        if os.environ.get("CI"):
            pytest.fail(f"{reason}; CI must provide it: run ./setup.sh")
        pytest.skip(reason)
    return binary


@pytest.fixture(scope="session")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    server = EtcdServer(_need_etcd(), tmp_path_factory.mktemp("etcd") / "data")
    server.start()
    yield server
    server.stop()


@pytest.fixture
def private_etcd(tmp_path: Path) -> Iterator[EtcdServer]:
    server = EtcdServer(_need_etcd(), tmp_path / "etcd-data")
    server.start()
    yield server
    server.stop()


@pytest.fixture
def etcd_with(tmp_path: Path) -> Iterator[Callable[..., EtcdServer]]:
    started: list[EtcdServer] = []

    def start(*flags: str) -> EtcdServer:
        server = EtcdServer(_need_etcd(), tmp_path / f"etcd-{len(started)}-data", extra=flags)
        started.append(server)
        server.start()
        return server

    yield start
    for server in reversed(started):
        server.stop()


@pytest.fixture
def key_root() -> str:
    return f"/orion-test-{uuid.uuid4().hex[:12]}/"


@pytest.fixture
def pool(etcd: EtcdServer, key_root: str) -> Iterator[GpuPool]:
    store = EtcdStore(etcd.url, timeout_s=5.0)
    yield GpuPool(store, Keys(key_root), lease_ttl_s=60, host_ttl_s=60)
    store.close()


@pytest.fixture
def controllers(etcd: EtcdServer, key_root: str, tmp_path: Path) -> Iterator[Callable[..., ControllerProcess]]:
    started: list[ControllerProcess] = []

    def start(etcd_url: str | None = None, extra: list[str] | None = None, port: int | None = None,
              wait: bool = True) -> ControllerProcess:
        proc = ControllerProcess(etcd_url or etcd.url, key_root, tmp_path / f"controller-{len(started)}.log",
                                 port=port, extra=extra)
        started.append(proc)
        return proc.start(wait=wait)

    yield start
    for proc in reversed(started):
        proc.stop()
