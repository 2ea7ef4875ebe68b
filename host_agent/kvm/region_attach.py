"""`orion-shm attach/detach`: attach an Orion region to an existing libvirt domain, or detach it, undone on failure.

host_agent/admin/shm_cli.py calls `attach_region` and `detach_region` (importing this lazily: only the host side has
libvirt). Each reads the domain's live and persistent state through the gateway (libvirt_gateway.py, the only
code that talks to libvirt), lets domain_edit.py decide what changes, and carries out the steps in an order
that keeps a failure cheap to undo. The region file is made ready for QEMU by host_agent/kvm/qemu_region.py, the
policy the qemu hook uses too. An attach that fails part-way undoes what it did, newest first, and names it
in the error; a detach needs no undo (running it again finishes the job).
"""
from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from ivshmem.layout import MIB
from ivshmem.region import SHM_DIR, region_path
from xml_templates.devices import check_region_index, check_region_size, region_name
from xml_templates.metadata import RegionRecord

from ..server_conf import ShmSettings
from .domain_edit import LIVE, EditConflict, Plan, RegionState, plan_attach, plan_detach, scope_text
from .libvirt_gateway import Domain, Gateway, GatewayError, NotPermitted, Refused
from .qemu_region import RegionNotReady, make_ready

log = logging.getLogger(__name__)

DETACH_WAIT_S = 10.0  # a running Linux guest acknowledges an ACPI eject in well under a second (docs/kvm.md)


class RegionUnusable(GatewayError):
    """The existing region file cannot be given to QEMU (qemu_region.RegionNotReady)."""


class Conflict(GatewayError):
    """Something not ours, or ours with another size, is in the way (domain_edit.EditConflict)."""


class DetachPending(GatewayError):
    """A live detach was requested, but the guest has not released the device in time."""


# --- undo --------------------------------------------------------------------------------------------------
class _Rollback:
    """Undo actions of a multi-step change; on failure they run newest first and are named in the error."""

    def __init__(self) -> None:
        self._undo: list[tuple[str, Callable[[], None]]] = []

    def push(self, what: str, undo: Callable[[], None]) -> None:
        self._undo.append((what, undo))

    def run(self, error: BaseException) -> None:
        done, failed = [], []
        for what, undo in reversed(self._undo):
            try:
                undo()
                done.append(what)
            except Exception as exc:  # an undo must not hide the failure that caused it
                log.warning("could not undo (%s): %s", what, exc)
                failed.append(f"{what} ({exc})")
        if isinstance(error, GatewayError):
            if done:
                error.undo_notes.append("undone: " + ", ".join(done))
            if failed:
                error.undo_notes.append("could NOT undo: " + "; ".join(failed))


@contextmanager
def _rollback() -> Iterator[_Rollback]:
    rollback = _Rollback()
    try:
        yield rollback
    except BaseException as exc:
        rollback.run(exc)
        raise


