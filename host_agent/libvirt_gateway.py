"""The one owner of the libvirt connection, and the attach/detach workflows that run through it.

`orion-shm attach/detach` (host_agent/shm_cli.py imports this lazily: the guest wheel has no libvirt) call
`attach_region` and `detach_region`. They read the domain's live and persistent XML, let domain_edit.py decide
what changes, and make those changes with libvirt's own calls: attachDeviceFlags with the device from
xml_templates/devices.py, detachDeviceAlias with our `ua-orion-` alias, setMetadata with the record from
xml_templates/metadata.py. libvirt rewrites the domain itself, so nothing of the domain that is not ours is
touched. Every libvirtError is translated here, once, into a GatewayError whose message says what to do and
whose class the CLI maps to an exit status (host_agent/shm_cli.py). An attach that fails part-way undoes what it did.

Hot-plug facts (libvirt 9.0, QEMU 7.2, i440fx `type='qemu'` under TCG; docs/kvm.md has the measurements):
live attach needs nothing from the guest; live detach is an ACPI eject the guest kernel must acknowledge, so
libvirt only *requests* it. We request it with detachDeviceAlias (asynchronous) and wait a bounded time for
the device to leave the live XML; a guest that is paused, still in its firmware or early boot, or without ACPI
hot-plug support keeps it, which is reported (DetachPending) rather than waited on forever.
"""
from __future__ import annotations

import grp
import logging
import os
import pwd
import stat
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any

from ivshmem.layout import MIB
from ivshmem.region import SHM_DIR, region_path
from xml_templates.devices import (
    ORION_NS,
    ORION_PREFIX,
    check_region_index,
    check_region_size,
    region_name,
    shmem_alias,
    shmem_xml,
)
from xml_templates.metadata import RegionRecord, regions_xml

from .domain_edit import (
    CONFIG,
    LIVE,
    EditConflict,
    Plan,
    RegionState,
    plan_attach,
    plan_detach,
    read_state,
    without_our_metadata,
)
from .server_conf import ShmSettings
from .shm_admin import create

try:
    import libvirt
except ImportError:  # pragma: no cover - depends on the machine
    libvirt = None

log = logging.getLogger(__name__)

DEFAULT_URI = "qemu:///system"
DETACH_WAIT_S = 10.0  # a running Linux guest acknowledges an ACPI eject in well under a second (docs/kvm.md)
_POLL_S = 0.05


