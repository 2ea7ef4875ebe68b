"""The controller's HTTP face (aiohttp): Orion's REST endpoints, the JSON API, ``/metrics``.

Both APIs call the same GpuPool methods; they differ only in how they read requests (Orion: query strings
and plain text; ours: JSON) and how they answer. The member-only endpoints of docs/security.md (registration,
heartbeats, host deletion, binding an allocation, the list of every allocation, ``/server-meta``) first ask
members.py who signed (401 when nobody did), then parse (400), then check that the member touches only its own
host's records (403); a guest's calls (allocate, keep alive, read and release its own allocation, the pool's
summary, health, info, metrics) need no signature. Errors are turned into responses in one middleware: a
ControllerError gives its status with a one-line reason (JSON ``{"error", "reason"}`` under ``/api/``,
``Error: <reason>`` text elsewhere), an unknown route a 404/405 that says so, anything unexpected a 500 that
points at the log. Pool calls block on etcd, so they run in a thread pool, never on the event loop.
docs/controller.md has the endpoint table.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from aiohttp import web

from controller import payloads
from controller.errors import BadRequest, ControllerError, Forbidden, NotFound
from controller.members import CLUSTER_KEY, caller, member, same_host
from controller.metrics import CONTENT_TYPE, Metrics
from controller.pool import GpuPool
from ivshmem.shared.version import VERSION

log = logging.getLogger(__name__)

API_VERSION = "0.2"
DATA_VERSION = "0.2"
CONTROLLER_VERSION = VERSION  # the release (--version of every command)

T = TypeVar("T")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

POOL: web.AppKey[GpuPool] = web.AppKey("pool", GpuPool)
METRICS: web.AppKey[Metrics] = web.AppKey("metrics", Metrics)
EXECUTOR: web.AppKey[ThreadPoolExecutor] = web.AppKey("executor", ThreadPoolExecutor)
LIMITS: web.AppKey[payloads.Limits] = web.AppKey("limits", payloads.Limits)
MAX_BODY: web.AppKey[int] = web.AppKey("max_body", int)


async def blocking(request: web.Request, fn: Callable[..., T], *args: Any) -> T:
    """Run a pool call (it waits on etcd) in the app's thread pool."""
    return await asyncio.get_running_loop().run_in_executor(request.app[EXECUTOR], fn, *args)


def _is_json_api(request: web.Request) -> bool:
    return request.path.startswith("/api/")


def _error_response(request: web.Request, status: int, code: str, reason: str) -> web.Response:
    headers = {"WWW-Authenticate": "Orion-HMAC"} if status == 401 else None
    if _is_json_api(request):
        return web.json_response({"error": code, "reason": reason}, status=status, headers=headers)
    return web.Response(status=status, text=f"Error: {reason}\n", headers=headers)


@web.middleware
async def errors_and_counts(request: web.Request, handler: Handler) -> web.StreamResponse:
    metrics = request.app[METRICS]
    route = request.match_info.route.resource.canonical if request.match_info.route.resource else "unmatched"
    try:
        response = await handler(request)
    except ControllerError as exc:
        metrics.errors.labels(exc.code).inc()
        log.log(logging.WARNING if exc.status >= 500 else logging.INFO, "%s %s -> %d %s", request.method,
                request.path_qs, exc.status, exc.message)
        response = _error_response(request, exc.status, exc.code, exc.message)
    except web.HTTPException as exc:
        path = request.path if request.path.isprintable() else payloads.shown(request.path)  # a %0A stays quoted
        if exc.status == 404:
            reason = f"no endpoint {request.method} {path}; docs/controller.md lists the endpoints"
        elif exc.status == 405:
            allowed = ", ".join(sorted(getattr(exc, "allowed_methods", ()) or ()))
            reason = f"{request.method} is not allowed on {path}; use {allowed}"
        elif exc.status == 413:
            reason = (f"request body too large: the limit is {request.app[MAX_BODY] >> 10} KiB "
                      f"(orion-controller --max-body-kib; docs/controller.md, Limits)")
        else:
            reason = exc.reason
        metrics.errors.labels(f"http_{exc.status}").inc()
        response = _error_response(request, exc.status, f"http_{exc.status}", reason)
    except Exception as exc:
        log.exception("internal error on %s %s", request.method, request.path_qs)
        metrics.errors.labels("internal").inc()
        response = _error_response(request, 500, "internal",
                                   f"internal error ({type(exc).__name__}: {exc}); see the controller log")
    metrics.requests.labels(route, request.method, str(response.status)).inc()
    return response


def _log_orion(request: web.Request) -> None:
    """Orion's request line, as its controller logged it."""
    h = request.headers
    log.info("Received API (method:%s; api version:%s; data version:%s; client ID:%s; group ID:%s) : %s %s",
             request.method, h.get("api_version", ""), h.get("data_version", ""), h.get("client_id", ""),
             h.get("group_id", ""), request.path, request.query_string)


