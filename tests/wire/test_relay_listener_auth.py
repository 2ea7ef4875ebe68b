"""Who may open a relayed session (docs/security.md, "Who may talk to whom: the cluster key"), against real orionds:
`python -m host_agent.daemon.oriond` processes, and for a GPU host whose sessions run CUDA calls, the fake-driver host
agent (tests/controller/fake_gpu_agent.py: oriond's listener, workers and executor over tests/fake_driver.py).

Issue 27, item 2: every oriond listened on 127.0.0.1:9960 by default, and a local user with no region (`nobody`)
got a GPU session there and ran CUDA calls; a GPU host in a controller's pool served a RELAY_HELLO without an
allocation, outside the pool's count. Each test names the promise it holds. The local attacker is a process of
user `nobody` (it cannot read the root-only key: checked as a premise); the oriond of a default configuration runs
in a network namespace of its own, so that its port 9960 is nobody else's. Waits are bounded and assert state.
"""
from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from controller.cluster_key import relay_proof
from host_agent.handler import Session
from host_agent.relay.handshake import CLAIM, GREETING, HANDSHAKE_S, MAGIC, VERDICT
from host_agent.session.executor import CudaExecutor
from ivshmem.channel import ClientChannel
from ivshmem.driver_api import CALLS
from ivshmem.record import Op, Status
from ivshmem.region import Region
from tests.cluster_key import OTHER_KEY, TEST_KEY, write_key
from tests.controller.rig import free_port, wait_until
from tests.fake_driver import FakeDriver
from tests.processes import REPO, python_path, stop_process
from tests.relay_peer import RelayPeer, start_listener

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: network namespaces, a root-only key, "
                                "and a process of user nobody")

SUCCESS, DEVICE_UNAVAILABLE = 0, 46
SLACK_S = 3.0  # scheduling on a loaded 2-core machine: tells a bounded wait from a hang, nothing about speed
MIB = 1 << 20
AGENT = REPO / "tests" / "controller" / "fake_gpu_agent.py"


# --- real processes -------------------------------------------------------------------------------------------
class Daemon:
    """A host agent process (oriond or fake_gpu_agent.py), in network namespace `ns` when given, logging to a file."""

    def __init__(self, argv: list[str], log_path: Path, ns: str = "") -> None:
        self.log_path = log_path
        env = {k: v for k, v in os.environ.items() if not k.startswith("ORION_")}
        env["PYTHONPATH"] = python_path()
        with open(log_path, "wb") as log:
            self.proc = subprocess.Popen([*(["ip", "netns", "exec", ns] if ns else []), *argv], cwd=REPO, env=env,
                                         stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def wait_for(self, text: str, what: str) -> None:
        wait_until(what, lambda: text in self.log() or self.proc.poll() is not None, log=self.log)
        assert text in self.log(), f"{what}: it exited with {self.proc.returncode}\n{self.log()}"

    def stop(self) -> None:
        stop_process(self.proc, 10)


def oriond(tmp: Path, conf: str, ns: str = "") -> tuple[Daemon, Path]:
    """A real oriond with server.conf `conf` (+ its region directory, one blank region): (it, its region)."""
    tmp.mkdir(parents=True, exist_ok=True)
    shm = tmp / "shm"
    shm.mkdir(exist_ok=True)
    region = shm / "orionsock0"
    with open(region, "wb") as f:
        f.truncate(32 * MIB)  # blank: oriond formats it
    (tmp / "server.conf").write_text(conf + f'[server-shm]\n    shm_path_base = "{shm}/"\n')
    daemon = Daemon([sys.executable, "-m", "host_agent.daemon.oriond", "--config", str(tmp / "server.conf"),
                     "--pid-file",
                     str(tmp / "oriond.pid")], tmp / "oriond.log", ns)
    daemon.wait_for("Using SHM", "oriond to serve its region")
    return daemon, region


def gpu_agent(tmp: Path, host: str, port: int, *extra: str, ns: str = "") -> Daemon:
    """The fake-driver GPU host, its relay listener on host:port (the tests' cluster key unless --key-file)."""
    tmp.mkdir(parents=True, exist_ok=True)
    region = tmp / "orionsock-gpu"
    with open(region, "wb") as f:
        f.truncate(32 * MIB)
    daemon = Daemon([sys.executable, str(AGENT), str(region), host, *extra, "--listen", str(port)],
                    tmp / "agent.log", ns)
    daemon.wait_for("Using SHM", "the GPU host agent to serve its region")
    return daemon


@pytest.fixture
def started() -> Iterator[Callable[[Daemon], Daemon]]:
    daemons: list[Daemon] = []
    yield lambda daemon: daemons.append(daemon) or daemon  # type: ignore[func-returns-value]
    for daemon in daemons:
        daemon.stop()


@contextlib.contextmanager
def namespace() -> Iterator[str]:
    """A network namespace of this test's own, only its loopback up."""
    name = f"orion-auth-{os.getpid()}"
    subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)
    subprocess.run(["ip", "netns", "add", name], check=True, capture_output=True, timeout=30)
    try:
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True, capture_output=True, timeout=30)
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)


