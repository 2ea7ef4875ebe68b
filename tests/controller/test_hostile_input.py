"""Hostile input to a real controller process: JSON nested past the parser's depth, bodies that are not UTF-8,
numbers too long to convert, and names or labels ending in a newline for every kind of name the API takes. Each
gets a 400 (never a 500) whose reason is one line, and the controller's log stays one line per record. The
requests are signed as a member (h1), so that the member-only endpoints read what they are sent.
"""
from __future__ import annotations

import json
import logging
from collections.abc import Callable
from urllib.parse import quote

import pytest

from controller.keys import valid_name
from controller.service import LogrusFormatter
from ivshmem.shared.controller_client import ControllerClient
from tests.controller.rig import ControllerProcess, call, member_client

pytestmark = pytest.mark.functional

JSON_ENDPOINTS = [("POST", "/api/v1/allocations"), ("POST", "/api/v1/hosts"), ("POST", "/device/info")]


def reason_of(path: str, text: str) -> str:
    """The one-line reason of an error answer, JSON or Orion's ``Error: <reason>\\n``."""
    if path.startswith("/api/"):
        return str(json.loads(text)["reason"])
    assert text.startswith("Error: ") and text.endswith("\n") and text.count("\n") == 1, repr(text)
    return text.removeprefix("Error: ").removesuffix("\n")


def assert_400(ctl: ControllerProcess, method: str, path: str, body: str | bytes | None, words: str) -> None:
    status, text = call(ctl, method, path, body, member="h1")
    assert status == 400, f"{method} {path} {body!r:.80}: {status} {text!r:.300}"
    reason = reason_of(path, text)
    assert words in reason and reason.isprintable() and len(reason) < 400, f"{method} {path}: {reason!r}"


def test_nesting_at_any_depth_is_a_400(controllers: Callable[..., ControllerProcess]) -> None:
    ctl = controllers()
    app = "/api/v1/allocations/x/confirm"
    for method, path in [*JSON_ENDPOINTS, ("POST", app)]:
        for depth in (50, 5_000, 500_000):  # the last fills half of the 1 MiB body limit
            assert_400(ctl, method, path, "[" * depth + "]" * depth, "JSON object")
            assert_400(ctl, method, path, "[" * depth, "")
        deep = '{"vgpus": ' + "[" * 900 + "]" * 900 + "}"  # parses, but a reason must not quote it all
        assert_400(ctl, method, path, deep, "")
    assert_400(ctl, "POST", "/api/v1/allocations", '{"a":' * 150_000, "too deeply")
    assert_400(ctl, "POST", "/api/v1/allocations", '{"vgpus": ' + "[" * 900 + "]" * 900 + "}",
               "vgpus must be an integer from 1 to 42, got [[")
    assert ControllerClient(ctl.address).health() == {"etcd": "ok"}


def test_other_undecodable_bodies_are_a_400(controllers: Callable[..., ControllerProcess]) -> None:
    ctl = controllers()
    for method, path in JSON_ENDPOINTS:
        assert_400(ctl, method, path, b'{"client": "\xff\xfe"}', "not UTF-8 text (byte b'\\xff' at position 12)")
        assert_400(ctl, method, path, '{"vgpus": 1' + "0" * 5000 + "}", "a number too long to read")
        assert_400(ctl, method, path, '{"vgpus": NaN, "memory": NaN, "host": 1}', "")
    assert_400(ctl, "GET", "/service?nvidia_vgpu=" + "9" * 5000, None, "must be an integer from 1 to 42, got '999")
    assert_400(ctl, "GET", "/service?nvidia_vgpu=%ff", None, "must be an integer")
    assert_400(ctl, "POST", "/api/v1/allocations", json.dumps({"vgpus": 1, "x" * 5000: 1}), "unknown field(s)")


