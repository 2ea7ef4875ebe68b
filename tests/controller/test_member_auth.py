"""Issue 27, the controller's side of docs/security.md ("Who may talk to whom: the cluster key"): member-only
endpoints, what a guest may call without the key, one grant for exactly one session, and bounded registrations.

Real etcd, real controller processes over real HTTP (tests/controller/rig.py), real orionds (oriond_proc.py) and
a real host agent with the fake driver (fake_gpu_agent.py). Every test's docstring quotes the promise it holds.
Requests are signed as oriond signs them (rig.call(..., member=NAME), rig.member_client), or with a key, clock or
body of the test's choosing where the promise is about a bad signature.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from controller.cluster_key import make_key_file, sign_request
from ivshmem.channel import ClientChannel
from ivshmem.record import BIND_REQUEST, Op, Status
from ivshmem.region import Region
from ivshmem.shared.controller_client import ControllerClient, ControllerClientError
from tests.controller.oriond_proc import Oriond
from tests.controller.rig import (
    REPO,
    ControllerProcess,
    call,
    cluster_key_file,
    free_port,
    member_client,
    wait_until,
)
from tests.controller.test_guest_allocation import FakeGpuHost, gpu_host  # noqa: F401 (gpu_host: a fixture)
from tests.controller.test_leases import gone

pytestmark = pytest.mark.functional

GPU = {"uuid": "GPU-0", "name": "Tesla V100-PCIE-16GB", "memory_mib": 16160}
JSON = {"Content-Type": "application/json"}
CLI_TIMEOUT_S = 60


def gpus(host: str, n: int = 2) -> list[dict[str, object]]:
    return [{"uuid": f"GPU-{host}-{i}", "name": "V100", "memory_mib": 16160} for i in range(n)]


def register(ctl: ControllerProcess, host: str, n: int = 2) -> ControllerClient:
    """`host` registered by its own oriond (member `host`); that member's client."""
    client = member_client(ctl.address, host)
    client.register_host(host, gpus(host, n), ttl_s=600)
    return client


def state(ctl: ControllerProcess) -> tuple[Any, ...]:
    """What a request could have changed: the pool (without its revision) and every allocation."""
    observer = member_client(ctl.address, "observer")
    pool = observer.pool()
    pool.pop("revision")
    return pool, sorted((a["id"], a["confirmed"], json.dumps(a.get("bound_to"), sort_keys=True))
                        for a in observer.allocations())


def reason_of(path: str, text: str) -> str:
    return str(json.loads(text)["reason"]) if path.startswith("/api/") else text.removeprefix("Error: ").strip()


# Every member-only endpoint of docs/security.md, as (method, path, body) for a pool with host h1 and allocation
# {alloc} on it; each is what h1's oriond would send.
def member_only(alloc: str) -> list[tuple[str, str, str | None]]:
    info = {"device_ip": "h1", "device_id": "GPU-9", "device_index": 1, "memory": 100}
    return [
        ("POST", "/api/v1/hosts", json.dumps({"host": "h1", "gpus": gpus("h1", 1)})),
        ("POST", "/device/info", json.dumps(info)),
        ("POST", "/heartbeat/h1?res=nvidia_cuda&status=on", None),
        ("POST", "/heartbeat/h1?res=nvidia_cuda&status=continue", None),
        ("POST", "/heartbeat/h1?res=nvidia_cuda&status=off", None),
        ("POST", "/api/v1/hosts/h1/heartbeat", None),
        ("DELETE", "/api/v1/hosts/h1", None),
        ("POST", f"/api/v1/allocations/{alloc}/confirm", json.dumps({"host": "h1", "session": "s1"})),
        ("PUT", f"/service/confirm/{alloc}", None),
        ("POST", f"/service/confirm/{alloc}", None),
        ("POST", "/server-meta/h1", json.dumps({"os": "linux"})),
        ("POST", "/service/fullreport/h1", json.dumps({"allocation_list": [{"allocation_id": alloc}]})),
    ]


