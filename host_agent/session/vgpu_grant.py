"""Taking up a controller allocation in a session: which GPUs the guest gets, and how much memory each.

A guest runtime that asked the Orion Controller for vGPUs sends the allocation id (wire opcode BIND). The
session worker then confirms the allocation with the controller oriond reports to, naming this host, as
Orion's oriond does with ``PUT /service/confirm/<id>``. The controller refuses an id it does
not know and one granted on another host, so a guest cannot pick its own GPUs or quota: only oriond's own
controller is asked, never an address the guest sends. The granted GPUs are found here by UUID (the
controller's GPU indexes are the registering host's, but the UUID is what cannot be mistaken), in grant order,
so guest device ordinals follow the allocation.

One grant backs one session (docs/security.md): the confirm names the session taking the grant up (an id unique
on this host: a session is one worker process, so its pid and a random token) and, for a relayed session, the
member that relayed it; the controller binds the grant to that session alone and refuses any other, which this
host then refuses too. The confirm is a member-only call, signed as this host with the cluster key: oriond hands
its signer over once, before it forks any session worker (``sign_as``), since a worker has no other way to it.
"""
from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from typing import Any

from controller.keys import valid_name
from ivshmem.shared.controller_client import ControllerClient, ControllerClientError, MemberSigner

from ..errors import RefusedError
from .gpu_inventory import of_driver

CONFIRM_TIMEOUT_S = 5.0
_signer: MemberSigner | None = None  # set once by oriond (sign_as) before the session workers are forked
_session: tuple[int, str] = (0, "")  # (pid, id) of this process's session, made at its first confirm


class GrantRefused(RefusedError):
    """The allocation cannot be taken up here; the message is one line for the guest's user."""


@dataclass(frozen=True)
class Grant:
    allocation: str
    devices: tuple[int, ...]  # physical ordinals, one per vGPU, in guest order
    memory_mib: tuple[int, ...]  # each vGPU's quota
    session: str = ""  # the session id the controller bound the grant to (what a release of it names)
    slots: tuple[int, ...] = ()  # each vGPU's place among its GPU's vGPUs in the controller's carving


def sign_as(signer: MemberSigner | None) -> None:
    """Sign the confirms of this process and of the session workers it forks later with ``signer`` (oriond's
    link member: this host's name and the cluster key); None: confirm nothing."""
    global _signer
    _signer = signer


def session_id() -> str:
    """This session's id on this host: a session is served by one worker process, so its pid and a random token
    (pids are reused; the token is not)."""
    global _session
    if _session[0] != os.getpid():
        _session = (os.getpid(), f"{os.getpid()}-{secrets.token_hex(8)}")
    return _session[1]


def take_up(controller: str, host: str, allocation: str, driver: Any, relay: str = "",
            transport: str = "", *, session: str = "", relay_member: str = "") -> Grant:
    """Confirm ``allocation`` with ``controller`` as ``host``, bound to this session; the devices and quota it
    gives the session. ``relay`` ("IP:PORT" of the oriond that relayed the session here) and ``transport``
    ("tcp") tell the controller that the session is a relayed one, for orion-smi; "" for a local session.
    ``session``: the session's id on this host (default: session_id()); ``relay_member``: the member that relayed
    it here, as its handshake proved (handler.Session.relay_member), "" for a local session."""
    if not controller:
        raise GrantRefused(f"this host agent is not linked to an Orion Controller, so it cannot take up allocation "
                           f"{allocation}: set controller_addr in its server.conf (oriond registers its GPUs "
                           f"there), or unset ORION_VGPU in the guest")
    if not valid_name(allocation):
        raise GrantRefused(f"{allocation[:80]!r} is not a valid allocation id: use the id the controller gave")
    if driver is None:
        raise GrantRefused(f"host {host} has no usable CUDA driver, so allocation {allocation} cannot be served")
    if _signer is None:
        raise GrantRefused(f"this host agent holds no usable cluster key, so the Orion Controller would not let it "
                           f"take up allocation {allocation}: see oriond's log, and give it the cluster's key "
                           f"([cluster] key_file)")
    session = session or session_id()
    try:
        with ControllerClient(controller, timeout_s=CONFIRM_TIMEOUT_S, signer=_signer) as client:
            answer = client.confirm(allocation, host, relay=relay, transport=transport, session=session,
                                    relay_member=relay_member)
    except ControllerClientError as exc:
        raise GrantRefused(f"the Orion Controller at {controller} did not confirm allocation {allocation} for "
                           f"host {host}: {exc.reason}") from None
    except ValueError as exc:  # a malformed controller_addr
        raise GrantRefused(f"cannot ask the Orion Controller: {exc}") from None
    local = {gpu.uuid: gpu.index for gpu in of_driver(driver)}  # as oriond registered them
    try:
        vgpus = [(str(v["uuid"]), int(v["memory_mib"]), int(v["vgpu"])) for v in answer["vgpus"]]
    except (KeyError, TypeError, ValueError):
        raise GrantRefused(f"the Orion Controller gave a malformed answer for allocation {allocation}") from None
    missing = sorted({uuid for uuid, _m, _s in vgpus if uuid not in local})
    if missing or not vgpus:
        raise GrantRefused(f"allocation {allocation} names GPU(s) {', '.join(missing) or '(none)'} that host {host} "
                           f"does not have; oriond's registration is stale: restart oriond")
    return Grant(allocation, tuple(local[uuid] for uuid, _m, _s in vgpus), tuple(m for _u, m, _s in vgpus), session,
                 tuple(slot for _u, _m, slot in vgpus))