class GatewayError(Exception):
    """A failure of attach/detach; str() is the line for the user (with what was undone, if anything)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.undo_notes: list[str] = []

    def __str__(self) -> str:
        return "; ".join([super().__str__(), *self.undo_notes])


class LibvirtdUnreachable(GatewayError):
    pass


class DomainNotFound(GatewayError):
    pass


class NotPermitted(GatewayError):
    pass


class RegionUnusable(GatewayError):
    pass


class Conflict(GatewayError):
    pass


class Refused(GatewayError):
    pass


class DetachPending(GatewayError):
    pass


# --- the connection ----------------------------------------------------------------------------------------
def _translate(exc: Any, uri: str, doing: str) -> GatewayError:
    """One libvirtError as one of ours, with what to do about it."""
    code, text = exc.get_error_code(), (exc.get_error_message() or str(exc)).strip()
    # A system error reaching the daemon (connecting, or the RPC link dropping) is about libvirtd; one from an
    # operation (QEMU, a file) is libvirt refusing that operation.
    link = doing == "connect" or exc.get_error_domain() == libvirt.VIR_FROM_RPC
    denied = (libvirt.VIR_ERR_AUTH_FAILED, libvirt.VIR_ERR_AUTH_CANCELLED, libvirt.VIR_ERR_AUTH_UNAVAILABLE,
              libvirt.VIR_ERR_ACCESS_DENIED, libvirt.VIR_ERR_OPERATION_DENIED)
    if code in denied or (link and code == libvirt.VIR_ERR_SYSTEM_ERROR and "ermission denied" in text):
        return NotPermitted(f"libvirt at {uri} does not let this user {doing} ({text}): run as root, or as a member "
                            "of the 'libvirt' group with read-write access")
    if code in (libvirt.VIR_ERR_NO_CONNECT, libvirt.VIR_ERR_INVALID_CONN) or (
            link and code == libvirt.VIR_ERR_SYSTEM_ERROR):
        return LibvirtdUnreachable(f"libvirtd is not running or not reachable at {uri} ({text}): start it with "
                                   "'libvirtd -d' (or 'systemctl start libvirtd'; virtlogd too), then try again")
    if doing == "connect" and os.geteuid() != 0:
        # An unprivileged user is usually stopped by polkit, which fails in many ways (no D-Bus, no agent).
        return NotPermitted(f"libvirt at {uri} did not let user {_user()} connect ({text}): run as root, or give "
                            "the user read-write access (the 'libvirt' group with a polkit rule, or "
                            "auth_unix_rw and unix_sock_group in libvirtd.conf)")
    if code == libvirt.VIR_ERR_NO_DOMAIN:
        return DomainNotFound(f"{text} at {uri}: 'virsh -c {uri} list --all' lists the domains")
    return Refused(f"libvirt refused to {doing}: {text}")


def _user() -> str:
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return str(os.geteuid())


class Gateway:
    """Holds the only libvirt connection (opened lazily, closed on exit); context manager."""

    def __init__(self, uri: str | None = None) -> None:
        self.uri = uri or os.environ.get("LIBVIRT_DEFAULT_URI") or DEFAULT_URI
        self._conn: Any = None

    def __enter__(self) -> Gateway:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def connection(self) -> Any:
        if self._conn is None:
            if libvirt is None:
                raise GatewayError("libvirt-python is not installed: pip install libvirt-python (needs apt "
                                   "libvirt-dev pkg-config), or run ./setup.sh")
            libvirt.registerErrorHandler(lambda _ctx, _err: None, None)  # errors come as exceptions, not stderr
            try:
                self._conn = libvirt.open(self.uri)
            except libvirt.libvirtError as exc:
                raise _translate(exc, self.uri, "connect") from None
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            with suppress(libvirt.libvirtError):
                self._conn.close()
            self._conn = None

    def domain(self, name: str) -> Domain:
        return Domain(self, self.call(f"look up domain '{name}'", self.connection().lookupByName, name))

    def call(self, doing: str, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn(*args)` with a libvirtError translated; `doing` completes "libvirt refused to …"."""
        try:
            return fn(*args)
        except libvirt.libvirtError as exc:
            raise _translate(exc, self.uri, doing) from None


