"""Where the Orion Controller is, read the way Orion's client reads it (ORION-COMPAT.md §4.5).

Priority: the ``ORION_CONTROLLER`` environment variable, then ``~/.orion/client.conf``, then
``/etc/orion/client.conf`` (key ``controller_addr`` in ``[controller]``). Orion's files indent their keys
under the section header, which :mod:`configparser` takes for continuation lines, so this module reads them
itself: ``[section]`` headers, ``key = value`` lines, ``#``/``;`` comments, optional quotes around values.
It is standard library only, shared by the guest runtime and ``orion-check``: it does not import ivshmem (whose
package import costs a guest program ~0.1 s), so the address check below mirrors ivshmem.orion_conf.host_port.
"""
from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

SYSTEM_CONF = Path("/etc/orion/client.conf")
DEFAULT_ADDRESS = "127.0.0.1:9123"  # what orion-check assumes when nothing is configured
_HOST_NAME = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
                        r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?$")
_QUOTES = "\"'"


class ClientConfigError(ValueError):
    """A configured controller address is malformed; the message names where it came from."""


@dataclass(frozen=True)
class ControllerSetting:
    """A controller address and where it was found: ``env`` or the client.conf path it came from."""

    address: str
    source: str

    @property
    def from_env(self) -> bool:
        return self.source == "env"


def user_conf(environ: Mapping[str, str] = os.environ) -> Path:
    home = environ.get("HOME") or str(Path.home())
    return Path(home) / ".orion" / "client.conf"


def read_conf(path: Path) -> dict[str, dict[str, str]]:
    """``{section: {key: value}}`` of an Orion-style conf file; {} if it cannot be read."""
    sections: dict[str, dict[str, str]] = {}
    current: dict[str, str] = sections.setdefault("", {})
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1].strip(), {})
        elif "=" in line:
            key, value = (part.strip() for part in line.split("=", 1))
            # A pair of quotes is Orion's syntax; a lone one is kept, so that the value's check refuses it.
            paired = len(value) >= 2 and value[0] == value[-1] and value[0] in _QUOTES
            current[key] = value[1:-1] if paired else value
    return sections


def _problem(address: str) -> str | None:
    """What is wrong with ``HOST:PORT`` (or ``[IPv6]:PORT``), or None."""
    if address[:1] in _QUOTES or address[-1:] in _QUOTES:
        return "it has an unterminated quote"
    if address.startswith("["):
        host, _, port = address[1:].partition("]:")
        if ":" not in host:
            return "only an IPv6 address is written in brackets, as [ADDRESS]:PORT"
    elif address.count(":") == 1:
        host, _, port = address.partition(":")
    else:
        return "the port is missing" if ":" not in address else "an IPv6 address is written [ADDRESS]:PORT"
    if not port:
        return "the port is missing"
    if not (port.isascii() and port.isdigit() and len(port) <= 5 and 1 <= int(port) <= 65535):
        return f"the port {port!r} is not a number from 1 to 65535"
    try:
        ipaddress.ip_address(host)
    except ValueError:
        if not _HOST_NAME.match(host) or host.replace(".", "").isdigit():
            return f"{host!r} is not a host name or IP address"
    return None


def _checked(address: str, source: str) -> ControllerSetting:
    address = address.strip()
    if address.startswith("http://"):
        address = address[len("http://"):].rstrip("/")
    problem = _problem(address)
    if problem is not None:
        where = "ORION_CONTROLLER" if source == "env" else f"controller_addr in {source}"
        raise ClientConfigError(f"{where} is {address!r}: {problem}; expected HOST:PORT, e.g. 127.0.0.1:9123")
    return ControllerSetting(address, source)


def _file_address(path: Path) -> str:
    """controller_addr of ``path``; "" when the file or the key is missing. A file that exists but cannot be
    read is an error: skipping it would silently use the next file's controller."""
    try:
        path.stat()
    except FileNotFoundError:
        return ""
    except OSError as exc:
        raise ClientConfigError(f"cannot read {path}: {exc.strerror}; fix or remove it") from None
    if not os.access(path, os.R_OK) or path.is_dir():
        why = "it is a directory" if path.is_dir() else "permission denied"
        raise ClientConfigError(f"cannot read {path}: {why}; fix or remove it")
    return read_conf(path).get("controller", {}).get("controller_addr", "").strip()


def controller_setting(environ: Mapping[str, str] = os.environ,
                       files: tuple[Path, ...] | None = None) -> ControllerSetting | None:
    """The controller to use, or None when none is configured. Raises ClientConfigError if the first
    configured address (the one that wins) is malformed: a typo must not silently fall through to another."""
    env = environ.get("ORION_CONTROLLER", "").strip()
    if env:
        return _checked(env, "env")
    for path in files if files is not None else (user_conf(environ), SYSTEM_CONF):
        value = _file_address(path)
        if value:
            return _checked(value, str(path))
    return None


def config_file(environ: Mapping[str, str] = os.environ, files: tuple[Path, ...] | None = None) -> Path | None:
    """The client.conf orion-check says it uses: the user's if it exists, else the system one if it exists."""
    for path in files if files is not None else (user_conf(environ), SYSTEM_CONF):
        if path.is_file():
            return path
    return None
