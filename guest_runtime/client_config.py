"""Where the Orion Controller is, read the way Orion's client reads it.

Priority: the ``ORION_CONTROLLER`` environment variable, then ``~/.orion/client.conf``, then
``/etc/orion/client.conf`` (key ``controller_addr`` in ``[controller]``). The files are read by the one INI
reader (ini.py), leniently as Orion's client read them: a line it does not understand is skipped, a pair of
double or single quotes around a value is removed and a lone quote is kept, so that the address check (ini.py's,
the host's too) refuses it.
It is standard library only, shared by the guest runtime and ``orion-check``: it does not import ivshmem (whose
package import costs a guest program ~0.1 s).
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ivshmem.shared.ini import ConfigError, address_problem, bare_address, read_ini, unquote

SYSTEM_CONF = Path("/etc/orion/client.conf")
DEFAULT_ADDRESS = "127.0.0.1:9123"  # what orion-check assumes when nothing is configured
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
    try:
        sections = read_ini(path, strict=False)
    except ConfigError:
        return {}
    return {name: {key: _unquoted(value) for key, value in keys.items()} for name, keys in sections.items()}


def _unquoted(value: str) -> str:
    """A pair of quotes is Orion's syntax; a lone one is kept, so that the value's check refuses it."""
    try:
        return unquote(value, "", quotes=_QUOTES)
    except ConfigError:
        return value


def _checked(address: str, source: str) -> ControllerSetting:
    address = bare_address(address)
    problem = address_problem(address)
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
