"""Parsing and validating what clients send (JSON bodies, Orion's query strings) into typed values.

Why a module of its own: every malformed request must get a 400 whose one-line reason names the field and
what would be accepted, and that is easiest to keep consistent (and to test) in one place. The HTTP layer
calls these and never looks inside a payload itself; the pool receives only values that passed here.

Registrations are bounded (``Limits``: GPUs per host, vGPUs per GPU; docs/controller.md, Limits): one made-up
inventory of 10,000 GPUs once made every pool read 180 times slower, and a device plugin advertise a million
devices. Each bound is a 400 whose reason names the limit and the flag that sets it.

Hostile input is part of "malformed": a body nested too deeply for the JSON parser, bytes that are not UTF-8,
a number too long to convert, names ending in a newline or strings with control characters (they would split
Orion's plain-text answers and the log) all get a 400 with one line. Values are quoted in reasons through
``shown``, which cuts long or deeply nested values short, so a reason stays one short line.
"""
from __future__ import annotations

import json
import re
import reprlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from controller.errors import BadRequest
from controller.keys import valid_name
from controller.pool import GpuSpec
from ivshmem.shared.ini import whole_number

MAX_MEMORY_MIB = 1 << 24
MAX_TTL_S = 3600
MAX_VGPU_COUNT = 100  # vGPUs of one GPU: what Orion's vgpu_count (1-100) and the carving allow
MAX_GPU_INDEX = 9999  # a GPU's index in its etcd key (four digits)
DEFAULT_MAX_GPUS_PER_HOST = 64
DEFAULT_PORT = 9960
DEFAULT_VGPU_COUNT = 4
MAX_LABEL = 253  # a client label, a GPU's name
MAX_PEER = 80  # a relaying oriond's IP:PORT: an IPv6 address with a zone and a port fits
_PEER = re.compile(r"[0-9A-Za-z.:%\[\]_-]*[0-9A-Za-z.%\]_-]:[0-9]{1,5}")
_TRANSPORT = re.compile(r"[a-z][a-z0-9-]{0,15}")

_SHOWN = reprlib.Repr()
_SHOWN.maxstring = _SHOWN.maxother = 60
_SHOWN.maxlevel = 2
_SHOWN.maxlist = _SHOWN.maxdict = 4


@dataclass(frozen=True)
class Limits:
    """What one registration may hold (orion-controller --max-gpus-per-host, --max-vgpus-per-gpu)."""

    gpus_per_host: int = DEFAULT_MAX_GPUS_PER_HOST
    vgpus_per_gpu: int = MAX_VGPU_COUNT

    def gpu_note(self) -> str:
        return (f"a host registers at most {self.gpus_per_host} GPUs, indices 0 to {self.gpus_per_host - 1}: "
                f"orion-controller --max-gpus-per-host; docs/controller.md, Limits")

    def vgpu_note(self) -> str:
        return (f"a GPU is carved into at most {self.vgpus_per_gpu} vGPUs: orion-controller --max-vgpus-per-gpu; "
                f"docs/controller.md, Limits")


@dataclass(frozen=True)
class AllocationRequest:
    count: int
    memory_mib: int | None
    ttl_s: int | None
    client: str = ""
    host: str = ""  # only this host (a guest whose channel is one host's region); "" = any host
    origin: str = ""  # the host whose oriond serves the guest (it relays the session); "" = not said


@dataclass(frozen=True)
class HostRegistration:
    name: str
    address: str
    port: int
    vgpu_count: int
    gpus: tuple[GpuSpec, ...]
    ttl_s: int | None


def shown(value: Any) -> str:
    """``repr(value)`` for a reason: at most about 60 characters and two levels deep, whatever was sent."""
    return _SHOWN.repr(value)


def _fields(keys: set[str]) -> str:
    """Field names for a reason: plain when they are names, quoted (and cut short) when they are not."""
    return ", ".join(k if valid_name(k) else shown(k) for k in sorted(keys)[:8]) + (", ..." if len(keys) > 8 else "")