async def _json_body(request: web.Request) -> dict[str, Any]:
    return payloads.json_object(await request.read())


def _session_query(request: web.Request) -> str:
    """The optional ``?session=`` of a release: the GPU host's session that gives its grant back."""
    session = request.query.get("session", "")
    return payloads.name(session, "session") if session else ""


# ---------------------------------------------------------------------------------------------- Orion's API
async def orion_info(request: web.Request) -> web.Response:
    _log_orion(request)
    return web.Response(text=f"data_version={DATA_VERSION},api_version={API_VERSION}")


async def orion_devices(request: web.Request) -> web.Response:
    """Total vGPUs, or with ``used=true`` the usable (free) ones: orion-check prints that number as free."""
    _log_orion(request)
    payloads.orion_resource(request.query)
    used = request.query.get("used", "false")
    if used not in ("true", "false"):
        raise BadRequest(f"used={payloads.shown(used)}: use used=true (free vGPUs) or leave it out (all vGPUs)")
    view = await blocking(request, request.app[POOL].view)
    number = view.vgpus_free if used == "true" else view.vgpus_total
    return web.Response(text=f"nvidia_cuda={number}")


async def orion_heartbeat(request: web.Request) -> web.Response:
    """``POST /heartbeat/<ip>?res=nvidia_cuda&status=on|continue|off``: register, keep alive, unregister."""
    _log_orion(request)
    signer = (await member(request)).member
    payloads.orion_resource(request.query)
    host = payloads.name(request.match_info["host"], "host")
    status = request.query.get("status")
    if status in ("on", "continue", "off"):
        same_host(signer, host, {"on": "register", "continue": "heartbeat for", "off": "unregister"}[status])
    pool = request.app[POOL]
    if status == "on":
        await blocking(request, pool.register_host, host, host, payloads.DEFAULT_PORT, payloads.DEFAULT_VGPU_COUNT,
                       ())
    elif status == "continue":
        await blocking(request, pool.heartbeat, host)
    elif status == "off":
        await blocking(request, pool.deregister, host)
        log.info("Unregister Orion Server %s from Orion Controller", host)
    else:
        raise BadRequest(f"status={payloads.shown(status)}: use status=on (register), continue (keep alive) or off "
                         f"(unregister)")
    return web.Response(text="OK")


async def orion_device_info(request: web.Request) -> web.Response:
    _log_orion(request)
    signed = await member(request)
    info = payloads.device_info(payloads.json_object(signed.body), request.app[LIMITS])
    if info.gpu is not None:
        same_host(signed.member, info.host, "add a GPU to")
        await blocking(request, request.app[POOL].add_gpu, info.host, info.gpu, info.port)
    return web.Response(text="OK")


async def orion_service(request: web.Request) -> web.Response:
    """``GET /service?nvidia_vgpu=N[&memory=M]`` → ``<alloc-id>,<ip>:<port>/<pgpu>/<vgpu>[,...]``."""
    _log_orion(request)
    req = payloads.orion_service_query(request.query, request.app[POOL].max_vgpus)
    alloc = await _allocate(request, req, group_id=request.headers.get("group_id", ""))
    return web.Response(text=alloc.orion_resource())


async def orion_service_resources(request: web.Request) -> web.Response:
    """``POST /service/<alloc>/<server-ip>``: oriond asks what the allocation holds on it."""
    _log_orion(request)
    alloc_id = payloads.name(request.match_info["alloc"], "allocation id")
    server = payloads.name(request.match_info["server"], "server")
    alloc = await blocking(request, request.app[POOL].get_allocation, alloc_id)
    if server not in (alloc.host, alloc.address):
        raise NotFound(f"allocation {alloc_id} is on host {alloc.host}, not {server}")
    view = await blocking(request, request.app[POOL].view)
    memory = {(g.gpu.index): g.gpu.memory_mib for h in view.hosts if h.host.name == alloc.host for g in h.gpus}
    entries = [f"{alloc.address},{alloc.port},{v.uuid},{v.gpu},{v.vgpu},"
               f"{round(100 * v.memory_mib / memory[v.gpu]) if memory.get(v.gpu) else 0},{v.memory_mib}"
               for v in alloc.vgpus]
    return web.Response(text=";".join(["nvidia_cuda", *entries]))


async def orion_confirm(request: web.Request) -> web.Response:
    """Orion's oriond binds an allocation; it names no session, so its host's unnamed session takes it up."""
    _log_orion(request)
    signer = (await member(request)).member
    alloc_id = payloads.name(request.match_info["alloc"], "allocation id")
    await blocking(request, request.app[POOL].confirm, alloc_id, signer)
    return web.Response(text="OK")