# ------------------------------------------------------------------------------------------------ item 1
def test_member_only_endpoints_refuse_a_request_without_a_signature(
        controllers: Callable[..., ControllerProcess]) -> None:
    """docs/security.md: "member-only endpoints — host registration (POST /api/v1/hosts, POST /device/info),
    heartbeats, host deletion, confirmation (binding) of an allocation, the list of every allocation,
    /server-meta — need an Authorization: Orion-HMAC ... header". Unsigned: 401 with a reason saying what to do,
    and nothing changes."""
    ctl = controllers()
    register(ctl, "h1")
    alloc = ControllerClient(ctl.address).allocate(1, 1000, ttl_s=600)["id"]
    before = state(ctl)
    for method, path, body in member_only(alloc):
        status, text = call(ctl, method, path, body, JSON if body else None)
        assert status == 401, (method, path, status, text)
        reason = reason_of(path, text)
        assert "members of the cluster" in reason and "cluster key" in reason and "docs/security.md" in reason, reason
        assert len(reason.splitlines()) == 1
        if path.startswith("/api/"):
            assert json.loads(text)["error"] == "unauthorized"
    assert state(ctl) == before
    conn_status, headers = _headers(ctl, "DELETE", "/api/v1/hosts/h1")
    assert conn_status == 401 and headers.get("WWW-Authenticate") == "Orion-HMAC"


def _headers(ctl: ControllerProcess, method: str, path: str) -> tuple[int, dict[str, str]]:
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", ctl.port, timeout=10)
    try:
        conn.request(method, path)
        resp = conn.getresponse()
        resp.read()
        return resp.status, dict(resp.getheaders())
    finally:
        conn.close()


def test_a_signature_that_does_not_verify_is_refused(controllers: Callable[..., ControllerProcess],
                                                     tmp_path: Path) -> None:
    """docs/security.md: the header is "HMAC(key, method, path, ts, SHA-256 of the body, NAME), the timestamp within
    60 s of the controller's clock". Another cluster's key, a body or path other than the signed one, a stale or
    future timestamp, a changed member name or a malformed header: 401, nothing changes."""
    ctl = controllers()
    register(ctl, "h1")
    before = state(ctl)
    key = cluster_key_file().read_bytes().strip()
    other = tmp_path / "other.key"
    make_key_file(other)
    other_key = other.read_bytes().strip()
    path, body = "/api/v1/hosts", json.dumps({"host": "h1", "gpus": gpus("h1", 1)})
    good = sign_request(key, "h1", "POST", path, body.encode())
    forged = [
        sign_request(other_key, "h1", "POST", path, body.encode()),  # not this cluster's key
        sign_request(key, "h1", "POST", path, b"{}"),  # signed another body
        sign_request(key, "h1", "POST", "/api/v1/hosts/h1/heartbeat", body.encode()),  # signed another path
        sign_request(key, "h1", "PUT", path, body.encode()),  # signed another method
        sign_request(key, "h1", "POST", path, body.encode(), now=time.time() - 120),  # stale
        sign_request(key, "h1", "POST", path, body.encode(), now=time.time() + 120),  # from the future
        good.replace('member="h1"', 'member="h2"'),  # the MAC is over the member's name too
        good.replace("Orion-HMAC", "Bearer"),
        'Orion-HMAC member="h1", ts="1", mac="zz"',
        "Orion-HMAC",
    ]
    for header in forged:
        status, text = call(ctl, "POST", path, body, {**JSON, "Authorization": header})
        assert status == 401, (header, status, text)
        assert "does not verify" in json.loads(text)["reason"] and "within 60 s" in json.loads(text)["reason"]
    # a header that does not verify is refused on a guest's endpoint too, rather than read as a guest's request
    status, text = call(ctl, "GET", "/api/v1/allocations", None, {"Authorization": forged[0]})
    assert status == 401, text
    assert state(ctl) == before
    status, text = call(ctl, "POST", path, body, {**JSON, "Authorization": good})
    assert status == 201, text  # the same request, signed right