def json_object(body: bytes) -> dict[str, Any]:
    """The body as a JSON object, or BadRequest saying what was wrong with it."""
    if not body.strip():
        raise BadRequest("request body is empty; send a JSON object (Content-Type: application/json)")
    try:
        data = json.loads(body)
    except RecursionError:  # the parser recurses per level: [[[[...]]]] deep enough exhausts the stack
        raise BadRequest("request body nests arrays or objects too deeply to read; send a JSON object as "
                         "docs/controller.md shows (at most 3 levels)") from None
    except json.JSONDecodeError as exc:
        raise BadRequest(f"request body is not valid JSON ({exc}); send a JSON object") from None
    except UnicodeDecodeError as exc:
        raise BadRequest(f"request body is not UTF-8 text (byte {shown(exc.object[exc.start:exc.start + 1])} at "
                         f"position {exc.start}); send a JSON object in UTF-8") from None
    except ValueError:  # int() of a number past sys.get_int_max_str_digits()
        raise BadRequest("request body has a number too long to read; send a JSON object with "
                         "integers of at most a few digits") from None
    if not isinstance(data, dict):
        raise BadRequest(f"request body must be a JSON object, got {type(data).__name__}")
    return data


def optional_integer(data: Mapping[str, Any], key: str, lo: int, hi: int, what: str = "",
                     note: str = "") -> int | None:
    """``data[key]`` as an int in [lo, hi], or None when it is absent, null or ""; strings of digits are
    accepted (query strings are all strings). ``note`` says why ``hi`` is the limit, for a value over it."""
    if key not in data or data[key] is None or data[key] == "":
        return None
    raw = data[key]
    wanted = f"{what or key} must be an integer from {lo} to {hi}"
    if isinstance(raw, bool) or not isinstance(raw, int | str):
        raise BadRequest(f"{wanted}, got {shown(raw)}")
    value = raw if isinstance(raw, int) else whole_number(raw)  # ASCII digits only: not '1_0', '١', ' 2'
    if value is None:
        raise BadRequest(f"{wanted}, got {shown(raw)}")
    if not lo <= value <= hi:
        raise BadRequest(f"{wanted}, got {shown(value)}{f' ({note})' if note and value > hi else ''}")
    return value


def integer(data: Mapping[str, Any], key: str, lo: int, hi: int, what: str = "", note: str = "") -> int:
    """:func:`optional_integer` for a field that must be there: BadRequest when it is absent."""
    value = optional_integer(data, key, lo, hi, what, note)
    if value is None:
        raise BadRequest(f"{what or key} is required: an integer from {lo} to {hi}")
    return value


def text(data: Mapping[str, Any], key: str, required: bool = True, default: str = "") -> str:
    raw = data.get(key)
    if raw is None or raw == "":
        if required:
            raise BadRequest(f"{key} is required: a non-empty string")
        return default
    if not isinstance(raw, str):
        raise BadRequest(f"{key} must be a string, got {shown(raw)}")
    return raw


def name(value: str, what: str) -> str:
    """A host name, address, allocation id or GPU uuid: one etcd key segment, one field of Orion's answers."""
    if not valid_name(value):
        raise BadRequest(f"{what} {shown(value)} is not a valid name: use letters, digits and . _ : - (no '/', "
                         f"no spaces or control characters), at most 253 characters")
    return value


MAX_REPORTED = 1024  # allocations one full report may name: more than a host's vGPUs can hold


def full_report(data: Mapping[str, Any]) -> list[str]:
    """Orion's ``POST /service/fullreport/<server>`` body (its oriond's list of what it holds): the allocation ids of
    its ``allocation_list`` (objects with ``allocation_id``; ``resource`` and ``resource_list`` are not read), or
    BadRequest saying what is wrong."""
    listed = data.get("allocation_list", [])
    if not isinstance(listed, list) or len(listed) > MAX_REPORTED:
        raise BadRequest(f"allocation_list must be a list of at most {MAX_REPORTED} objects with an allocation_id")
    ids = []
    for entry in listed:
        if not isinstance(entry, dict) or not isinstance(entry.get("allocation_id"), str):
            raise BadRequest("each allocation_list entry must be an object with an allocation_id string")
        ids.append(name(entry["allocation_id"], "allocation id"))
    return ids


def label(data: Mapping[str, Any], key: str, default: str = "", what: str = "") -> str:
    """An optional free-text field (a client's label, a GPU's name): printable, at most MAX_LABEL characters,
    since it is logged and shown by orion-smi, where a newline would forge a line."""
    value = text(data, key, required=False, default=default)
    if len(value) > MAX_LABEL or not value.isprintable():
        raise BadRequest(f"{what or key} {shown(value)} must be printable text (no newline or other control "
                         f"character) of at most {MAX_LABEL} characters")
    return value


def optional_host(data: Mapping[str, Any], key: str = "host") -> str:
    """An optional field naming a host (``"host"`` unless said): a valid host name, or "" when absent."""
    host = text(data, key, required=False)
    return name(host, key) if host else ""