def guest_call(region: Path) -> tuple[int, int]:
    """A session on `region` (its oriond relays it): cuInit's status and the number of devices (0 on failure)."""
    with ClientChannel.claim(Region.open(str(region))) as channel:
        channel.hello()
        status = channel.call(CALLS["cuInit"].opcode, CALLS["cuInit"].request.encode(0)).status
        count = channel.call(CALLS["cuDeviceGetCount"].opcode)
        devices = CALLS["cuDeviceGetCount"].reply.decode(count.payload)[0] if count.status == SUCCESS else 0
        return status, devices


# --- a local user with no region: what it can do to a listener ------------------------------------------------
# Run as user nobody: the key file is unreadable to it; then, on a connection each, what a non-member can try:
# RELAY_HELLO and a CUDA call without any handshake (what every peer could do before), and a claim with a forged
# proof. Says what came back: a session (RELAY_ACCEPT OK) and the CUDA call's status, or how the connection ended.
ATTACK = r'''
import json, os, pwd, socket, struct, sys, time
nobody = pwd.getpwnam("nobody")
os.setgroups([]); os.setgid(nobody.pw_gid); os.setuid(nobody.pw_uid)
host, port, key_path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
from host_agent.relay.frames import BEAT, RELAY_ACCEPT, RELAY_HELLO, RELAY_HELLO_REQUEST
from ivshmem.driver_api import CALLS, table_digest
from ivshmem.record import HEADER, PROTOCOL
report = {"uid": os.getuid()}
try:
    open(key_path, "rb").read()
    report["key"] = "read"
except OSError as exc:
    report["key"] = exc.strerror

def frame(call_id, opcode, payload, generation=0):
    return HEADER.pack(call_id, opcode, 0, len(payload), generation, 0, 0) + payload

def read_all(sock, limit_s):
    """Bytes until the peer closes or limit_s pass, and when it closed (None: it did not)."""
    data, started = b"", time.monotonic()
    while time.monotonic() - started < limit_s:
        sock.settimeout(max(0.01, limit_s - (time.monotonic() - started)))
        try:
            chunk = sock.recv(65536)
        except socket.timeout:
            break
        except OSError:
            return data, time.monotonic() - started
        if not chunk:
            return data, time.monotonic() - started
        data += chunk
    return data, None

def frames_in(data):
    """(opcode, status, call_id) of the frames `data` holds, BEATs left out."""
    out = []
    while len(data) >= HEADER.size:
        call_id, opcode, flags, length, generation, status, _ = HEADER.unpack(data[:HEADER.size])
        data = data[HEADER.size + length:]
        if opcode != BEAT:
            out.append((opcode, status, call_id))
    return out

def attempt(forged):
    try:
        sock = socket.create_connection((host, port), timeout=5)
    except OSError as exc:
        return {"connect": exc.strerror}
    result = {"connect": "ok"}
    if forged:
        sock.settimeout(2)
        try:
            greeting = sock.recv(40, socket.MSG_WAITALL)
        except OSError:
            greeting = b""
        result["greeted"] = greeting[:8].decode(errors="replace")
        if len(greeting) == 40:
            sock.sendall(os.urandom(64) + bytes([10]) + b"nobody-box" + bytes(181))
            verdict, _ = read_all(sock, 5)
            result["verdict"] = verdict[:1].hex()
    hello = RELAY_HELLO_REQUEST.encode(PROTOCOL, os.getpid(), "nobody", table_digest(), "", b"")
    try:
        sock.sendall(frame(1, RELAY_HELLO, hello) + frame(2, CALLS["cuInit"].opcode, CALLS["cuInit"].request.encode(0)))
    except OSError as exc:
        result["sent"] = exc.strerror
    data, closed = read_all(sock, 12)
    if data.startswith(b"ORIONRH1"):
        result["greeted"], data = "ORIONRH1", data[40:]
    found = frames_in(data)
    result["session"] = any(op == RELAY_ACCEPT and status == 0 for op, status, _ in found)
    result["answers"] = [[op, status, call] for op, status, call in found]
    result["closed_after_s"] = closed
    sock.close()
    return result

report["skip"] = attempt(False)
report["forged"] = attempt(True)
print(json.dumps(report))
'''