class Domain:
    """One domain, seen through the gateway: its two definitions and the three changes we make to them."""

    def __init__(self, gateway: Gateway, dom: Any) -> None:
        self.gateway, self.dom = gateway, dom
        self.name: str = dom.name()

    @staticmethod
    def flag(scope: str) -> int:
        return libvirt.VIR_DOMAIN_AFFECT_LIVE if scope == LIVE else libvirt.VIR_DOMAIN_AFFECT_CONFIG

    def is_active(self) -> bool:
        return bool(self.gateway.call("query the domain state", self.dom.isActive))

    def is_persistent(self) -> bool:
        return bool(self.gateway.call("query the domain", self.dom.isPersistent))

    def default_scopes(self, live: bool, config: bool) -> tuple[str, ...]:
        """The flags given, else as virsh: the running domain if it runs, the definition if it is persistent."""
        if not live and not config:
            live, config = self.is_active(), self.is_persistent()
        return tuple(scope for scope, wanted in ((CONFIG, config), (LIVE, live)) if wanted)

    def state(self, scope: str, index: int) -> RegionState:
        """Region `index` in one definition; an absent definition (a stopped domain's live one) holds nothing."""
        if (scope == LIVE and not self.is_active()) or (scope == CONFIG and not self.is_persistent()):
            return RegionState(index=index, device_size_mib=None, foreign=False)
        flags = 0 if scope == LIVE else libvirt.VIR_DOMAIN_XML_INACTIVE
        return read_state(self.gateway.call("read the domain XML", self.dom.XMLDesc, flags), index)

    def attach_device(self, index: int, size_mib: int, scope: str) -> None:
        self.gateway.call(f"attach {region_name(index)} to the {_where(scope)} of {self.name}",
                          self.dom.attachDeviceFlags, shmem_xml(index, size_mib), self.flag(scope))

    def request_detach(self, index: int, scope: str) -> None:
        """Remove our device from the definition; for the running domain this only asks the guest (ACPI).

        A guest can finish an earlier eject between our read of the XML and this call; libvirt then answers
        'no device found with alias': the device is gone, which is what was asked."""
        try:
            self.gateway.call(f"detach {region_name(index)} from the {_where(scope)} of {self.name}",
                              self.dom.detachDeviceAlias, shmem_alias(index), self.flag(scope))
        except Refused:
            if self.state(scope, index).device_size_mib is not None:
                raise

    def wait_released(self, index: int, timeout_s: float) -> bool:
        """True once our live device is gone (or the domain stopped) within `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while True:
            if not self.is_active() or self.state(LIVE, index).device_size_mib is None:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(_POLL_S)

    def set_records(self, records: tuple[RegionRecord, ...], scope: str) -> None:
        """Our metadata record in one definition; no records removes it. In the persistent definition an
        empty `<metadata>` goes too (see domain_edit.without_our_metadata); the running domain keeps libvirt's
        empty `<metadata/>` until it stops, as no libvirt call removes it there."""
        if not records and scope == CONFIG:
            flags = libvirt.VIR_DOMAIN_XML_INACTIVE | libvirt.VIR_DOMAIN_XML_SECURE  # SECURE: keep passwords
            bare = without_our_metadata(self.gateway.call("read the domain XML", self.dom.XMLDesc, flags))
            if bare is not None:
                self.gateway.call(f"redefine {self.name} without the Orion metadata",
                                  self.gateway.connection().defineXML, bare)
                return
        xml = regions_xml(records) if records else None
        self.gateway.call(f"set the Orion metadata in the {_where(scope)} of {self.name}", self.dom.setMetadata,
                          libvirt.VIR_DOMAIN_METADATA_ELEMENT, xml, ORION_PREFIX if xml else None, ORION_NS,
                          self.flag(scope))


def _where(scope: str) -> str:
    return "running domain" if scope == LIVE else "persistent definition"


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


def _prepare_region(index: int, size_mib: int, settings: ShmSettings) -> bool:
    """Make /dev/shm/orionsock<index> ready for QEMU; True if we created it (so an undo removes it).

    QEMU's `<shmem>` always opens /dev/shm/<name> (not server.conf's shm_path_base) as the QEMU user: the file
    must be at least the device size and readable and writable by that user (TESTBED.md, /dev/shm facts)."""
    path = region_path(index, SHM_DIR)
    if not os.path.lexists(path):
        if not os.access(SHM_DIR, os.W_OK | os.X_OK):
            raise NotPermitted(f"cannot create {path}: no write access to {SHM_DIR}; run as root")
        create(index, size_mib, SHM_DIR, settings=settings)
        return True
    st = os.stat(path, follow_symlinks=False)
    if not stat.S_ISREG(st.st_mode):
        raise RegionUnusable(f"{path} exists but is not a region file; remove it with 'orion-shm remove {index}' "
                             "and attach again")
    if st.st_size < size_mib * MIB:
        raise RegionUnusable(f"{path} is {st.st_size // MIB} MiB, smaller than the {size_mib} MiB device (QEMU "
                             f"refuses a smaller backing file); attach with -s {st.st_size // MIB} or less (a power "
                             f"of two), or remove it ('orion-shm remove {index}') and attach again")
    if not _qemu_can_open(st, settings):
        raise RegionUnusable(f"{path} (owner {_owner(st)}, mode {stat.S_IMODE(st.st_mode):04o}) cannot be opened by "
                             f"QEMU's user {settings.user}:{settings.group}: run 'chown {settings.user}:"
                             f"{settings.group} {path} && chmod 0660 {path}', or remove it and attach again")
    return False


def _qemu_can_open(st: os.stat_result, settings: ShmSettings) -> bool:
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o006 == 0o006:
        return True
    try:
        user = pwd.getpwnam(settings.user)
    except KeyError:
        return False
    if st.st_uid == user.pw_uid and mode & 0o600 == 0o600:
        return True
    groups = {user.pw_gid} | {g.gr_gid for g in _groups_of(settings.user)}
    return st.st_gid in groups and mode & 0o060 == 0o060


def _groups_of(user: str) -> list[Any]:
    return [g for g in grp.getgrall() if user in g.gr_mem]


def _owner(st: os.stat_result) -> str:
    try:
        return pwd.getpwuid(st.st_uid).pw_name
    except KeyError:
        return str(st.st_uid)


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
    """Attach /dev/shm/orionsock<index> to `domain` (live and/or config as `default_scopes` says).

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
            created = _prepare_region(index, plan.size_mib, settings)
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
            undo.push(f"detached it from the {_where(step.scope)}", _undo_device(dom, plan.index, step.scope))
        if step.records is not None:
            dom.set_records(step.records, step.scope)
            undo.push(f"restored the metadata of the {_where(step.scope)}",
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