def test_a_member_changes_only_its_own_hosts_records(controllers: Callable[..., ControllerProcess]) -> None:
    """docs/security.md: "A host's record is created, changed and deleted only by the member of that name: a request
    signed by another member is 403"."""
    ctl = controllers()
    register(ctl, "h1")
    alloc = ControllerClient(ctl.address).allocate(1, 1000, ttl_s=600)["id"]
    before = state(ctl)
    for method, path, body in member_only(alloc):
        if "confirm" in path:
            continue  # an allocation is not a host's record: test_one_grant_binds_exactly_one_session
        status, text = call(ctl, method, path, body, JSON if body else None, member="h2")
        assert status == 403, (method, path, status, text)
        reason = reason_of(path, text)
        assert "member h2 may not" in reason and "host h1" in reason, reason
    status, text = call(ctl, "POST", f"/api/v1/allocations/{alloc}/confirm", json.dumps({"host": "h1"}), JSON,
                        member="h2")
    assert status == 403 and "as host h1" in json.loads(text)["reason"], text  # nor confirm in another's name
    assert state(ctl) == before


def test_a_guest_calls_its_own_endpoints_without_the_key_and_sees_no_ids(
        controllers: Callable[..., ControllerProcess]) -> None:
    """docs/security.md: "what a guest or a pod may call without the key: allocate, keep alive, read and release
    its own allocation (its id is a 128-bit random secret only the caller was given), the pool's summary, health,
    info and metrics. GET /api/v1/allocations without a member's signature lists counts, never ids"."""
    ctl = controllers()
    register(ctl, "h1")
    guest = ControllerClient(ctl.address)
    mine = guest.allocate(1, 1000)
    assert guest.keepalive(mine["id"]) > 0
    assert guest.allocation(mine["id"])["id"] == mine["id"]
    assert guest.pool()["vgpus_free"] == 7 and guest.health() == {"etcd": "ok"} and guest.info()["api_version"]
    assert call(ctl, "GET", "/devices?res=nvidia_cuda&used=true") == (200, "nvidia_cuda=7")
    orion = call(ctl, "GET", "/service?nvidia_vgpu=1")
    assert orion[0] == 200
    status, text = call(ctl, "GET", "/api/v1/allocations")
    assert status == 200 and json.loads(text) == {"count": 2, "confirmed": 0}
    assert mine["id"] not in text and orion[1].split(",")[0] not in text
    metrics = call(ctl, "GET", "/metrics")[1]
    assert "orion_controller_allocations 2.0" in metrics and mine["id"] not in metrics
    with pytest.raises(ControllerClientError) as exc:
        guest.allocations()
    assert exc.value.status == 401 and "members of the cluster only" in exc.value.reason
    listed = member_client(ctl.address, "h1").allocations()  # a member sees them all
    assert sorted(a["id"] for a in listed) == sorted([mine["id"], orion[1].split(",")[0]])
    guest.release(mine["id"])
    assert call(ctl, "PUT", f"/service/release/{orion[1].split(',')[0]}")[0] == 200
    assert guest.allocation_count() == 0 and guest.pool()["vgpus_free"] == 8


def test_allocation_ids_are_128_random_bits(controllers: Callable[..., ControllerProcess]) -> None:
    """docs/security.md: "its id is a 128-bit random secret only the caller was given"."""
    ctl = controllers()
    register(ctl, "h1", 8)
    guest = ControllerClient(ctl.address)
    ids = [guest.allocate(1, 100, ttl_s=60)["id"] for _ in range(16)]
    ids += [call(ctl, "GET", "/service?nvidia_vgpu=1&memory=100")[1].split(",")[0] for _ in range(16)]
    assert all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids), ids  # 32 hex digits: 128 bits, no uuid4 version bits
    assert len(set(ids)) == len(ids)


def _start(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "controller", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=CLI_TIMEOUT_S, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})


