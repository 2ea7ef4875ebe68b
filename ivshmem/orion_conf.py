"""Reading Orion's INI files (`/etc/orion/server.conf` and friends).

Orion's files are INI-like but not quite what configparser expects: keys are indented (spaces or a tab,
not always consistently), so configparser would read a more-indented key as a continuation of the one
before it; values are often quoted (`enable_shm = "true"`, `shm_path_base = "/dev/shm/"`). `load_ini`
smooths both out and stays generic, so the host agent's full configuration can reuse it; the typed
settings of one section (`ShmSettings`) live next to it.
"""
from __future__ import annotations

import configparser
from dataclasses import dataclass

SERVER_CONF = "/etc/orion/server.conf"
_NO_DEFAULT_SECTION = "\x00"  # configparser's [DEFAULT] magic is not Orion's; no header can match this


class ConfigError(ValueError):
    """A configuration file cannot be read, or holds a value of the wrong type."""


def _unquote(value: str) -> str:
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] == '"':
        return value[1:-1]
    return value


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
    return {name: {key: _unquote(value) for key, value in parser.items(name, raw=True)}
            for name in parser.sections()}


def _unsigned(value: str, key: str, section: str, path: str) -> int:
    """Orion's 'unsigned int' type: decimal digits that fit in 32 bits; refused in Orion's words."""
    if value.isascii() and value.isdigit() and int(value) <= 0xFFFFFFFF:
        return int(value)
    raise ConfigError(f'{path}: Invalid parameter {key} [{section}]. Type "unsigned int" is expected.')


@dataclass(frozen=True)
class ShmSettings:
    """The [server-shm] section: where regions live, who QEMU runs as, and how large a region is."""

    path_base: str = "/dev/shm/"
    user: str = "libvirt-qemu"
    group: str = "kvm"
    buffer_size_mib: int = 128

    @classmethod
    def load(cls, path: str = SERVER_CONF) -> ShmSettings:
        """Settings from `path`; a missing file or key keeps Orion's default, as oriond does."""
        section = load_ini(path).get("server-shm", {})
        defaults = cls()
        size = section.get("shm_buffer_size")
        return cls(
            path_base=section.get("shm_path_base") or defaults.path_base,
            user=section.get("shm_user_name", defaults.user),
            group=section.get("shm_group_name", defaults.group),
            buffer_size_mib=defaults.buffer_size_mib if size is None
            else _unsigned(size, "shm_buffer_size", "server-shm", path),
        )