def test_names_and_labels_ending_in_a_newline_are_refused(controllers: Callable[..., ControllerProcess]) -> None:
    ctl = controllers()
    client = member_client(ctl.address, "h1")
    client.register_host("h1", [{"uuid": "GPU-1", "name": "V100", "memory_mib": 16160}])
    alloc_id = client.allocate(1, 1000)["id"]
    nl = quote("\n")

    gpu = {"uuid": "GPU-2", "name": "V100", "memory_mib": 16160}
    bodies = {  # (path, body, the field the reason names)
        "host": ("/api/v1/hosts", {"host": "h2\n", "gpus": [gpu]}, "host 'h2\\n'"),
        "address": ("/api/v1/hosts", {"host": "h2", "address": "10.0.0.2\n", "gpus": [gpu]}, "address"),
        "gpu uuid": ("/api/v1/hosts", {"host": "h2", "gpus": [{**gpu, "uuid": "GPU-2\n"}]}, "gpus[0].uuid"),
        "gpu name": ("/api/v1/hosts", {"host": "h2", "gpus": [{**gpu, "name": "V100\n"}]}, "gpus[0].name"),
        "allocation host": ("/api/v1/allocations", {"vgpus": 1, "host": "h1\n"}, "host 'h1\\n'"),
        "client": ("/api/v1/allocations", {"vgpus": 1, "client": "pytest\nforged"}, "client 'pytest\\nforged'"),
        "confirming host": (f"/api/v1/allocations/{alloc_id}/confirm", {"host": "h1\n"}, "host 'h1\\n'"),
        "device_ip": ("/device/info", {"device_ip": "h1\n", "device_id": "GPU-3", "device_index": 1,
                                       "memory": 100}, "device_ip"),
        "device_id": ("/device/info", {"device_ip": "h1", "device_id": "GPU-3\n", "device_index": 1,
                                       "memory": 100}, "device_id"),
        "device_name": ("/device/info", {"device_ip": "h1", "device_id": "GPU-3", "device_index": 1,
                                         "memory": 100, "device_name": "V100\n"}, "device_name"),
    }
    for kind, (path, body, words) in bodies.items():
        assert_400(ctl, "POST", path, json.dumps(body), words), kind
    paths = [  # a newline at the end of a name in the path
        ("POST", f"/heartbeat/h2{nl}?res=nvidia_cuda&status=on"),
        ("POST", f"/heartbeat/h1{nl}?res=nvidia_cuda&status=continue"),
        ("POST", f"/heartbeat/h1{nl}?res=nvidia_cuda&status=off"),
        ("POST", f"/api/v1/hosts/h1{nl}/heartbeat"),
        ("DELETE", f"/api/v1/hosts/h1{nl}"),
        ("GET", f"/api/v1/allocations/{alloc_id}{nl}"),
        ("POST", f"/api/v1/allocations/{alloc_id}{nl}/keepalive"),
        ("POST", f"/api/v1/allocations/{alloc_id}{nl}/confirm"),
        ("DELETE", f"/api/v1/allocations/{alloc_id}{nl}"),
        ("PUT", f"/service/confirm/{alloc_id}{nl}"),
        ("PUT", f"/service/release/{alloc_id}{nl}"),
        ("POST", f"/service/{alloc_id}{nl}/h1"),
        ("POST", f"/service/{alloc_id}/h1{nl}"),
    ]
    for method, path in paths:
        assert_400(ctl, method, path, None, "is not a valid name")
    pool = client.pool()
    assert [h["host"] for h in pool["hosts"]] == ["h1"] and pool["vgpus_free"] == 3  # nothing changed
    assert client.allocation(alloc_id)["confirmed"] is False

    status, text = call(ctl, "GET", f"/nowhere{nl}forged")
    assert status == 404 and reason_of("/", text) == "no endpoint GET '/nowhere\\nforged'; docs/controller.md " \
                                                     "lists the endpoints"
    lines = ctl.log_path.read_text().splitlines()
    assert lines and all(line.startswith('time="') for line in lines), [ln for ln in lines if "time=" not in ln]
    assert any("/heartbeat/h2\\n res=nvidia_cuda&status=on" in line for line in lines)


@pytest.mark.parametrize("name", ["h\n", "h\r", "h\r\n", "\nh", "h\x00", "h\u2028", "h/1", "h 1", "", "h" * 254])
def test_valid_name_takes_the_whole_string(name: str) -> None:
    assert not valid_name(name)
    assert valid_name("h") and valid_name("GPU-1a2b_3.4:5") and valid_name("h" * 253)


def test_a_log_record_is_one_line_whatever_it_quotes() -> None:
    record = logging.LogRecord("controller", logging.INFO, __file__, 1, "host %s said %s", ("h\nforged", 'a"b\\\u2028'),
                               None)
    line = LogrusFormatter().format(record)
    assert line.endswith('level=info msg="host h\\nforged said a\\"b\\\\\\u2028"')
    assert len(line.splitlines()) == 1
