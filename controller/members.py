"""Who is asking: the cluster member a request's signature proves (docs/security.md, "Who may talk to whom").

Member-only endpoints (host registration, heartbeats, host deletion, binding an allocation, the list of every
allocation, ``/server-meta``) need an ``Authorization: Orion-HMAC member="NAME", ts=..., mac=...`` header that
cluster_key.verify_request accepts over the request's method, its target exactly as sent (path and query) and
the exact bytes of its body. Without one they answer 401 saying what to do; a header that does not verify is a
401 wherever it is sent, so that a member whose key or clock is wrong learns it instead of being served as a
guest. Which record a member may touch (its own host's) is checked by the handlers with ``same_host``: 403.

What does not belong here: the MAC itself (cluster_key.py) and what each endpoint does (http_api.py).
"""
from __future__ import annotations

from typing import NamedTuple

from aiohttp import web

from controller.cluster_key import AUTH_SCHEME, MAX_CLOCK_SKEW_S, verify_request
from controller.errors import Forbidden, Unauthorized
from controller.keys import valid_name

CLUSTER_KEY: web.AppKey[bytes] = web.AppKey("cluster_key", bytes)


class Caller(NamedTuple):
    member: str  # the member the signature proves; "" for an unsigned request (a guest, a pod, anyone)
    body: bytes  # the body the signature covers, read once


async def caller(request: web.Request) -> Caller:
    """The request's body and the member who signed it ("" when unsigned); Unauthorized for a signature that
    does not verify. The body is read here (within the app's body limit) because the signature covers it."""
    body = await request.read()
    header = request.headers.get("Authorization")
    if header is None:
        return Caller("", body)
    member = verify_request(request.app[CLUSTER_KEY], header, request.method, request.raw_path, body)
    if member is None or not valid_name(member):
        raise Unauthorized(f"the request's {AUTH_SCHEME} signature does not verify: sign it with this cluster's key "
                           f"(the controller's --key-file, oriond's [cluster] key_file) and keep this node's clock "
                           f"within {MAX_CLOCK_SKEW_S} s of the controller's")
    return Caller(member, body)


async def member(request: web.Request) -> Caller:
    """:func:`caller` for a member-only endpoint: Unauthorized unless a member signed the request."""
    found = await caller(request)
    if not found.member:
        raise Unauthorized(f"{request.method} {request.path} is for members of the cluster: sign it with the cluster "
                           f"key ({AUTH_SCHEME} Authorization header, as oriond does with its [cluster] key_file); "
                           f"docs/security.md")
    return found


def same_host(member: str, host: str, what: str) -> None:
    """Forbidden unless ``member`` is ``host``: a host's records are created, changed and deleted by it alone."""
    if member != host:
        raise Forbidden(f"member {member} may not {what} host {host}: only host {host}'s own oriond may")