def attack(host: str, port: int, key_path: Path, ns: str = "") -> dict[str, object]:
    """ATTACK as user nobody (in network namespace `ns`): its report."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORION_")}
    env["PYTHONPATH"] = python_path()
    done = subprocess.run([*(["ip", "netns", "exec", ns] if ns else []), sys.executable, "-c", ATTACK, host,
                           str(port), str(key_path)], cwd="/", env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    report: dict[str, object] = json.loads(done.stdout)
    assert report["uid"] == 65534 and report["key"] == "Permission denied", report  # the premise: not a member
    return report


# --- the tests ------------------------------------------------------------------------------------------------
def test_an_oriond_of_the_default_configuration_takes_no_relayed_session(tmp_path: Path,
                                                                        started: Callable[[Daemon], Daemon]) -> None:
    """docs/security.md: the relay listener "is off unless listen_port is set". Before, every oriond listened on
    127.0.0.1:9960, and user nobody got a session there and ran cuInit."""
    key = write_key(tmp_path / "cluster.key")
    with namespace() as ns:
        daemon, _region = oriond(tmp_path / "host", f"[cluster]\n    key_file = {key}\n", ns)
        started(daemon)
        report = attack("127.0.0.1", 9960, key, ns)
        assert report["skip"] == {"connect": "Connection refused"}, report
        assert report["forged"] == {"connect": "Connection refused"}, report
        assert "Not listening for relayed sessions: set listen_port" in daemon.log()


@pytest.mark.parametrize("problem", ["missing", "readable by others"])
def test_a_listener_without_a_usable_key_does_not_start_and_oriond_serves_on(
        problem: str, tmp_path: Path, started: Callable[[Daemon], Daemon]) -> None:
    """docs/security.md: the listener "refuses to start without a usable key file", in one line that says how to
    fix it; oriond goes on serving its regions. Before, it listened whatever the key."""
    key = tmp_path / "cluster.key"
    if problem != "missing":
        write_key(key).chmod(0o644)
    port = free_port()
    daemon, region = oriond(tmp_path / "host", f"[server]\n    listen_port = {port}\n[cluster]\n    key_file = {key}\n")
    started(daemon)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    lines = [line for line in daemon.log().splitlines() if "not listening on" in line]
    fix = "does not exist: copy the cluster's key there" if problem == "missing" else "chmod 600"
    assert len(lines) == 1 and f"127.0.0.1:{port} for relayed sessions: cluster key {key}" in lines[0] \
        and fix in lines[0], daemon.log()
    with ClientChannel.claim(Region.open(str(region))) as channel:  # its region is served as ever
        channel.hello()
        assert channel.call(Op.ECHO, b"served").payload == b"served"


def test_a_local_user_without_the_key_gets_no_session(tmp_path: Path, started: Callable[[Daemon], Daemon]) -> None:
    """docs/security.md: the listener "proves the peer before reading any frame beyond the handshake", and "all of
    it must arrive within 5 s". User nobody cannot read the key: RELAY_HELLO without a handshake is read as a claim
    that never completes, and the connection is closed at the deadline; a forged claim is refused. No session, no
    worker. Before, nobody got a session (RELAY_ACCEPT OK) and its cuInit was answered."""
    key = write_key(tmp_path / "cluster.key")
    port = free_port()
    daemon, _ = oriond(tmp_path / "host", f"[server]\n    listen_port = {port}\n[cluster]\n    key_file = {key}\n")
    started(daemon)
    report = attack("127.0.0.1", port, key)
    skip, forged = report["skip"], report["forged"]
    assert isinstance(skip, dict) and isinstance(forged, dict)
    assert not skip["session"] and not forged["session"], report
    assert skip["answers"] == [] and forged["answers"] == [], report
    assert skip["greeted"] == "ORIONRH1" and skip["closed_after_s"] is not None, report
    assert HANDSHAKE_S - 1.0 <= skip["closed_after_s"] <= HANDSHAKE_S + SLACK_S, report  # at the deadline, not before
    assert forged["verdict"] == "01" and forged["closed_after_s"] is not None, report  # REFUSED, then closed
    assert "Creating session" not in daemon.log(), daemon.log()
    assert "its proof of the cluster key is wrong" in daemon.log() and "no handshake within 5 s" in daemon.log()


def _claim(sock: socket.socket, name: str) -> tuple[bytes, bytes]:
    """A member's claim, made by hand on `sock` after its greeting: (the claim sent, the verdict)."""
    magic, server_nonce = GREETING.unpack(sock.recv(GREETING.size, socket.MSG_WAITALL))
    assert magic == MAGIC
    nonce = os.urandom(32)
    claim = CLAIM.pack(nonce, relay_proof(TEST_KEY, "client", server_nonce, nonce, name), len(name), name.encode())
    sock.sendall(claim)
    return claim, sock.recv(VERDICT.size, socket.MSG_WAITALL)


