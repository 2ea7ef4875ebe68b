"""The one owner of the libvirt connection, and `Domain`: the reads and the three changes we make through it.

Everything that talks to libvirt is here: opening the connection (lazily, closed on exit), looking a domain up,
reading its live and persistent XML, attachDeviceFlags with our device from xml_templates/devices.py,
detachDeviceAlias with our `ua-orion-` alias, setMetadata with the record from xml_templates/metadata.py.
libvirt rewrites the domain itself, so nothing of the domain that is not ours is touched. Every libvirtError is
translated here, once, into a GatewayError whose message says what to do and whose class the CLI maps to an
exit status (host_agent/admin/shm_cli.py). What to change, and in which order, is not decided here: domain_edit.py
decides from the XML, and the attach/detach workflows (host_agent/kvm/region_attach.py) run the steps and undo them.

Hot-plug facts (libvirt 9.0, QEMU 7.2, i440fx `type='qemu'` under TCG; docs/kvm.md has the measurements):
live attach needs nothing from the guest; live detach is an ACPI eject the guest kernel must acknowledge, so
libvirt only *requests* it. `Domain.request_detach` asks with detachDeviceAlias (asynchronous) and
`Domain.wait_released` waits a bounded time for the device to leave the live XML; a guest that is paused,
still in its firmware or early boot, or without ACPI hot-plug support keeps it.
"""
from __future__ import annotations

import os
import pwd
import time
from collections.abc import Callable
from contextlib import suppress
from typing import Any

from xml_templates.devices import ORION_NS, ORION_PREFIX, region_name, shmem_alias, shmem_xml
from xml_templates.metadata import RegionRecord, regions_xml

from ..errors import ServiceError
from .domain_edit import CONFIG, LIVE, RegionState, read_state, scope_text, without_our_metadata

try:
    import libvirt
except ImportError:  # pragma: no cover - depends on the machine
    libvirt = None

DEFAULT_URI = "qemu:///system"
_POLL_S = 0.05


class GatewayError(ServiceError):
    """A failure reaching or changing libvirt, or of a workflow run through it (region_attach.py subclasses it);
    str() is the line for the user, with what a workflow undid after it, if anything."""

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


class Refused(GatewayError):
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
        self.gateway.call(f"attach {region_name(index)} to the {scope_text(scope)} of {self.name}",
                          self.dom.attachDeviceFlags, shmem_xml(index, size_mib), self.flag(scope))

    def request_detach(self, index: int, scope: str) -> None:
        """Remove our device from the definition; for the running domain this only asks the guest (ACPI).

        A guest can finish an earlier eject between our read of the XML and this call; libvirt then answers
        'no device found with alias': the device is gone, which is what was asked."""
        try:
            self.gateway.call(f"detach {region_name(index)} from the {scope_text(scope)} of {self.name}",
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
        self.gateway.call(f"set the Orion metadata in the {scope_text(scope)} of {self.name}", self.dom.setMetadata,
                          libvirt.VIR_DOMAIN_METADATA_ELEMENT, xml, ORION_PREFIX if xml else None, ORION_NS,
                          self.flag(scope))