def test_the_controller_does_not_start_without_a_usable_key(etcd: Any, tmp_path: Path) -> None:
    """docs/security.md: "oriond, the controller and the plugin refuse a key file that is a link, not a regular
    file, not owned by the user reading it, readable by group or others, or shorter than 32 bytes, in one line that
    says how to fix it"; the controller gets --key-file (default /etc/orion/cluster.key)."""
    readable = tmp_path / "readable.key"
    make_key_file(readable)
    readable.chmod(0o640)
    short = tmp_path / "short.key"
    short.write_text("0123456789\n")
    short.chmod(0o600)
    link = tmp_path / "link.key"
    link.symlink_to(cluster_key_file())
    cases = [(tmp_path / "missing.key", "does not exist"), (readable, "chmod 600"), (short, "holds 10 bytes"),
             (link, "not a link"), (tmp_path, "not a regular file")]
    for path, words in cases:
        port = free_port()
        done = _start(["start", "--listen", f"127.0.0.1:{port}", "--etcd", etcd.url, "--key-file", str(path)])
        assert done.returncode == 1, (path, done.stderr)
        assert len(done.stderr.splitlines()) == 1 and words in done.stderr, done.stderr
        assert done.stderr.startswith(f"orion-controller: cluster key {path} ") and "--key-file" in done.stderr
        assert "Traceback" not in done.stderr
    empty = _start(["start", "--etcd", etcd.url, "--key-file", ""])
    assert empty.returncode == 2 and empty.stderr == ("orion-controller: --key-file '': give the path of the cluster "
                                                      "key, e.g. /etc/orion/cluster.key\n")
    for flag, value, words in [("--max-gpus-per-host", "0", "use 1 to 10000"),
                               ("--max-vgpus-per-gpu", "101", "use 1 to 100"),
                               ("--max-body-kib", "1", "use 4 to 65536")]:
        done = _start(["start", "--etcd", etcd.url, flag, value])
        assert done.returncode == 2 and done.stderr == f"orion-controller: {flag} {value}: {words}" + (
            " (default 1024)\n" if flag == "--max-body-kib" else "\n"), done.stderr


def test_cluster_key_makes_a_key_the_controller_accepts(tmp_path: Path,
                                                        controllers: Callable[..., ControllerProcess]) -> None:
    """docs/security.md: "`orion-controller cluster-key PATH` makes one"; it never overwrites a key."""
    path = tmp_path / "etc" / "cluster.key"
    made = _start(["cluster-key", str(path)])
    assert made.returncode == 0, made.stderr
    assert (os.stat(path).st_mode & 0o777) == 0o600 and len(path.read_bytes().strip()) >= 32
    again = _start(["cluster-key", str(path)])
    assert again.returncode == 1 and "exists already" in again.stderr and len(again.stderr.splitlines()) == 1
    ctl = controllers(extra=["--key-file", str(path)])
    assert ControllerClient(ctl.address).health() == {"etcd": "ok"}
    status, _ = call(ctl, "POST", "/api/v1/hosts/h1/heartbeat", member="h1")  # the tests' key is not this one
    assert status == 401


# ------------------------------------------------------------------------------------------------ item 2
def _oriond_with_key(tmp_path: Path, controller: str, key: Path, bind: str) -> Oriond:
    agent = Oriond(tmp_path / bind, bind, controller, gpus("x", 1))
    agent.conf.write_text(agent.conf.read_text().replace(str(cluster_key_file()), str(key)))
    (agent.shm / "orionsock0").write_bytes(b"")
    os.truncate(agent.shm / "orionsock0", 32 << 20)  # blank: oriond formats and serves it
    return agent.start()


def test_an_oriond_without_a_usable_key_says_so_once_registers_nothing_and_serves_its_regions(
        controllers: Callable[..., ControllerProcess], tmp_path: Path) -> None:
    """docs/security.md: oriond refuses a key file it cannot use "in one line that says how to fix it"; it does not
    register (the controller would refuse a non-member) and keeps serving its regions."""
    ctl = controllers()
    agent = _oriond_with_key(tmp_path, ctl.address, tmp_path / "nowhere.key", "127.0.0.51")
    try:
        wait_until("oriond to serve its region", lambda: "Using SHM orionsock0" in agent.log(), log=agent.log)
        wait_until("oriond to say why it does not register", lambda: "not registering with Orion Controller"
                   in agent.log(), log=agent.log)
        lines = [ln for ln in agent.log().splitlines() if "not registering with Orion Controller" in ln]
        assert len(lines) == 1 and "does not exist" in lines[0] and "cluster-key" in lines[0], lines
        assert "Connecting to Orion Controller" not in agent.log()  # registration was not attempted
        assert agent.alive()
        routes = call(ctl, "GET", "/metrics")[1]
        assert 'route="/api/v1/hosts"' not in routes and ControllerClient(ctl.address).pool()["hosts"] == []
    finally:
        assert agent.stop() == 0, agent.log()


