"""Reading Orion's INI files (`/etc/orion/server.conf` and friends).

Orion's files are INI-like but not quite what configparser expects: keys are indented (spaces or a tab,
not always consistently), so configparser would read a more-indented key as a continuation of the one
before it; values are often quoted (`enable_shm = "true"`, `shm_path_base = "/dev/shm/"`). `load_ini`
smooths both out and stays generic, so the host agent's full configuration can reuse it; the typed
settings of one section (`ShmSettings`) live next to it.
"""
from __future__ import annotations

import configparser
import ipaddress
import re
from dataclasses import dataclass

from ivshmem.layout import REGION_SIZE_RANGE_MIB

SERVER_CONF = "/etc/orion/server.conf"
_NO_DEFAULT_SECTION = "\x00"  # configparser's [DEFAULT] magic is not Orion's; no header can match this


class ConfigError(ValueError):
    """A configuration file cannot be read, or holds a value of the wrong type."""


_HOST_NAME = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
                        r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?$")


def _unquote(value: str, where: str) -> str:
    """Orion's optional double quotes around a value; one without its partner is refused, never kept as text."""
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] == '"':
        return value[1:-1]
    if value.startswith('"') or value.endswith('"'):
        raise ConfigError(f"{where} = {value!r} has an unterminated quote; write the value in a pair of double "
                          'quotes ("...") or without quotes')
    return value


def whole_number(text: str) -> int | None:
    """A decimal number of ASCII digits (as Orion's C parser reads it), or None.

    `str.isdigit` and `int` also take superscripts and other scripts' digits ('²', '٣'), signs, spaces and
    underscores; none of those is a number in an Orion file or flag. Length is bounded so that `int` never
    meets Python's limit on digits."""
    if text.isascii() and text.isdigit() and len(text.lstrip("0")) <= 20:
        return int(text)
    return None


def host_name_or_ip(text: str) -> bool:
    """Whether `text` is an IPv4/IPv6 address or a DNS host name (letters, digits, '-', dot-separated labels)."""
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return bool(_HOST_NAME.match(text)) and not text.replace(".", "").isdigit()
    return True


def host_port(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (or ``[IPv6]:PORT``; an ``http://`` in front is allowed) as (host, port).

    Raises ValueError saying what is wrong (missing port, port out of range, not a host name); callers put
    the file or variable and the value in front."""
    address = text.strip()
    if address.startswith("http://"):
        address = address[len("http://"):].rstrip("/")
    if address.startswith("["):
        host, close, rest = address[1:].partition("]")
        if not close or (rest and not rest.startswith(":")) or ":" not in host:
            raise ValueError("only an IPv6 address is written in brackets, as [ADDRESS]:PORT")
        port_text = rest[1:] if rest else None
    elif address.count(":") == 1:
        host, _, port_text = address.partition(":")
    elif ":" in address:
        raise ValueError("an IPv6 address is written [ADDRESS]:PORT")
    else:
        host, port_text = address, None
    if not port_text:
        raise ValueError("the port is missing")
    port = whole_number(port_text)
    if port is None or not 1 <= port <= 65535:
        raise ValueError(f"the port {port_text!r} is not a number from 1 to 65535")
    if not host:
        raise ValueError("the host is missing")
    if not host_name_or_ip(host):
        raise ValueError(f"{host!r} is not a host name or IP address")
    return host, port


def load_ini(path: str) -> dict[str, dict[str, str]]:
    """Every section of `path` as {section: {key: value}}, quotes stripped; a missing file reads as {}.

    Leading whitespace is removed from every line first: Orion's files have no continuation lines, and
    this way a key indented more than the one above it is still a key. Line numbers are kept intact, so
    a parse error still points at the right line.
    """
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConfigError(f"{path}: cannot read the configuration file: {reason}") from None
    parser = configparser.ConfigParser(
        comment_prefixes=(";", "#"), inline_comment_prefixes=(";",), strict=False, interpolation=None,
        default_section=_NO_DEFAULT_SECTION)
    try:
        parser.read_string("\n".join(line.lstrip() for line in text.splitlines()), source=path)
    except configparser.MissingSectionHeaderError as exc:
        raise ConfigError(f"{path}, line {exc.lineno}: {exc.line.strip()!r} comes before any [section] "
                          "header") from None
    except configparser.ParsingError as exc:
        lineno, line = exc.errors[0]
        raise ConfigError(f"{path}, line {lineno}: cannot parse {line.strip()!r}; expected 'key = value', "
                          "'[section]' or a '; comment'") from None
    except configparser.Error as exc:
        raise ConfigError(f"{path}: {exc}") from None
    return {name: {key: _unquote(value, f"{path}: [{name}] {key}") for key, value in parser.items(name, raw=True)}
            for name in parser.sections()}


def _unsigned(value: str, key: str, section: str, path: str) -> int:
    """Orion's 'unsigned int' type: decimal digits that fit in 32 bits; refused in Orion's words."""
    number = whole_number(value)
    if number is not None and number <= 0xFFFFFFFF:
        return number
    raise ConfigError(f'{path}: Invalid parameter {key} [{section}]. Type "unsigned int" is expected.')


def _account(value: str, key: str, path: str, default: str) -> str:
    """A user or group name for QEMU's regions: it need not exist on this host (the region then stays 0666),
    but an empty one or one with spaces, ':' or '/' is a typo, not a name."""
    if value and not any(c.isspace() or c in ":/" for c in value):
        return value
    raise ConfigError(f"{path}: [server-shm] {key} = {value!r} is not a valid value; write a Linux "
                      f"{'user' if key == 'shm_user_name' else 'group'} name, e.g. {default}")


def _directory(value: str, path: str) -> str:
    if value.startswith("/"):
        return value
    raise ConfigError(f"{path}: [server-shm] shm_path_base = {value!r} is not a valid value; write the absolute "
                      'path of the directory of region files, e.g. "/dev/shm/"')


@dataclass(frozen=True)
class ShmSettings:
    """The [server-shm] section: where regions live, who QEMU runs as, and how large a region is."""

    path_base: str = "/dev/shm/"
    user: str = "libvirt-qemu"
    group: str = "kvm"
    buffer_size_mib: int = 128

    @classmethod
    def load(cls, path: str = SERVER_CONF) -> ShmSettings:
        """Settings from `path`; a missing file or key keeps Orion's default, as oriond does. A wrong value is
        a ConfigError naming the file and key. Whether shm_path_base exists is left to the user of it (oriond
        refuses to start without it; `orion-shm -d` has its own message)."""
        section = load_ini(path).get("server-shm", {})
        defaults = cls()
        size = section.get("shm_buffer_size")
        size_mib = defaults.buffer_size_mib if size is None else _unsigned(size, "shm_buffer_size", "server-shm", path)
        if not REGION_SIZE_RANGE_MIB[0] <= size_mib <= REGION_SIZE_RANGE_MIB[1]:
            raise ConfigError(f"{path}: Invalid parameter shm_buffer_size [server-shm]. It should be in "
                              f"[16, 1024*1024] (MiB), as orion-shm -s.")
        return cls(
            path_base=_directory(section.get("shm_path_base", defaults.path_base), path),
            user=_account(section.get("shm_user_name", defaults.user), "shm_user_name", path, defaults.user),
            group=_account(section.get("shm_group_name", defaults.group), "shm_group_name", path, defaults.group),
            buffer_size_mib=size_mib,
        )
