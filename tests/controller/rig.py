"""Real etcd and real controller processes for the controller tests.

* EtcdServer: ``/usr/bin/etcd`` on 127.0.0.1 with free ports and a temporary data dir (and any extra flags,
  e.g. ``--max-txn-ops``); ``start`` waits (bounded) until ``/health`` says true; ``kill`` and ``start`` again
  reuse the ports and the data, as an etcd that crashed and came back.
* ControllerProcess: ``python -m controller start`` as a separate process, logging to a file; ``start`` waits
  (bounded) until ``/api/v1/health`` answers 200, or fails with the controller's log.
* The cluster key (docs/security.md): the tests' one key (tests/cluster_key.py, which the relay listeners and
  relays of the tests hold too), in a file of this process's (0600), given to every controller (``--key-file``),
  oriond and fake host agent the tests start; ``member_client`` and ``call(..., member=NAME)`` sign as a member
  with it, as oriond does.

Every wait here is bounded; every process started here is stopped by the fixtures in conftest.py.
"""
from __future__ import annotations

import http.client
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path

from controller.cluster_key import load_key, sign_request
from host_agent.daemon.controller_link import Member
from ivshmem.shared.controller_client import ControllerClient
from tests.cluster_key import key_file
from tests.processes import free_port, python_path, stop_process  # noqa: F401 - free_port: the tests' import

REPO = Path(__file__).resolve().parents[2]
ETCD_READY_TIMEOUT_S = 20.0
CONTROLLER_READY_TIMEOUT_S = 30.0
WAIT_S = 30.0  # a bound on waiting for something to happen; never a measured time


def wait_until(what: str, predicate: Callable[[], object], timeout: float = WAIT_S,
               log: Callable[[], str] = lambda: "") -> None:
    """Poll `predicate` until it is true; fail naming `what` (and showing `log()`) after `timeout` s."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"{what} (gave up waiting after {timeout} s)\n{log()}"
        time.sleep(0.05)


def cluster_key_file() -> Path:
    """The tests' cluster key, in a file of this process's (made at first use, 0600, removed at exit)."""
    return key_file()


def signer_of(name: str) -> Member:
    """A signer for member `name` with this test process's cluster key (what oriond named `name` holds)."""
    return Member(name, load_key(cluster_key_file()))


def member_client(address: str, name: str, timeout_s: float = 10.0) -> ControllerClient:
    """A ControllerClient of member `name` (an oriond registering as host `name`)."""
    return ControllerClient(address, timeout_s, signer=signer_of(name))


def etcd_binary() -> str | None:
    return shutil.which("etcd") or ("/usr/bin/etcd" if os.path.exists("/usr/bin/etcd") else None)


def _get(url: str, timeout: float = 2.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def call(ctl: ControllerProcess, method: str, path: str, body: bytes | str | None = None,
         headers: dict[str, str] | None = None, member: str = "") -> tuple[int, str]:
    """One plain HTTP request to a controller: (status, body text); signed as `member` when one is named."""
    sent = dict(headers or {})
    if member:
        raw = body.encode() if isinstance(body, str) else body or b""
        sent["Authorization"] = sign_request(load_key(cluster_key_file()), member, method, path, raw)
    conn = http.client.HTTPConnection("127.0.0.1", ctl.port, timeout=10)
    try:
        conn.request(method, path, body=body, headers=sent)
        resp = conn.getresponse()
        return resp.status, resp.read().decode()
    finally:
        conn.close()


class EtcdServer:
    """One etcd member on loopback, with its own data dir."""

    def __init__(self, binary: str, data_dir: Path, extra: Sequence[str] = ()) -> None:
        self.binary = binary
        self.extra = list(extra)
        self.data_dir = data_dir
        self.client_port = free_port()
        self.peer_port = free_port()
        self.log_path = data_dir.with_suffix(".log")
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.client_port}"

    def start(self) -> None:
        client, peer = self.url, f"http://127.0.0.1:{self.peer_port}"
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [self.binary, "--name", "test", "--data-dir", str(self.data_dir),
                 "--listen-client-urls", client, "--advertise-client-urls", client,
                 "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                 "--initial-cluster", f"test={peer}", "--log-outputs", "stderr", *self.extra],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        end = time.monotonic() + ETCD_READY_TIMEOUT_S
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise AssertionError(f"etcd exited with {self.proc.returncode}:\n{self.log()}")
            try:
                status, body = _get(f"{self.url}/health", timeout=1.0)
                if status == 200 and json.loads(body).get("health") == "true":
                    return
            except (OSError, ValueError):
                pass
            time.sleep(0.05)
        raise AssertionError(f"etcd not healthy within {ETCD_READY_TIMEOUT_S} s:\n{self.log()}")

    def kill(self) -> None:
        """SIGKILL, as a crash: whatever etcd had acknowledged is on disk, nothing else."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc, 10)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return "(no log)"


class ControllerProcess:
    """``python -m controller start`` on a free port, as its own process."""

    def __init__(self, etcd_url: str, key_root: str, log_path: Path, port: int | None = None,
                 extra: list[str] | None = None) -> None:
        self.etcd_url = etcd_url
        self.key_root = key_root
        self.log_path = log_path
        self.port = port or free_port()
        self.extra = list(extra or [])
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    def argv(self) -> list[str]:
        key = [] if "--key-file" in self.extra else ["--key-file", str(cluster_key_file())]
        return [sys.executable, "-m", "controller", "start", "--listen", self.address, "--etcd", self.etcd_url,
                "--key-root", self.key_root, "--log", str(self.log_path), *key, *self.extra]

    def start(self, wait: bool = True) -> ControllerProcess:
        env = {**os.environ, "PYTHONPATH": python_path()}
        self.proc = subprocess.Popen(self.argv(), cwd=REPO, env=env, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self) -> None:
        assert self.proc is not None
        end = time.monotonic() + CONTROLLER_READY_TIMEOUT_S
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
                raise AssertionError(f"controller exited with {self.proc.returncode}: {err}\n{self.log()}")
            try:
                if _get(f"{self.url}/api/v1/health", timeout=1.0)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise AssertionError(f"controller not ready within {CONTROLLER_READY_TIMEOUT_S} s:\n{self.log()}")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self) -> int | None:
        return stop_process(self.proc, 10) if self.proc is not None else None

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-6000:]
        except OSError:
            return "(no log)"