async def orion_release(request: web.Request) -> web.Response:
    _log_orion(request)
    signer = (await caller(request)).member
    alloc_id = payloads.name(request.match_info["alloc"], "allocation id")
    await blocking(request, request.app[POOL].release, alloc_id, signer, _session_query(request))
    request.app[METRICS].releases.inc()
    return web.Response(text="OK")


async def orion_full_report(request: web.Request) -> web.Response:
    """``POST /service/fullreport/<server>``: Orion's oriond lists the allocations it holds; each one that is on that
    host is kept alive (as its heartbeat would), one that is gone or elsewhere is named in the log and skipped."""
    _log_orion(request)
    signed = await member(request)
    server = payloads.name(request.match_info["server"], "server")
    same_host(signed.member, server, "report the allocations of")
    pool = request.app[POOL]
    for alloc_id in payloads.full_report(payloads.json_object(signed.body)):
        try:
            alloc = await blocking(request, pool.get_allocation, alloc_id)
            if server not in (alloc.host, alloc.address):
                raise NotFound(f"allocation {alloc_id} is on host {alloc.host}, not {server}")
            await blocking(request, pool.keepalive, alloc_id)
        except NotFound as exc:
            log.info("full report of %s: %s; skipped", server, exc)
    return web.Response(text="OK")


async def orion_server_meta(request: web.Request) -> web.Response:
    """Orion's telemetry post (OS, drivers...): accepted and dropped; nothing in the pool depends on it."""
    _log_orion(request)
    signer = (await member(request)).member
    same_host(signer, payloads.name(request.match_info["server"], "server"), "report telemetry for")
    return web.Response(text="OK")


# ---------------------------------------------------------------------------------------------- JSON API
async def api_info(request: web.Request) -> web.Response:
    return web.json_response({"api_version": API_VERSION, "data_version": DATA_VERSION,
                              "controller_version": CONTROLLER_VERSION})


async def api_health(request: web.Request) -> web.Response:
    await blocking(request, request.app[POOL].store.healthy)
    return web.json_response({"etcd": "ok"})


async def api_pool(request: web.Request) -> web.Response:
    view = await blocking(request, request.app[POOL].view)
    only = request.query.get("host")  # one host's part (orion-k8s-plugin asks for its node's); totals stay whole
    if only is not None:
        only = payloads.name(only, "host")
    hosts = [{"host": h.host.name, "address": h.host.address, "port": h.host.port, "vgpus_total": h.vgpus_total,
              "vgpus_free": h.vgpus_free,
              "gpus": [{"index": g.gpu.index, "uuid": g.gpu.uuid, "name": g.gpu.name, "memory_mib": g.gpu.memory_mib,
                        "memory_free_mib": g.free_memory_mib, "vgpu_count": g.gpu.vgpu_count,
                        "vgpus_free": len(g.free_slots), "vgpus_used": sorted(g.used_slots)} for g in h.gpus]}
             for h in view.hosts if only is None or h.host.name == only]
    return web.json_response({"revision": view.revision, "vgpus_total": view.vgpus_total,
                              "vgpus_free": view.vgpus_free, "hosts": hosts})


async def api_register_host(request: web.Request) -> web.Response:
    signed = await member(request)
    reg = payloads.host_registration(payloads.json_object(signed.body), request.app[LIMITS])
    same_host(signed.member, reg.name, "register")
    host = await blocking(request, request.app[POOL].register_host, reg.name, reg.address, reg.port,
                          reg.vgpu_count, reg.gpus, reg.ttl_s)
    return web.json_response({"host": host.name, "address": host.address, "port": host.port,
                              "lease": host.lease, "gpus": len(reg.gpus)}, status=201)


async def api_host_heartbeat(request: web.Request) -> web.Response:
    signer = (await member(request)).member
    host = payloads.name(request.match_info["host"], "host")
    same_host(signer, host, "heartbeat for")
    ttl = await blocking(request, request.app[POOL].heartbeat, host)
    return web.json_response({"host": host, "ttl_s": ttl})


async def api_host_delete(request: web.Request) -> web.Response:
    signer = (await member(request)).member
    host = payloads.name(request.match_info["host"], "host")
    same_host(signer, host, "unregister")
    await blocking(request, request.app[POOL].deregister, host)
    return web.json_response({"host": host, "unregistered": True})


async def _allocate(request: web.Request, req: payloads.AllocationRequest, group_id: str = "") -> Any:
    metrics = request.app[METRICS]
    try:
        alloc = await blocking(request, request.app[POOL].allocate, req.count, req.memory_mib, req.ttl_s,
                               req.client, group_id, req.host, req.origin)
    except ControllerError as exc:
        metrics.allocation_requests.labels(exc.code).inc()
        raise
    metrics.allocation_requests.labels("granted").inc()
    return alloc


