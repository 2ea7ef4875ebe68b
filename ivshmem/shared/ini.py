"""The one reader of Orion's INI files (server.conf, client.conf), and the address checks both sides use.

Orion's files are INI-like but not what configparser expects: keys are indented (spaces or a tab, not always
consistently), which configparser takes for continuation lines, and values are often quoted
(`enable_shm = "true"`). So every line is read on its own: `[section]` headers (`[ name ]` is `[name]`),
`key = value` (or `key: value`) lines with the key lower-cased, `;`/`#` comment lines and ` ;` comments after
a value. What a value means, and how a quote in it is treated, is the caller's: `load_ini` is server.conf's
strict reading (host_agent/server_conf.py), `read_ini(strict=False)` the client's lenient one
(client_config.py), which skips what it does not understand, as Orion's client did.

It lives in ivshmem/shared/ because both sides read Orion's files and both wheels ship ivshmem. It imports the
standard library only (a guest program imports it at start-up), and never cuda or anything that activates forwarding.
SERVER_CONF is where server.conf lies unless a command is told otherwise (oriond, orion-shm, the libvirt hook and
orion-check all default to it).
"""
from __future__ import annotations

import ipaddress
import os
import re

SERVER_CONF = "/etc/orion/server.conf"  # where server.conf lies unless a command is told otherwise

Sections = dict[str, dict[str, str]]

_SECTION = re.compile(r"\[(?P<name>.+)\]")
_OPTION = re.compile(r"(?P<key>.*?)\s*[=:]\s*(?P<value>.*)$")
_HOST_NAME = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
                        r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?$")
_DOUBLE_QUOTE = '"'
_QUOTES = "\"'"


class ConfigError(ValueError):
    """A configuration file cannot be read, or holds a value of the wrong type."""


def _without_comment(line: str) -> str:
    """`line` stripped, without a comment: a line starting with ';' or '#' is all comment; after a value only
    ';' preceded by a blank starts one (so `a;b` stays a value, as configparser read it)."""
    text = line.strip()
    if text[:1] in (";", "#"):
        return ""
    cut = next((i for i, c in enumerate(text) if c == ";" and i > 0 and text[i - 1].isspace()), len(text))
    return text[:cut].strip()


def parse_ini(text: str, where: str, strict: bool = True) -> Sections:
    """Every section of `text` as {section: {key: value}}, values exactly as written (quotes kept).

    Strict: a line that is neither a header, a `key = value` nor a comment, or a key before any header, is a
    ConfigError naming `where` and the line number. Lenient (`strict=False`): such lines are skipped."""
    sections: Sections = {}
    current: dict[str, str] | None = None
    for number, line in enumerate(text.splitlines(), start=1):
        content = _without_comment(line)
        if not content:
            continue
        header = _SECTION.match(content)
        if header:
            current = sections.setdefault(header["name"].strip(), {})
            continue
        if current is None:
            if strict:
                raise ConfigError(f"{where}, line {number}: {line.strip()!r} comes before any [section] header")
            continue
        option = _OPTION.match(content)
        if option and option["key"]:
            current[option["key"].rstrip().lower()] = option["value"].strip()
        elif strict:
            raise ConfigError(f"{where}, line {number}: cannot parse {line.strip()!r}; expected 'key = value', "
                              "'[section]' or a '; comment'")
    return sections


def read_ini(path: str | os.PathLike[str], strict: bool = True) -> Sections:
    """`parse_ini` of the file at `path`; a missing file reads as {}. One that exists but cannot be read is a
    ConfigError; lenient, bytes that are not UTF-8 read as U+FFFD instead of failing the whole file."""
    try:
        with open(path, encoding="utf-8", errors="strict" if strict else "replace") as f:
            text = f.read()
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConfigError(f"{path}: cannot read the configuration file: {reason}") from None
    return parse_ini(text, str(path), strict)


def unquote(value: str, where: str, quotes: str = _DOUBLE_QUOTE) -> str:
    """`value` without Orion's optional pair of quotes (any of `quotes`); a quote without its partner is a
    ConfigError naming `where`, never kept as text."""
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in quotes:
        return value[1:-1]
    if value and (value[0] in quotes or value[-1] in quotes):
        raise ConfigError(f"{where} = {value!r} has an unterminated quote; write the value in a pair of double "
                          'quotes ("...") or without quotes')
    return value


def load_ini(path: str) -> Sections:
    """server.conf's reading: strict, every value unquoted (a pair of double quotes), a lone quote refused."""
    return {name: {key: unquote(value, f"{path}: [{name}] {key}") for key, value in keys.items()}
            for name, keys in read_ini(path).items()}


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


def bare_address(text: str) -> str:
    """`text` without surrounding blanks and without an ``http://`` in front (and a '/' after)."""
    address = text.strip()
    if address.startswith("http://"):
        address = address[len("http://"):].rstrip("/")
    return address


def _split(address: str) -> tuple[str, str]:
    """(host, port text) of a bare address; ValueError saying what is wrong with its shape."""
    if address and (address[0] in _QUOTES or address[-1] in _QUOTES):
        raise ValueError("it has an unterminated quote")
    if address.startswith("["):
        host, close, rest = address[1:].partition("]")
        if not close or (rest and not rest.startswith(":")) or ":" not in host:
            raise ValueError("only an IPv6 address is written in brackets, as [ADDRESS]:PORT")
        return host, rest[1:]
    if address.count(":") == 1:
        host, _, port_text = address.partition(":")
        return host, port_text
    if ":" in address:
        raise ValueError("an IPv6 address is written [ADDRESS]:PORT")
    return address, ""


def host_port(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (or ``[IPv6]:PORT``; an ``http://`` in front is allowed) as (host, port), the port 1-65535.

    Raises ValueError saying what is wrong (a quote, a missing port, a port out of range, not a host name);
    callers put the file or variable and the value in front."""
    address = bare_address(text)
    if "://" in address:
        raise ValueError("only http:// may be written before HOST:PORT")
    host, port_text = _split(address)
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


def normal_address(text: str) -> str:
    """`text` read by `host_port` and written back as HOST:PORT ([IPv6]:PORT); ValueError as `host_port`."""
    host, port = host_port(text)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def address_problem(text: str) -> str | None:
    """What is wrong with ``text`` as a controller address (see `host_port`), or None when it is one."""
    try:
        host_port(text)
    except ValueError as exc:
        return str(exc)
    return None