def test_a_recorded_claim_is_no_good_on_another_connection(tmp_path: Path, started: Callable[[Daemon], Daemon]) -> None:
    """docs/security.md: each end proves itself over "a fresh 32-byte nonce" of the other: a member's claim recorded
    on the wire (an attacker on the path) and played back on a new connection is refused."""
    key = write_key(tmp_path / "cluster.key")
    port = free_port()
    daemon, _ = oriond(tmp_path / "host", f"[server]\n    listen_port = {port}\n[cluster]\n    key_file = {key}\n")
    started(daemon)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as member, \
            socket.create_connection(("127.0.0.1", port), timeout=10) as replay:
        claim, verdict = _claim(member, "edge-1")
        assert verdict[0] == 0, verdict  # PROVEN: the claim was good, on its own connection
        assert replay.recv(GREETING.size, socket.MSG_WAITALL)[:8] == MAGIC
        replay.sendall(claim)
        verdict = replay.recv(VERDICT.size, socket.MSG_WAITALL)
        assert verdict[0] == 1 and verdict[1:] == bytes(32), verdict  # REFUSED
        assert replay.recv(1) == b""  # and closed
    wait_until("the GPU host to log the refusal", lambda: "its proof of the cluster key is wrong" in daemon.log(),
               log=daemon.log)