async def api_allocate(request: web.Request) -> web.Response:
    req = payloads.allocation_request(await _json_body(request), request.app[POOL].max_vgpus)
    alloc = await _allocate(request, req)
    return web.json_response(alloc.to_dict(), status=201)


async def api_allocations(request: web.Request) -> web.Response:
    """Every allocation for a member; counts only for anyone else: an id is its holder's secret."""
    signer = (await caller(request)).member
    allocs = await blocking(request, request.app[POOL].allocations)
    if not signer:
        return web.json_response({"count": len(allocs), "confirmed": sum(a.confirmed for a in allocs)})
    return web.json_response({"allocations": [a.to_dict() for a in allocs]})


async def api_allocation(request: web.Request) -> web.Response:
    alloc_id = payloads.name(request.match_info["alloc"], "allocation id")
    alloc = await blocking(request, request.app[POOL].get_allocation, alloc_id)
    return web.json_response(alloc.to_dict())


async def api_keepalive(request: web.Request) -> web.Response:
    alloc_id = payloads.name(request.match_info["alloc"], "allocation id")
    ttl = await blocking(request, request.app[POOL].keepalive, alloc_id)
    return web.json_response({"id": alloc_id, "ttl_s": ttl})


async def api_confirm(request: web.Request) -> web.Response:
    """A GPU host's oriond binds an allocation to one of its sessions: the signer is the host."""
    signed = await member(request)
    alloc_id = payloads.name(request.match_info["alloc"], "allocation id")
    said = payloads.confirmation(payloads.json_object(signed.body)) if signed.body else payloads.Confirmation()
    if said.host and said.host != signed.member:
        raise Forbidden(f"member {signed.member} may not take up allocation {alloc_id} as host {said.host}: an oriond "
                        f"confirms for its own host")
    alloc = await blocking(request, request.app[POOL].confirm, alloc_id, signed.member, said.relay, said.transport,
                           said.session, said.relay_member)
    return web.json_response(alloc.to_dict())


async def api_release(request: web.Request) -> web.Response:
    signer = (await caller(request)).member
    alloc_id = payloads.name(request.match_info["alloc"], "allocation id")
    alloc = await blocking(request, request.app[POOL].release, alloc_id, signer, _session_query(request))
    request.app[METRICS].releases.inc()
    return web.json_response({"id": alloc.id, "released": True})


async def metrics_endpoint(request: web.Request) -> web.Response:
    body = await blocking(request, request.app[METRICS].render)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


def build_app(pool: GpuPool, executor: ThreadPoolExecutor, key: bytes, limits: payloads.Limits,
              max_body: int) -> web.Application:
    """The aiohttp application over ``pool``; blocking pool calls run on ``executor``; members sign with ``key``;
    registrations within ``limits``, bodies of at most ``max_body`` bytes."""
    app = web.Application(middlewares=[errors_and_counts], client_max_size=max_body)
    app[POOL] = pool
    app[CLUSTER_KEY] = key
    app[LIMITS] = limits
    app[MAX_BODY] = max_body
    app[METRICS] = Metrics(pool)
    app[EXECUTOR] = executor
    r = app.router
    # Orion's endpoints (as its oriond, client and orion-check call them); confirm, release and fullreport before
    # the generic /service/{a}/{b}
    r.add_get("/info", orion_info)
    r.add_get("/devices", orion_devices)
    r.add_post("/heartbeat/{host}", orion_heartbeat)
    r.add_post("/device/info", orion_device_info)
    r.add_get("/service", orion_service)
    r.add_route("PUT", "/service/confirm/{alloc}", orion_confirm)
    r.add_route("POST", "/service/confirm/{alloc}", orion_confirm)
    r.add_route("*", "/service/release/{alloc}", orion_release)
    r.add_post("/service/fullreport/{server}", orion_full_report)
    r.add_post("/service/{alloc}/{server}", orion_service_resources)
    r.add_post("/server-meta/{server}", orion_server_meta)
    # the JSON API
    r.add_get("/api/v1/info", api_info)
    r.add_get("/api/v1/health", api_health)
    r.add_get("/api/v1/pool", api_pool)
    r.add_post("/api/v1/hosts", api_register_host)
    r.add_post("/api/v1/hosts/{host}/heartbeat", api_host_heartbeat)
    r.add_delete("/api/v1/hosts/{host}", api_host_delete)
    r.add_post("/api/v1/allocations", api_allocate)
    r.add_get("/api/v1/allocations", api_allocations)
    r.add_get("/api/v1/allocations/{alloc}", api_allocation)
    r.add_post("/api/v1/allocations/{alloc}/keepalive", api_keepalive)
    r.add_post("/api/v1/allocations/{alloc}/confirm", api_confirm)
    r.add_delete("/api/v1/allocations/{alloc}", api_release)
    r.add_get("/metrics", metrics_endpoint)
    return app
