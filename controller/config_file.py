"""Orion's controller.yaml, read for `orion-controller start --config-file FILE` (its installer's ExecStart line).

Only what the file says about this controller becomes a setting: `controller.listen_ip` and `listen_port` (the REST
API's address), `log_level`, `log_file` (null, "null" or absent: stdout), and the etcd it uses. Orion's controller
ran that etcd itself from the `database` section; here etcd is a service of its own (setup.sh's), so of that section
only the client URL is read, `advertise-client-urls` (else `listen-client-urls`): where the controller connects.
Every other key of those sections (etcd's own settings, `authentication`: members prove themselves with the cluster
key here, docs/security.md) is accepted as Orion wrote it; a key or section Orion's file does not have is reported
to the caller, so that a typo does not pass silently. Flags given on the command line win over the file.

Not here: the settings' own checks (config.ControllerConfig.build), which a value from the file goes through as a
flag's does.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from controller.config import ConfigError

CONTROLLER_KEYS = frozenset({"listen_ip", "listen_port", "log_level", "log_file", "authentication", "vgpu_num"})
LOG_LEVELS = {"debug": "debug", "info": "info", "warn": "warn", "warning": "warn", "error": "error"}
EXAMPLE = "e.g. controller: {listen_ip: 0.0.0.0, listen_port: 9123} (docs/controller.md)"


def _section(data: dict[str, Any], name: str, path: str) -> dict[str, Any]:
    value = data.get(name)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"--config-file {path}: '{name}' is not a section of keys; {EXAMPLE}")
    return value


def _text(value: Any, key: str, path: str) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise ConfigError(f"--config-file {path}: {key} = {value!r} is not a valid value; {EXAMPLE}")
    return str(value).strip()


def start_flags(path: str) -> tuple[dict[str, str], list[str]]:
    """The `start` flags the file stands for ("listen", "etcd", "log", "log_level"; only those it sets), and the
    keys it has that Orion's controller.yaml does not ("[section] key"). ConfigError, one line, otherwise."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConfigError(f"--config-file {path}: cannot read it ({why}); name Orion's controller.yaml, e.g. "
                          "/etc/orion/controller.yaml") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        at = f" at line {where.line + 1}" if where is not None else ""
        raise ConfigError(f"--config-file {path} is not valid YAML{at}; {EXAMPLE}") from None
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise ConfigError(f"--config-file {path} is not a YAML mapping of sections; {EXAMPLE}")
    controller, database = _section(data, "controller", path), _section(data, "database", path)
    unknown = [f"[{name}]" for name in data if name not in ("controller", "database")]
    unknown += [f"[controller] {key}" for key in controller if key not in CONTROLLER_KEYS]
    flags: dict[str, str] = {}
    if "listen_ip" in controller or "listen_port" in controller:
        host = _text(controller.get("listen_ip", "0.0.0.0"), "controller.listen_ip", path)
        port = _text(controller.get("listen_port", 9123), "controller.listen_port", path)
        flags["listen"] = f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"
    if controller.get("log_level") is not None:
        level = _text(controller["log_level"], "controller.log_level", path).lower()
        if level not in LOG_LEVELS:
            raise ConfigError(f"--config-file {path}: controller.log_level = {level!r} is not a valid value; write "
                              f"one of {', '.join(sorted(LOG_LEVELS))}")
        flags["log_level"] = LOG_LEVELS[level]
    log_file = controller.get("log_file")
    if log_file is not None and _text(log_file, "controller.log_file", path) not in ("", "null"):
        flags["log"] = _text(log_file, "controller.log_file", path)
    urls = database.get("advertise-client-urls") or database.get("listen-client-urls")
    if urls is not None:
        flags["etcd"] = _text(urls, "database.advertise-client-urls", path)
    return flags, unknown