# --- the region file ---------------------------------------------------------------------------------------
def _existing_size_mib(path: str, fallback: int) -> int:
    """The size of an existing region as a device size, when it is a valid one; else `fallback`."""
    try:
        size = os.stat(path).st_size
        check_region_size(size // MIB)
        return size // MIB if size % MIB == 0 else fallback
    except (OSError, ValueError):
        return fallback


def _prepare_region(index: int, size_mib: int, settings: ShmSettings, domain: str) -> bool:
    """Make /dev/shm/orionsock<index> ready for QEMU (qemu_region.py); True if we created it (an undo removes it).

    QEMU's `<shmem>` always opens /dev/shm/<name> (not server.conf's shm_path_base) as the QEMU user."""
    if not os.path.lexists(region_path(index, SHM_DIR)) and not os.access(SHM_DIR, os.W_OK | os.X_OK):
        raise NotPermitted(f"cannot create {region_path(index, SHM_DIR)}: no write access to {SHM_DIR}; run as root")
    try:
        ready = make_ready(index, size_mib, SHM_DIR, settings, domain)
    except RegionNotReady as exc:
        raise RegionUnusable(str(exc)) from None
    log.info("%s", ready.note)
    return ready.created


def _remove_if_same(path: str, ino: tuple[int, int]) -> None:
    st = os.stat(path, follow_symlinks=False)
    if (st.st_dev, st.st_ino) == ino:
        os.unlink(path)


# --- the workflows -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Outcome:
    """What attach or detach did: the definitions (`scopes`) it changed (or looked at, when nothing changed)."""

    domain: str
    index: int
    size_mib: int
    path: str
    scopes: tuple[str, ...]
    changed: bool
    region_created: bool = False
    region_exists: bool = True


def attach_region(domain: str, index: int, size_mib: int | None = None, *, live: bool = False,
                  config: bool = False, persistent: bool | None = None, settings: ShmSettings | None = None,
                  uri: str | None = None) -> Outcome:
    """Attach /dev/shm/orionsock<index> to `domain` (live and/or config as `Domain.default_scopes` says).

    Order: region file, persistent definition (device, then record), running domain (device, then record).
    The definition goes first because undoing it is certain, while undoing a live attach needs the guest."""
    check_region_index(index)
    settings = settings or ShmSettings.load()
    path = region_path(index, SHM_DIR)
    with Gateway(uri) as gateway:
        dom = gateway.domain(domain)
        scopes = dom.default_scopes(live, config)
        states = {scope: dom.state(scope, index) for scope in scopes}
        try:
            plan = plan_attach(states, index, size_mib, persistent, _existing_size_mib(path, settings.buffer_size_mib))
        except EditConflict as exc:
            raise Conflict(f"{exc} ({dom.name})") from None
        check_region_size(plan.size_mib)
        with _rollback() as undo:
            created = _prepare_region(index, plan.size_mib, settings, dom.name)
            if created:
                st = os.stat(path)
                undo.push(f"removed {path}", lambda: _remove_if_same(path, (st.st_dev, st.st_ino)))
            if plan.changes:
                _apply_attach(dom, plan, states, undo)
    return Outcome(dom.name, index, plan.size_mib, path, _changed(plan, scopes), plan.changes, region_created=created)


def _apply_attach(dom: Domain, plan: Plan, states: dict[str, RegionState], undo: _Rollback) -> None:
    for step in plan.steps:
        if step.device:
            try:
                dom.attach_device(plan.index, plan.size_mib, step.scope)
            except Refused as exc:
                if step.scope == LIVE and not dom.is_active():
                    exc.undo_notes.append("start the domain first, or attach to its persistent definition only "
                                          "(--config)")
                raise
            undo.push(f"detached it from the {scope_text(step.scope)}", _undo_device(dom, plan.index, step.scope))
        if step.records is not None:
            dom.set_records(step.records, step.scope)
            undo.push(f"restored the metadata of the {scope_text(step.scope)}",
                      _undo_records(dom, states[step.scope].records, step.scope))


def _undo_records(dom: Domain, old: tuple[RegionRecord, ...], scope: str) -> Callable[[], None]:
    return lambda: dom.set_records(old, scope)


def _undo_device(dom: Domain, index: int, scope: str) -> Callable[[], None]:
    def undo() -> None:
        dom.request_detach(index, scope)
        if scope == LIVE and not dom.wait_released(index, DETACH_WAIT_S):
            raise DetachPending(f"the guest has not released it within {DETACH_WAIT_S:.0f} s; run 'orion-shm "
                                f"detach {dom.name} -i {index} --live' later")
    return undo


def detach_region(domain: str, index: int, *, live: bool = False, config: bool = False,
                  wait_s: float = DETACH_WAIT_S, uri: str | None = None) -> Outcome:
    """Remove our device and our metadata entry for region `index` from `domain`; nothing else.

    Partial progress is fine here (running it again finishes the job), so there is no rollback: the persistent
    definition goes first, then the running domain, whose metadata entry is dropped only once the guest has
    released the device. The region file stays (the host agent may still serve it)."""
    check_region_index(index)
    path = region_path(index, SHM_DIR)
    with Gateway(uri) as gateway:
        dom = gateway.domain(domain)
        if live and not dom.is_active():
            raise Refused(f"{dom.name} is not running, so there is nothing to detach live; use --config for its "
                          "persistent definition")
        scopes = dom.default_scopes(live, config)
        states = {scope: dom.state(scope, index) for scope in scopes}
        try:
            plan = plan_detach(states, index)
        except EditConflict as exc:
            raise Conflict(f"{exc} ({dom.name})") from None
        for step in plan.steps:
            if step.device:
                dom.request_detach(index, step.scope)
                if step.scope == LIVE and not dom.wait_released(index, wait_s):
                    raise DetachPending(
                        f"asked {dom.name} to release {region_name(index)}, but the guest has not done so within "
                        f"{wait_s:g} s: live detach is an ACPI eject the guest kernel must acknowledge (a paused "
                        "guest, or one still in its firmware or early boot, does not); libvirt removes the device "
                        f"when the guest does. Run 'orion-shm detach {dom.name} -i {index} --live' again later, or "
                        "stop the domain")
            if step.records is not None:
                dom.set_records(step.records, step.scope)
    size = next((s.device_size_mib for s in states.values() if s.device_size_mib is not None), 0)
    return Outcome(dom.name, index, size, path, _changed(plan, scopes), plan.changes,
                   region_exists=os.path.lexists(path))


def _changed(plan: Plan, scopes: tuple[str, ...]) -> tuple[str, ...]:
    """The scopes a plan changed, or all those looked at when it changed nothing."""
    changed = tuple(s.scope for s in plan.steps if s.device or s.records is not None)
    return changed or scopes