def _vgpu_limit_note(max_vgpus: int) -> str:
    return (f"{max_vgpus} is the most one allocation can hold: its claim is one etcd transaction, and etcd "
            f"limits a transaction's operations; docs/controller.md, Limits")


def allocation_request(data: Mapping[str, Any], max_vgpus: int) -> AllocationRequest:
    """JSON API: ``{"vgpus": N, "memory_mib": M?, "ttl_s": T?, "client": "..."?, "host": "..."?,
    "origin": "..."?}``; N at most ``max_vgpus`` (GpuPool.max_vgpus)."""
    unknown = set(data) - {"vgpus", "memory_mib", "ttl_s", "client", "host", "origin"}
    if unknown:
        raise BadRequest(f"unknown field(s) {_fields(unknown)}; allowed: vgpus, memory_mib, "
                         f"ttl_s, client, host, origin")
    count = integer(data, "vgpus", 1, max_vgpus, note=_vgpu_limit_note(max_vgpus))
    return AllocationRequest(count, optional_integer(data, "memory_mib", 1, MAX_MEMORY_MIB),
                             optional_integer(data, "ttl_s", 1, MAX_TTL_S),
                             label(data, "client"), optional_host(data), optional_host(data, "origin"))


@dataclass(frozen=True)
class Confirmation:
    """What an oriond says when it takes an allocation up: its host, the session taking it up (an id unique on
    that host, and for a relayed session the member that relayed it), and for a relayed session (docs/remote.md)
    the relaying oriond's address and the transport between the two."""

    host: str = ""
    relay: str = ""  # "IP:PORT" of the relaying oriond, as the GPU host's listener saw it; "" = a local session
    transport: str = ""  # "tcp", "rdma": how the relayed session's records travel; only with relay
    session: str = ""  # the session's id on the GPU host ("": Orion's confirm, which names none)
    relay_member: str = ""  # the member (node name) that relayed the session, as its handshake proved; "" = local


CONFIRM_FIELDS = "host, relay, transport, session, relay_member"


def confirmation(data: Mapping[str, Any]) -> Confirmation:
    """JSON API confirm: ``{"host"?, "session"?, "relay_member"?, "relay"?: "IP:PORT", "transport"?: "tcp"}``,
    all optional; a transport is only said of a relayed session, so it needs ``relay``."""
    unknown = set(data) - {"host", "relay", "transport", "session", "relay_member"}
    if unknown:
        raise BadRequest(f"unknown field(s) {_fields(unknown)}; allowed: {CONFIRM_FIELDS}")
    relay = text(data, "relay", required=False)
    if relay and (len(relay) > MAX_PEER or not _PEER.fullmatch(relay)
                  or not 1 <= int(relay.rpartition(":")[2]) <= 65535):
        raise BadRequest(f"relay {shown(relay)} must be the relaying oriond's address as IP:PORT (e.g. "
                         f"10.0.0.1:43210; letters, digits and . : % [ ] _ - only, port 1 to 65535, at most "
                         f"{MAX_PEER} characters)")
    transport = text(data, "transport", required=False)
    if transport and not _TRANSPORT.fullmatch(transport):
        raise BadRequest(f"transport {shown(transport)} must be a transport's name such as tcp or rdma (lower-case "
                         f"letters, digits and '-', at most 16 characters)")
    if transport and not relay:
        raise BadRequest("transport is said only of a relayed session: give relay (the relaying oriond's "
                         "IP:PORT) with it, or leave both out")
    session = text(data, "session", required=False)
    return Confirmation(optional_host(data), relay, transport, name(session, "session") if session else "",
                        optional_host(data, "relay_member"))


def orion_service_query(query: Mapping[str, str], max_vgpus: int) -> AllocationRequest:
    """Orion's ``GET /service?nvidia_vgpu=N[&memory=M]`` (ORION_VGPU, ORION_GMEM); N at most ``max_vgpus``."""
    count = integer(query, "nvidia_vgpu", 1, max_vgpus, what="nvidia_vgpu (ORION_VGPU)",
                    note=_vgpu_limit_note(max_vgpus))
    memory = optional_integer(query, "memory", 1, MAX_MEMORY_MIB, what="memory (ORION_GMEM, MiB)")
    return AllocationRequest(count, memory, None)


def orion_resource(query: Mapping[str, str], required: bool = True) -> None:
    """Orion's ``res=`` parameter: only ``nvidia_cuda`` exists."""
    res = query.get("res")
    if res is None and not required:
        return
    if res != "nvidia_cuda":
        raise BadRequest(f"res={shown(res)} is not a resource this controller has; use res=nvidia_cuda")