def test_an_oriond_holding_another_clusters_key_is_refused_and_says_so(
        controllers: Callable[..., ControllerProcess], tmp_path: Path) -> None:
    """docs/security.md: the controller's member-only endpoints need the cluster key's signature; oriond signs as
    the host it registers as. A key of another cluster: the registration is refused (401), once, in one line."""
    ctl = controllers()
    other = tmp_path / "other.key"
    make_key_file(other)
    agent = _oriond_with_key(tmp_path, ctl.address, other, "127.0.0.52")
    try:
        wait_until("oriond to log the refusal", lambda: "refused this host" in agent.log(), log=agent.log)
        assert "does not verify" in agent.log() and agent.log().count("refused this host") == 1
        assert ControllerClient(ctl.address).pool()["hosts"] == [] and agent.alive()
    finally:
        agent.stop()


# ------------------------------------------------------------------------------------------------ item 3
def test_one_grant_binds_exactly_one_session(controllers: Callable[..., ControllerProcess]) -> None:
    """docs/security.md: the GPU host "binds it with its own controller, which binds a grant to exactly one session:
    a second session naming the same allocation, from anywhere, is refused"."""
    ctl = controllers()
    h1 = register(ctl, "h1")
    h2 = register(ctl, "h2")
    alloc = ControllerClient(ctl.address).allocate(1, 1000, host="h1")["id"]
    bound = h1.confirm(alloc, "h1", session="11-aa")
    assert bound["bound_to"] == {"host": "h1", "session": "11-aa", "relay_member": ""}
    assert h1.confirm(alloc, "h1", session="11-aa")["confirmed"] is True  # the same session again: accepted
    for session, relay_member in [("12-bb", ""), ("", "")]:
        with pytest.raises(ControllerClientError) as exc:
            h1.confirm(alloc, "h1", session=session, relay_member=relay_member)
        assert (exc.value.status, exc.value.code) == (409, "already_bound"), exc.value.reason
        assert "taken up by another session" in exc.value.reason
    status, text = call(ctl, "PUT", f"/service/confirm/{alloc}", member="h1")  # Orion's confirm names no session
    assert status == 409 and "another session" in text
    with pytest.raises(ControllerClientError) as exc:  # a member other than the allocation's GPU host
        h2.confirm(alloc, "h2", session="11-aa")
    assert (exc.value.status, exc.value.code) == (409, "wrong_host") and "granted on host h1" in exc.value.reason
    assert call(ctl, "PUT", f"/service/confirm/{alloc}", member="h2")[0] == 409
    assert ControllerClient(ctl.address).allocation(alloc)["bound_to"] == bound["bound_to"]


