"""Where the Orion Controller is, read the way Orion's client reads it (ORION-COMPAT.md §4.5).

Priority: the ``ORION_CONTROLLER`` environment variable, then ``~/.orion/client.conf``, then
``/etc/orion/client.conf`` (key ``controller_addr`` in ``[controller]``). Orion's files indent their keys
under the section header, which :mod:`configparser` takes for continuation lines, so this module reads them
itself: ``[section]`` headers, ``key = value`` lines, ``#``/``;`` comments, optional quotes around values.
It is standard library only, shared by the guest runtime and ``orion-check``.
"""
from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

SYSTEM_CONF = Path("/etc/orion/client.conf")
DEFAULT_ADDRESS = "127.0.0.1:9123"  # what orion-check assumes when nothing is configured
_ADDRESS = re.compile(r"^[A-Za-z0-9.\-]+:\d{1,5}$")


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
            current[key] = value.strip("\"'")
    return sections


def _checked(address: str, source: str) -> ControllerSetting:
    address = address.strip()
    if address.startswith("http://"):
        address = address[len("http://"):].rstrip("/")
    if not _ADDRESS.match(address):
        where = "ORION_CONTROLLER" if source == "env" else f"controller_addr in {source}"
        raise ClientConfigError(f"{where} is {address!r}: expected HOST:PORT, e.g. 127.0.0.1:9123")
    return ControllerSetting(address, source)


def controller_setting(environ: Mapping[str, str] = os.environ,
                       files: tuple[Path, ...] | None = None) -> ControllerSetting | None:
    """The controller to use, or None when none is configured. Raises ClientConfigError if the first
    configured address (the one that wins) is malformed: a typo must not silently fall through to another."""
    env = environ.get("ORION_CONTROLLER", "").strip()
    if env:
        return _checked(env, "env")
    for path in files if files is not None else (user_conf(environ), SYSTEM_CONF):
        value = read_conf(path).get("controller", {}).get("controller_addr", "").strip()
        if value:
            return _checked(value, str(path))
    return None


def config_file(environ: Mapping[str, str] = os.environ, files: tuple[Path, ...] | None = None) -> Path | None:
    """The client.conf orion-check says it uses: the user's if it exists, else the system one if it exists."""
    for path in files if files is not None else (user_conf(environ), SYSTEM_CONF):
        if path.is_file():
            return path
    return None