def _gpu(item: Any, position: int, limits: Limits) -> GpuSpec:
    if not isinstance(item, dict):
        raise BadRequest(f"gpus[{position}] must be an object with uuid, name, memory_mib")
    index = optional_integer(item, "index", 0, limits.gpus_per_host - 1, what=f"gpus[{position}].index",
                             note=limits.gpu_note())
    memory = integer(item, "memory_mib", 1, MAX_MEMORY_MIB, what=f"gpus[{position}].memory_mib")
    vgpus = optional_integer(item, "vgpu_count", 1, limits.vgpus_per_gpu, what=f"gpus[{position}].vgpu_count",
                             note=limits.vgpu_note())
    uuid = name(text(item, "uuid"), f"gpus[{position}].uuid")
    return GpuSpec(position if index is None else index, uuid,
                   label(item, "name", default=uuid, what=f"gpus[{position}].name"), memory, vgpus)


def host_registration(data: Mapping[str, Any], limits: Limits = Limits()) -> HostRegistration:
    """JSON API: ``{"host": "10.0.0.5", "port": 9960?, "address": ...?, "vgpu_count": 4?, "ttl_s": T?,
    "gpus": [{"uuid": "GPU-...", "name": "...", "memory_mib": 16160, "index"?, "vgpu_count"?}, ...]}``, within
    ``limits``."""
    host = name(text(data, "host"), "host")
    gpus_raw = data.get("gpus")
    if not isinstance(gpus_raw, list):
        raise BadRequest("gpus is required: a list of {uuid, name, memory_mib} objects (may be empty)")
    if len(gpus_raw) > limits.gpus_per_host:
        raise BadRequest(f"gpus lists {len(gpus_raw)} GPUs ({limits.gpu_note()})")
    gpus = tuple(_gpu(item, i, limits) for i, item in enumerate(gpus_raw))
    indices = [g.index for g in gpus]
    if len(set(indices)) != len(indices):
        raise BadRequest(f"gpus have duplicate indices {sorted(indices)}; each GPU needs its own index")
    port = optional_integer(data, "port", 1, 65535)
    vgpu_count = optional_integer(data, "vgpu_count", 1, limits.vgpus_per_gpu, note=limits.vgpu_note())
    return HostRegistration(host, name(text(data, "address", required=False, default=host), "address"),
                            port or DEFAULT_PORT, vgpu_count or DEFAULT_VGPU_COUNT, gpus,
                            optional_integer(data, "ttl_s", 1, MAX_TTL_S))


def _flatten(data: Mapping[str, Any]) -> dict[str, Any]:
    """Orion's /device/info nests its fields under device_meta / static_meta / meta; accept both shapes."""
    flat: dict[str, Any] = {k: v for k, v in data.items() if not isinstance(v, dict)}
    for part in ("device_meta", "static_meta", "meta"):
        nested = data.get(part)
        if isinstance(nested, dict):
            flat.update({k: v for k, v in nested.items() if not isinstance(v, dict)})
    return flat


@dataclass(frozen=True)
class DeviceInfo:
    host: str
    gpu: GpuSpec | None  # None: a dynamic report (memory_used/memory_free) with nothing to register
    port: int | None


def device_info(data: Mapping[str, Any], limits: Limits = Limits()) -> DeviceInfo:
    """Orion's ``POST /device/info``: one GPU of a host (device_ip, device_id, device_index, memory MiB...),
    within ``limits`` (its index is below the GPUs a host may have, so GPU by GPU it cannot have more either)."""
    flat = _flatten(data)
    static = {"device_index", "memory", "device_name", "device_ip"} & set(flat)
    if not static:
        if "device_id" in flat:
            return DeviceInfo("", None, None)
        raise BadRequest("device info needs device_ip, device_id, device_index and memory (MiB)")
    host = name(text(flat, "device_ip"), "device_ip")
    memory = integer(flat, "memory", 1, MAX_MEMORY_MIB, what="memory (MiB)")
    index = integer(flat, "device_index", 0, limits.gpus_per_host - 1, note=limits.gpu_note())
    vgpus = optional_integer(flat, "vdevice_num", 1, limits.vgpus_per_gpu, note=limits.vgpu_note())
    port = optional_integer(flat, "device_port", 1, 65535)
    uuid = name(text(flat, "device_id"), "device_id")
    return DeviceInfo(host, GpuSpec(index, uuid, label(flat, "device_name", default=uuid), memory, vgpus), port)