def test_two_controllers_confirming_one_grant_for_two_sessions_at_once_bind_one(
        controllers: Callable[..., ControllerProcess]) -> None:
    """docs/security.md: "binds a grant to exactly one session" — atomically in etcd: two confirms racing through two
    controllers for two sessions bind one, the other is refused."""
    a, b = controllers(), controllers()
    register(a, "h1", 4)
    guest = ControllerClient(a.address)
    for _ in range(12):
        alloc = guest.allocate(1, 100, ttl_s=60)["id"]
        results: list[int] = []
        gate = threading.Barrier(2)

        def confirm(ctl: ControllerProcess, session: str, alloc: str = alloc, gate: threading.Barrier = gate,
                    results: list[int] = results) -> None:
            client = member_client(ctl.address, "h1")
            gate.wait()
            try:
                client.confirm(alloc, "h1", session=session)
                results.append(200)
            except ControllerClientError as exc:
                results.append(exc.status)

        threads = [threading.Thread(target=confirm, args=(ctl, s)) for ctl, s in ((a, "1-x"), (b, "2-y"))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert sorted(results) == [200, 409], results
        guest.release(alloc)


def test_a_grant_is_given_back_only_for_the_session_bound_to_it(controllers: Callable[..., ControllerProcess]) -> None:
    """docs/security.md: "the grant is released when that session ends, never before": a GPU host's release names
    the session; one for another session, or by another member, is refused and changes nothing."""
    ctl = controllers()
    h1, h2 = register(ctl, "h1"), register(ctl, "h2")
    alloc = ControllerClient(ctl.address).allocate(1, 1000, host="h1")["id"]
    with pytest.raises(ControllerClientError) as exc:
        h1.release(alloc, session="7-aa")  # no session took it up yet
    assert (exc.value.status, exc.value.code) == (409, "wrong_session")
    h1.confirm(alloc, "h1", session="7-aa")
    with pytest.raises(ControllerClientError) as exc:
        h1.release(alloc, session="8-bb")  # a session that was refused the grant
    assert (exc.value.status, exc.value.code) == (409, "wrong_session") and "session 8-bb" in exc.value.reason
    with pytest.raises(ControllerClientError) as exc:
        h2.release(alloc)  # another host's oriond
    assert exc.value.status == 403
    assert call(ctl, "PUT", f"/service/release/{alloc}?session=8-bb", member="h1")[0] == 409
    assert ControllerClient(ctl.address).allocation(alloc)["confirmed"] is True  # still held
    h1.release(alloc, session="7-aa")
    assert gone(ControllerClient(ctl.address), alloc)


def test_a_relayed_bind_must_come_from_the_host_the_grant_was_asked_for(
        controllers: Callable[..., ControllerProcess]) -> None:
    """docs/security.md: the GPU host accepts "a session only with an allocation that the controller granted on this
    GPU host to the relaying node that proved itself": a grant asked for one host (the guest's: `host`, or the
    relaying host it is served by: `origin`) binds only a session of that host."""
    ctl = controllers()
    gpu = register(ctl, "gpu")
    guest = ControllerClient(ctl.address)
    relayed = guest.allocate(1, 1000, origin="relay-a")  # a guest on relay-only host relay-a
    assert relayed["origin"] == "relay-a"
    for relay_member in ("relay-b", ""):  # another relaying member, or a session local to the GPU host
        with pytest.raises(ControllerClientError) as exc:
            gpu.confirm(relayed["id"], "gpu", session="1-a", relay_member=relay_member, relay="10.0.0.9:4000",
                        transport="tcp")
        assert exc.value.status == 403 and "asked for host relay-a" in exc.value.reason, exc.value.reason
    assert gpu.confirm(relayed["id"], "gpu", session="1-a", relay_member="relay-a", relay="10.0.0.1:4000",
                       transport="tcp")["bound_to"]["relay_member"] == "relay-a"
    local = guest.allocate(1, 1000, host="gpu")  # a guest of the GPU host itself
    with pytest.raises(ControllerClientError) as exc:
        gpu.confirm(local["id"], "gpu", session="2-b", relay_member="relay-a")
    assert exc.value.status == 403 and "relayed by relay-a" in exc.value.reason
    assert gpu.confirm(local["id"], "gpu", session="2-b")["confirmed"] is True


def test_a_second_session_replaying_a_bound_grant_is_refused_and_cannot_release_it(
        controllers: Callable[..., ControllerProcess], gpu_host: Callable[..., FakeGpuHost]) -> None:  # noqa: F811
    """docs/security.md: "a second session naming the same allocation, from anywhere, is refused, and the grant is
    released when that session ends, never before" — with a real host agent: two sessions of one region BIND one
    allocation; the second is refused; its end gives nothing back; the owner's end does."""
    ctl = controllers(extra=["--lease-ttl", "600"])  # only the agent's release can free it in this test
    client = member_client(ctl.address, "observer")
    agent = gpu_host(ctl.address, client=client)
    alloc = ControllerClient(ctl.address).allocate(1, 1000, host="h1")["id"]
    region = Region.open(str(agent.region))
    try:
        with ClientChannel.claim(region) as owner:
            assert owner.call(Op.BIND, BIND_REQUEST.encode(alloc)).ok
            with ClientChannel.claim(region) as replay:
                reply = replay.call(Op.BIND, BIND_REQUEST.encode(alloc))
                assert reply.status == Status.REFUSED, reply
                assert b"taken up by another session" in bytes(reply.payload), bytes(reply.payload)
            bound = client.allocation(alloc)["bound_to"]
            assert bound["host"] == "h1" and bound["session"] and bound["relay_member"] == ""
            wait_until("the replaying session to end", lambda: agent.log().count(" exits.") >= 1, log=agent.log)
            time.sleep(1.0)  # what its end could have set off (a release) has had time to reach the controller
            assert client.allocation(alloc)["bound_to"] == bound, agent.log()
        wait_until("the owner's grant to be given back when its session ends", lambda: gone(client, alloc),
                   log=agent.log)
        said = f"Release resource with allocation ID {alloc}"
        wait_until("the agent to say it gave the grant back", lambda: said in agent.log(), log=agent.log)
        assert agent.log().count(said) == 1
    finally:
        region.close()


# ------------------------------------------------------------------------------------------------ item 4
def test_registrations_are_bounded_and_each_bound_names_its_limit(
        controllers: Callable[..., ControllerProcess]) -> None:
    """docs/security.md: the controller "bounds what one request can make it do (docs/controller.md, Limits): body
    size ..., GPUs per registered host and vGPUs per GPU, each refused with a 4xx naming the limit"."""
    ctl = controllers()
    register(ctl, "h1")
    before = state(ctl)
    many = {"host": "h1", "gpus": [{**GPU, "uuid": f"GPU-{i}"} for i in range(65)]}
    refused = [
        ("/api/v1/hosts", many, "gpus lists 65 GPUs (a host registers at most 64 GPUs, indices 0 to 63: "
                                "orion-controller --max-gpus-per-host"),
        ("/api/v1/hosts", {"host": "h1", "gpus": [{**GPU, "index": 64}]},
         "gpus[0].index must be an integer from 0 to 63, got 64 (a host registers at most 64"),
        ("/api/v1/hosts", {"host": "h1", "gpus": [{**GPU, "vgpu_count": 101}]}, "gpus[0].vgpu_count must be an "
         "integer from 1 to 100, got 101 (a GPU is carved into at most 100 vGPUs: orion-controller "
         "--max-vgpus-per-gpu"),
        ("/api/v1/hosts", {"host": "h1", "vgpu_count": 101, "gpus": []}, "at most 100 vGPUs"),
        ("/device/info", {"device_ip": "h1", "device_id": "GPU-x", "device_index": 64, "memory": 100},
         "device_index must be an integer from 0 to 63, got 64 (a host registers at most 64 GPUs"),
        ("/device/info", {"device_ip": "h1", "device_id": "GPU-x", "device_index": 1, "memory": 100,
                          "vdevice_num": 101}, "at most 100 vGPUs: orion-controller --max-vgpus-per-gpu"),
    ]
    for path, body, words in refused:
        status, text = call(ctl, "POST", path, json.dumps(body), JSON, member="h1")
        assert status == 400 and words in reason_of(path, text), (path, text)
    status, text = call(ctl, "POST", "/api/v1/hosts", json.dumps({"host": "h1", "gpus": []}) + " " * (1 << 20), JSON,
                        member="h1")
    assert status == 413 and "the limit is 1024 KiB (orion-controller --max-body-kib" in json.loads(text)["reason"]
    assert state(ctl) == before
    ok = {"host": "h1", "gpus": [{**GPU, "uuid": f"GPU-{i}", "vgpu_count": 100} for i in range(64)]}
    assert call(ctl, "POST", "/api/v1/hosts", json.dumps(ok), JSON, member="h1")[0] == 201  # at the limits: fine


def test_the_registration_limits_follow_the_flags(controllers: Callable[..., ControllerProcess]) -> None:
    """docs/controller.md, Limits: --max-gpus-per-host, --max-vgpus-per-gpu and --max-body-kib set the bounds
    docs/security.md promises ("each refused with a 4xx naming the limit")."""
    ctl = controllers(extra=["--max-gpus-per-host", "4", "--max-vgpus-per-gpu", "8", "--max-body-kib", "16"])
    for body, words in [({"host": "h1", "gpus": [{**GPU, "uuid": f"GPU-{i}"} for i in range(5)]}, "at most 4 GPUs"),
                        ({"host": "h1", "gpus": [{**GPU, "vgpu_count": 9}]}, "from 1 to 8, got 9"),
                        ({"host": "h1", "vgpu_count": 9, "gpus": []}, "at most 8 vGPUs")]:
        status, text = call(ctl, "POST", "/api/v1/hosts", json.dumps(body), JSON, member="h1")
        assert status == 400 and words in json.loads(text)["reason"], text
    status, text = call(ctl, "POST", "/api/v1/hosts", "x" * (17 << 10), JSON, member="h1")
    assert status == 413 and "the limit is 16 KiB" in json.loads(text)["reason"], text
    status, text = call(ctl, "POST", "/api/v1/allocations", json.dumps({"vgpus": 1, "client": "x" * 200}) +
                        " " * (17 << 10), JSON)
    assert status == 413  # a guest's body too
    assert ControllerClient(ctl.address).pool()["hosts"] == []


def test_the_three_attacks_of_issue_27_now_get_401_and_change_nothing(
        controllers: Callable[..., ControllerProcess]) -> None:
    """docs/security.md: host registration, heartbeats and host deletion are member-only, and "a host's record is
    created, changed and deleted only by the member of that name". Issue 27's attacks, unsigned and signed by
    another member: 10,000 made-up GPUs registered; a node re-registered with 1,000,000 vGPUs; a node deleted."""
    ctl = controllers()
    node = register(ctl, "node-1")
    before = state(ctl)
    flood = {"host": "intruder", "gpus": [{**GPU, "uuid": f"GPU-{i:05d}"} for i in range(10_000)]}
    takeover = {"host": "node-1", "vgpu_count": 100,
                "gpus": [{**GPU, "uuid": f"GPU-{i:05d}", "vgpu_count": 100} for i in range(10_000)]}
    attacks: list[tuple[str, str, str | None]] = [
        ("POST", "/api/v1/hosts", json.dumps(flood)),
        ("POST", "/api/v1/hosts", json.dumps(takeover)),
        ("POST", "/heartbeat/node-1?res=nvidia_cuda&status=on", None),  # Orion's re-registration: an empty list
        ("DELETE", "/api/v1/hosts/node-1", None),
        ("POST", "/heartbeat/node-1?res=nvidia_cuda&status=off", None),
    ]
    for method, path, body in attacks:
        status, text = call(ctl, method, path, body, JSON if body else None)
        assert status == 401, (method, path, text[:300])
        if "intruder" not in (body or ""):
            status, text = call(ctl, method, path, body, JSON if body else None, member="node-2")
            assert status in (400, 403), (method, path, text[:300])  # a member's flood is bounded (400) first
    assert state(ctl) == before
    assert [h["host"] for h in ControllerClient(ctl.address).pool("node-1")["hosts"]] == ["node-1"]
    assert node.heartbeat("node-1") > 0  # the node itself still may


def test_orions_full_report_keeps_its_hosts_allocations_alive(controllers: Callable[..., ControllerProcess]) -> None:
    """issue 31: `POST /service/fullreport/<server>` (Orion's oriond, Sept 2019) was taken by /service/<alloc>/<server>
    and answered `allocation fullreport does not exist`. It keeps alive what it lists on its own host, skips what is
    gone, and refuses a malformed list."""
    ctl = controllers()
    register(ctl, "h1")
    alloc = ControllerClient(ctl.address).allocate(1, 1000, ttl_s=2)["id"]
    report = json.dumps({"allocation_list": [{"allocation_id": alloc, "resource": "nvidia_cuda"},
                                             {"allocation_id": "gone-long-ago"}], "resource_list": []})
    deadline = time.monotonic() + 5  # more than twice the lease: only the reports keep it
    while time.monotonic() < deadline:
        assert call(ctl, "POST", "/service/fullreport/h1", report, JSON, member="h1") == (200, "OK")
        time.sleep(0.5)
    observer = member_client(ctl.address, "observer")
    assert not gone(observer, alloc)
    for body in ('{"allocation_list": {}}', '{"allocation_list": [{"allocation_id": 7}]}', "[]"):
        status, text = call(ctl, "POST", "/service/fullreport/h1", body, JSON, member="h1")
        assert status == 400 and "Traceback" not in text, (body, status, text)
    until = time.monotonic() + 30
    while not gone(observer, alloc):  # no more reports: the lease runs out
        assert time.monotonic() < until, "the allocation outlived its lease without reports"
        time.sleep(0.2)
