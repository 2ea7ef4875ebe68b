"""The controller process over HTTP: Orion's endpoints, the JSON API, /metrics, malformed requests, the CLI.

Each test starts a real ``orion-controller`` process on the shared etcd (its own key root) and talks to it as
oriond, orion-check or a client would.
"""
from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from ivshmem.shared.controller_client import ControllerClient, ControllerClientError
from tests.controller.rig import (
    REPO,
    ControllerProcess,
    EtcdServer,
    call,
    cluster_key_file,
    free_port,
    member_client,
    wait_until,
)

pytestmark = pytest.mark.functional

CLI_TIMEOUT_S = 60


def two_v100(host: str) -> list[dict[str, object]]:
    return [{"uuid": f"GPU-{host}-{i}", "name": "Tesla V100-PCIE-16GB", "memory_mib": 16160} for i in range(2)]


def test_start_prints_orions_lines_and_info_answers(controllers: Callable[..., ControllerProcess]) -> None:
    ctl = controllers()
    log = ctl.log()
    lines = ["Creating database connection to ", "Database connection is created.",
             f"Orion CE Controller is launching, listening on {ctl.address}"]
    positions = [log.find(line) for line in lines]
    assert -1 not in positions and positions == sorted(positions), log
    assert 'level=info msg="Database connection is created."' in log
    assert call(ctl, "GET", "/info?data_version&api_version") == (200, "data_version=0.2,api_version=0.2")
    assert ControllerClient(ctl.address).info()["api_version"] == "0.2"


def test_orion_server_and_client_flow(controllers: Callable[..., ControllerProcess]) -> None:
    """oriond registers (heartbeat on, device/info), a client gets vGPUs, oriond confirms and releases; oriond's
    calls are signed as member 127.0.0.1 (docs/security.md)."""
    ctl = controllers()
    hdr = {"api_version": "0.2", "data_version": "0.2"}
    oriond = "127.0.0.1"
    assert call(ctl, "POST", "/heartbeat/127.0.0.1?res=nvidia_cuda&status=on", headers=hdr, member=oriond)[0] == 200
    for i in range(2):
        info = {"device_meta": {"device_id": f"GPU-36945fda-{i}", "device_index": i, "device_ip": "127.0.0.1",
                                "device_port": 9960, "device_name": "Tesla V100-PCIE-16GB", "vdevice_num": 4},
                "static_meta": {"memory": 16160, "driver_version": "580"}}
        status, body = call(ctl, "POST", "/device/info", json.dumps(info), {"Content-Type": "application/json"},
                            member=oriond)
        assert status == 200, body
    # orion-check reads ${result##*=}
    assert call(ctl, "GET", "/devices?res=nvidia_cuda", headers=hdr)[1].rsplit("=", 1)[1] == "8"
    assert call(ctl, "GET", "/devices?res=nvidia_cuda&used=true", headers=hdr)[1].rsplit("=", 1)[1] == "8"

    status, body = call(ctl, "GET", "/service?nvidia_vgpu=2&memory=7500", headers={**hdr, "group_id": "g-1"})
    assert status == 200, body
    alloc_id, *devices = body.split(",")
    p = devices[0].split("/")[1]  # both on one GPU; which of the two idle ones is the controller's tie-break
    assert devices == [f"127.0.0.1:9960/{p}/0", f"127.0.0.1:9960/{p}/1"]
    assert call(ctl, "GET", "/devices?res=nvidia_cuda&used=true")[1] == "nvidia_cuda=6"

    status, body = call(ctl, "POST", f"/service/{alloc_id}/127.0.0.1", headers={"group_id": "g-1"})
    assert status == 200
    assert body == (f"nvidia_cuda;127.0.0.1,9960,GPU-36945fda-{p},{p},0,46,7500;"
                    f"127.0.0.1,9960,GPU-36945fda-{p},{p},1,46,7500")
    assert call(ctl, "PUT", f"/service/confirm/{alloc_id}", member=oriond)[0] == 200
    assert ControllerClient(ctl.address).allocation(alloc_id)["confirmed"] is True
    assert call(ctl, "POST", "/heartbeat/127.0.0.1?res=nvidia_cuda&status=continue", member=oriond)[0] == 200
    assert call(ctl, "PUT", f"/service/release/{alloc_id}")[0] == 200
    assert call(ctl, "GET", "/devices?res=nvidia_cuda&used=true")[1] == "nvidia_cuda=8"
    assert call(ctl, "POST", "/heartbeat/127.0.0.1?res=nvidia_cuda&status=off", member=oriond)[0] == 200
    assert call(ctl, "GET", "/devices?res=nvidia_cuda")[1] == "nvidia_cuda=0"
    log = ctl.log()
    for line in ("Received API (method:POST; api version:0.2; data version:0.2; client ID:; group ID:) : "
                 "/heartbeat/127.0.0.1 res=nvidia_cuda&status=on",
                 "Adding new host for NVidia GPU : 127.0.0.1",
                 "Adding new NVidia GPU to host 127.0.0.1 (GPU-36945fda-0; Tesla V100-PCIE-16GB)",
                 f"Return formated resource : {alloc_id},127.0.0.1:9960/{p}/0,127.0.0.1:9960/{p}/1",
                 f"Confirm allocation {alloc_id} with device : 127.0.0.1/{p}/0,127.0.0.1/{p}/1",
                 f"Release resource with allocation ID {alloc_id}"):
        assert line in log, line