class Impostor:
    """A listener that greets as an Orion relay listener, takes any claim and answers PROVEN with a made-up proof:
    records what a relay sends it after its claim (it must be nothing)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.claims = 0
        self.after_claim = b""
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = self.sock.accept()
                with conn:
                    conn.sendall(GREETING.pack(MAGIC, os.urandom(32)))
                    if len(conn.recv(CLAIM.size, socket.MSG_WAITALL)) == CLAIM.size:
                        self.claims += 1
                        conn.sendall(VERDICT.pack(0, os.urandom(32)))
                        conn.settimeout(3)
                        with contextlib.suppress(OSError):
                            self.after_claim += conn.recv(4096)

    def close(self) -> None:
        self.sock.close()


@pytest.mark.parametrize("gpu_host", ["member", "other key", "impostor"])
def test_a_relaying_oriond_and_a_gpu_host_prove_themselves_to_each_other(
        gpu_host: str, tmp_path: Path, started: Callable[[Daemon], Daemon]) -> None:
    """docs/security.md: "the GPU host checks it and answers with HMAC(key, "server", ...), which the relaying
    oriond checks in turn, so neither end talks to an impostor"; docs/remote.md: a GPU host that refuses, or cannot
    be used, makes every CUDA call of a fixed route answer CUDA_ERROR_DEVICE_UNAVAILABLE. A member GPU host serves
    the relayed session (and names the relaying node: its host name, having no controller); a GPU host with
    another key refuses the relay's proof; an impostor that cannot prove itself gets nothing but the claim."""
    impostor = Impostor() if gpu_host == "impostor" else None
    port = impostor.port if impostor else free_port()
    if impostor is None:
        started(gpu_agent(tmp_path / "gpu", "127.0.0.1", port))  # the tests' key
    key = write_key(tmp_path / "relay.key", OTHER_KEY if gpu_host == "other key" else TEST_KEY)
    relay, region = oriond(tmp_path / "relay", f"[cluster]\n    key_file = {key}\n"
                                               f"[server-relay]\n    remote_addr = 127.0.0.1:{port}\n")
    started(relay)
    try:
        status, devices = guest_call(region)
        if gpu_host == "member":
            assert (status, devices) == (SUCCESS, 2), relay.log()
            wait_until("the GPU host to name the relaying node", lambda: f"member {socket.gethostname()})"
                       in Path(tmp_path / "gpu" / "agent.log").read_text())
            return
        assert (status, devices) == (DEVICE_UNAVAILABLE, 0), relay.log()
        if gpu_host == "other key":
            wait_until("the GPU host to log the refusal", lambda: "its proof of the cluster key is wrong"
                       in Path(tmp_path / "gpu" / "agent.log").read_text())
        said = ("refused this host's proof of the cluster key" if gpu_host == "other key"
                else "could not prove that it holds the cluster key")
        wait_until("the relaying oriond to say why", lambda: said in relay.log(), log=relay.log)
        if impostor is not None:
            assert impostor.claims >= 1 and impostor.after_claim == b"", impostor.after_claim[:64]
    finally:
        if impostor is not None:
            impostor.close()


def test_with_a_controller_a_relayed_session_without_an_allocation_is_refused_with_the_reason(
        tmp_path: Path, started: Callable[[Daemon], Daemon]) -> None:
    """docs/security.md: "with a controller configured, [the listener] accepts a session only with an allocation
    that the controller granted on this GPU host". A member relaying without one ([server-relay] remote_addr) is
    refused, and the relaying oriond says why. Before, the session was served outside the pool's count."""
    port = free_port()
    controller = f"127.0.0.1:{free_port()}"  # configured; nothing needs to answer there for this refusal
    started(gpu_agent(tmp_path / "gpu", "127.0.0.1", port, controller))
    key = write_key(tmp_path / "relay.key")
    relay, region = oriond(tmp_path / "relay", f"[cluster]\n    key_file = {key}\n"
                                               f"[server-relay]\n    remote_addr = 127.0.0.1:{port}\n")
    started(relay)
    assert guest_call(region) == (DEVICE_UNAVAILABLE, 0), relay.log()
    wait_until("the relaying oriond to give the GPU host's reason",
               lambda: "serves only vGPUs its Orion Controller granted: a relayed session must bring the allocation"
               in relay.log(), log=relay.log)


def _recording_executor(record: Path) -> Callable[[Session], CudaExecutor]:
    def factory(session: Session) -> CudaExecutor:
        record.write_text(session.relay_member)  # what BIND (confirming the grant) will bind it to
        driver = FakeDriver(devices=1)
        driver.cuInit(0)
        return CudaExecutor(session, driver=driver)
    return factory


def test_the_session_knows_the_node_that_proved_itself_before_bind(tmp_path: Path) -> None:
    """docs/security.md: the controller's grant is bound "to the relaying node that proved itself": the session
    the handler (and its BIND of RELAY_HELLO's allocation) is made for carries the name the handshake proved."""
    record = tmp_path / "member"
    listener, port = start_listener(_recording_executor(record))
    try:
        peer = RelayPeer.dial("127.0.0.1", port, name="edge-7")
        refused = peer.hello(allocation="alloc-1")  # no controller here: BIND refuses, after the handler was made
        assert refused.status == Status.REFUSED and b"controller" in bytes(refused.payload)
        assert record.read_text() == "edge-7"
        peer.frames.close()
    finally:
        listener.terminate()
        listener.join(10)