def test_json_api_flow(controllers: Callable[..., ControllerProcess]) -> None:
    ctl = controllers()
    client = member_client(ctl.address, "gpu-host-1")
    reg = client.register_host("gpu-host-1", two_v100("h1"), port=9961, address="192.168.7.1")
    assert reg["gpus"] == 2
    pool = client.pool()
    assert (pool["vgpus_total"], pool["vgpus_free"]) == (8, 8)
    alloc = client.allocate(2, 15500, client="pytest")
    assert (alloc["host"], alloc["address"], alloc["port"]) == ("gpu-host-1", "192.168.7.1", 9961)
    assert sorted(v["gpu"] for v in alloc["vgpus"]) == [0, 1]
    assert client.allocation(alloc["id"]) == alloc
    assert [a["id"] for a in client.allocations()] == [alloc["id"]]
    assert client.keepalive(alloc["id"]) > 0
    with pytest.raises(ControllerClientError) as exc:
        member_client(ctl.address, "gpu-host-2").confirm(alloc["id"], host="gpu-host-2")
    assert (exc.value.status, exc.value.code) == (409, "wrong_host")
    assert "granted on host gpu-host-1" in exc.value.reason
    assert client.confirm(alloc["id"], host="gpu-host-1")["confirmed"] is True
    assert client.pool()["vgpus_free"] == 6
    client.release(alloc["id"])
    assert client.pool()["vgpus_free"] == 8
    status, body = call(ctl, "GET", f"/api/v1/allocations/{alloc['id']}")
    assert status == 404 and "does not exist" in json.loads(body)["reason"]
    assert client.heartbeat("gpu-host-1") > 0
    client.unregister_host("gpu-host-1")
    assert client.pool()["vgpus_total"] == 0


MALFORMED = [
    # (method, path, body, status, words the reason must contain)
    ("POST", "/api/v1/allocations", "", 400, "empty"),
    ("POST", "/api/v1/allocations", "{bad", 400, "not valid JSON"),
    ("POST", "/api/v1/allocations", "[1]", 400, "JSON object"),
    ("POST", "/api/v1/allocations", '{"vgpus": 0}', 400, "vgpus must be an integer from 1"),
    ("POST", "/api/v1/allocations", '{"vgpus": "two"}', 400, "vgpus must be an integer"),
    ("POST", "/api/v1/allocations", '{"vgpus": true}', 400, "vgpus must be an integer"),
    ("POST", "/api/v1/allocations", '{"memory_mib": 100}', 400, "vgpus is required"),
    ("POST", "/api/v1/allocations", '{"vgpus": 1, "memory_mib": -5}', 400, "memory_mib must be"),
    ("POST", "/api/v1/allocations", '{"vgpus": 1, "ttl_s": 100000}', 400, "ttl_s must be"),
    ("POST", "/api/v1/allocations", '{"vgpus": 1, "colour": "red"}', 400, "unknown field(s) colour"),
    ("POST", "/api/v1/hosts", '{"gpus": []}', 400, "host is required"),
    ("POST", "/api/v1/hosts", '{"host": "a/b", "gpus": []}', 400, "not a valid name"),
    ("POST", "/api/v1/hosts", '{"host": "h", "gpus": "none"}', 400, "gpus is required"),
    ("POST", "/api/v1/hosts", '{"host": "h", "gpus": [{"uuid": "x"}]}', 400, "gpus[0].memory_mib is required"),
    ("POST", "/api/v1/hosts", '{"host": "h", "vgpu_count": 101, "gpus": []}', 400, "vgpu_count must be"),
    ("POST", "/api/v1/hosts", '{"host": "h", "gpus": [{"uuid": "x", "memory_mib": 1, "index": 0}, '
                              '{"uuid": "y", "memory_mib": 1, "index": 0}]}', 400, "duplicate indices"),
    ("POST", "/api/v1/hosts/never-seen/heartbeat", None, 404, "not registered"),
    ("GET", "/service", None, 400, "nvidia_vgpu (ORION_VGPU) is required"),
    ("GET", "/service?nvidia_vgpu=abc", None, 400, "must be an integer"),
    ("GET", "/service?nvidia_vgpu=1&memory=0", None, 400, "memory (ORION_GMEM, MiB) must be"),
    ("GET", "/devices", None, 400, "use res=nvidia_cuda"),
    ("GET", "/devices?res=amd_rocm", None, 400, "use res=nvidia_cuda"),
    ("GET", "/devices?res=nvidia_cuda&used=maybe", None, 400, "used=true"),
    ("POST", "/heartbeat/1.2.3.4?res=nvidia_cuda&status=dance", None, 400, "status=on"),
    ("POST", "/heartbeat/1.2.3.4?res=nvidia_cuda&status=continue", None, 404, "not registered"),
    ("POST", "/device/info", "{}", 400, "device_ip"),
    ("POST", "/device/info", '{"device_ip": "9.9.9.9", "device_id": "GPU-1", "device_index": 0, "memory": 100}',
     404, "status=on first"),
    ("GET", "/api/v1/allocations/no-such-id", None, 404, "does not exist"),
    ("POST", "/api/v1/allocations/no-such-id/keepalive", None, 404, "does not exist"),
    ("DELETE", "/api/v1/allocations/no-such-id", None, 404, "does not exist"),
    ("PUT", "/service/release/no-such-id", None, 404, "does not exist"),
    ("GET", "/nowhere", None, 404, "no endpoint GET /nowhere"),
    ("PUT", "/api/v1/allocations", None, 405, "PUT is not allowed"),
    ("POST", "/api/v1/allocations", "x" * (2 << 20), 413, "too large"),
]
# who signs each request of MALFORMED (docs/security.md): the host it names, where it names one
MEMBER_OF = {"/device/info": "9.9.9.9", "/api/v1/hosts/never-seen/heartbeat": "never-seen",
             "/heartbeat/1.2.3.4?res=nvidia_cuda&status=continue": "1.2.3.4"}


def test_the_pool_can_be_asked_for_one_host(controllers: Callable[..., ControllerProcess]) -> None:
    """orion-k8s-plugin asks for its node's part only; the totals stay the pool's."""
    ctl = controllers()
    client = ControllerClient(ctl.address)
    member_client(ctl.address, "node-a").register_host("node-a", two_v100("a"), vgpu_count=2)
    member_client(ctl.address, "node-b").register_host("node-b", two_v100("b"))
    (only,) = client.pool("node-a")["hosts"]
    assert (only["host"], only["vgpus_total"], [g["vgpu_count"] for g in only["gpus"]]) == ("node-a", 4, [2, 2])
    assert client.pool("node-a")["vgpus_total"] == 12
    assert client.pool("node-c")["hosts"] == []
    assert [h["host"] for h in client.pool()["hosts"]] == ["node-a", "node-b"]
    status, text = call(ctl, "GET", "/api/v1/pool?host=no%20such/host")
    assert status == 400 and "host" in json.loads(text)["reason"], text


def test_malformed_requests_get_4xx_with_a_reason(controllers: Callable[..., ControllerProcess]) -> None:
    ctl = controllers()
    problems = []
    for method, path, body, want_status, words in MALFORMED:
        status, text = call(ctl, method, path, body, member=MEMBER_OF.get(path, "h"))
        reason = json.loads(text)["reason"] if path.startswith("/api/") else text.removeprefix("Error: ").strip()
        if status != want_status or words not in reason or "\n" in reason.strip() or "Traceback" in text:
            problems.append(f"{method} {path} {body!r:.60}: got {status} {text!r:.300}")
    assert not problems, "\n".join(problems)
    assert ControllerClient(ctl.address).health() == {"etcd": "ok"}  # still serving after all that


def test_metrics_report_pool_and_counters(controllers: Callable[..., ControllerProcess]) -> None:
    ctl = controllers()
    client = member_client(ctl.address, "m1")
    client.register_host("m1", two_v100("m1"))
    client.allocate(3, 4000)
    call(ctl, "GET", "/service")  # one malformed request
    status, text = call(ctl, "GET", "/metrics")
    assert status == 200
    samples = dict(line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))
    assert samples['orion_controller_vgpus_total{gpu="0",host="m1",uuid="GPU-m1-0"}'] == "4.0"
    # the three vGPUs share one GPU; which of the two idle GPUs is the controller's tie-break
    free = {g: samples[f'orion_controller_vgpus_free{{gpu="{g}",host="m1",uuid="GPU-m1-{g}"}}'] for g in (0, 1)}
    assert sorted(free.values()) == ["1.0", "4.0"]
    used = next(g for g, n in free.items() if n == "1.0")
    assert samples[f'orion_controller_gpu_memory_free_mib{{gpu="{used}",host="m1",uuid="GPU-m1-{used}"}}'] == "4160.0"
    assert samples["orion_controller_allocations"] == "1.0"
    assert samples["orion_controller_etcd_up"] == "1.0"
    assert samples['orion_controller_allocation_requests_total{result="granted"}'] == "1.0"
    assert samples['orion_controller_errors_total{code="bad_request"}'] == "1.0"
    assert samples['orion_controller_requests_total{method="POST",route="/api/v1/allocations",status="201"}'] == "1.0"


def _cli(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "controller", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=CLI_TIMEOUT_S, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})


def test_cli_errors_are_one_line(etcd: EtcdServer, controllers: Callable[..., ControllerProcess],
                                 tmp_path: Path) -> None:
    bad_listen = _cli(["start", "--listen", "nowhere", "--etcd", etcd.url])
    assert bad_listen.returncode == 2
    assert bad_listen.stderr.strip() == ("orion-controller: --listen 'nowhere': expected HOST:PORT with a port from "
                                         "1 to 65535, e.g. 0.0.0.0:9123")
    bad_etcd = _cli(["start", "--listen", f"127.0.0.1:{free_port()}", "--etcd", "https://x:1"])
    assert bad_etcd.returncode == 2 and "only http:// endpoints" in bad_etcd.stderr
    dead = f"http://127.0.0.1:{free_port()}"
    key = ["--key-file", str(cluster_key_file())]
    no_etcd = _cli(["start", "--listen", f"127.0.0.1:{free_port()}", "--etcd", dead, "--etcd-timeout", "2",
                    "--log", str(tmp_path / "c.log"), *key])
    assert no_etcd.returncode == 1
    assert no_etcd.stderr.count("\n") == 1 and f"etcd at {dead} is unreachable" in no_etcd.stderr
    assert "start etcd there" in no_etcd.stderr
    busy = controllers()
    taken = _cli(["start", "--listen", busy.address, "--etcd", etcd.url, "--log", str(tmp_path / "d.log"), *key])
    assert taken.returncode == 1 and f"cannot listen on {busy.address}" in taken.stderr
    for result in (bad_listen, bad_etcd, no_etcd, taken):
        assert "Traceback" not in result.stderr


def test_a_controller_started_just_before_its_etcd_waits_for_it(controllers: Callable[..., ControllerProcess],
                                                                 tmp_path: Path) -> None:
    """Within --etcd-timeout the controller asks etcd again: an etcd starting alongside it (or one that refused
    a single connection, as a loaded CI machine's once did) is not a failed start."""
    from tests.controller.conftest import _need_etcd

    late = EtcdServer(_need_etcd(), tmp_path / "late-etcd")
    ctl = controllers(etcd_url=late.url, extra=["--etcd-timeout", "20"], wait=False)
    try:
        wait_until("the controller to ask for etcd", lambda: "Creating database connection" in ctl.log())
        late.start()  # only now: the controller's first status request has failed (etcd takes ~1 s to come up)
        ctl.wait_ready()
        assert ControllerClient(ctl.address).pool()["vgpus_free"] == 0
    finally:
        late.stop()
