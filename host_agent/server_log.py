"""oriond's logging, as `[server-log]` of server.conf configures it (Orion's keys, one of ours).

- The system log `<log_dir>/server.log` (Orion's /var/log/orion/server.log): with `log_to_file = 1` (Orion's
  default), at `file_log_level`. It is written through a WatchedFileHandler, so logrotate may move it
  (setup.sh installs /etc/logrotate.d/orion); the next record opens a new one.
- Per-session logs `<log_dir>/session/<YYYY-mm-dd-HH-MM-SS>-<source>-<session>.log`, where Orion kept them:
  each session worker adds one, a region's and a relayed session's alike, holding its session's records (they go to
  server.log too).
- The screen (stderr) at `log_level`: with `log_to_screen = 1`. Orion's default was 0; here the key left out
  means 1, because a service manager's journal and a terminal both read stderr, and an oriond started by hand must
  not be silent.
- `log_with_time = 1` puts the time first on every line.

A directory that cannot be made or written is one warning, and oriond runs on with the screen: a log it cannot
keep never stops it. Not here: what is logged (each module's own logger) and the checks of the keys' values
(daemon/config.py). It sits beside agent_metrics.py, not in daemon/, because the relay listener's session
workers (relay/) open their session logs too.
"""
from __future__ import annotations

import logging
import logging.handlers
import os
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

DEFAULT_LOG_DIR = "/var/log/orion"
SESSION_DIR = "session"


@dataclass(frozen=True)
class LogSettings:
    """[server-log], read."""

    with_time: bool = True
    to_screen: bool = True
    to_file: bool = True
    level: str = "INFO"
    file_level: str = "INFO"
    directory: str = DEFAULT_LOG_DIR


_configured: LogSettings | None = None  # this process's, inherited by the session workers it forks


def _formatter(settings: LogSettings) -> logging.Formatter:
    return logging.Formatter("%(asctime)s [%(levelname)s] %(message)s" if settings.with_time
                             else "[%(levelname)s] %(message)s")


def configure(settings: LogSettings) -> None:
    """Set this process's logging (the root logger's handlers) as `settings` say."""
    global _configured
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
        handler.close()
    levels = [logging.getLevelName(settings.level)]
    problem = ""
    if settings.to_file:
        try:
            os.makedirs(settings.directory, exist_ok=True)
            file = logging.handlers.WatchedFileHandler(os.path.join(settings.directory, "server.log"))
        except OSError as exc:
            problem = (f"cannot write {settings.directory}/server.log ({exc.strerror or exc}); logging to stderr "
                       "only: make the directory writable for oriond, or set [server-log] log_dir (or log_to_file "
                       "= 0)")
            settings = replace(settings, to_screen=True, to_file=False)  # the screen, whatever log_to_screen said
        else:
            file.setLevel(settings.file_level)
            file.setFormatter(_formatter(settings))
            root.addHandler(file)
            levels.append(logging.getLevelName(settings.file_level))
    if settings.to_screen:
        screen = logging.StreamHandler(sys.stderr)
        screen.setLevel(settings.level)
        screen.setFormatter(_formatter(settings))
        root.addHandler(screen)
    root.setLevel(min(levels))
    _configured = settings
    if problem:
        logging.warning("%s", problem)


def session_log(session: int, source: str) -> Path | None:
    """In a session worker: its own log file, beside server.log (None where there is no file log), named by its
    start time, `source` (the region file's name, or "relay" for a session relayed here) and its number there:
    session numbers count per region and per relay listener, so the source keeps two of one second apart."""
    settings = _configured
    if settings is None or not settings.to_file:
        return None
    directory = Path(settings.directory, SESSION_DIR)
    path = directory / f"{time.strftime('%Y-%m-%d-%H-%M-%S')}-{source}-{session}.log"
    try:
        directory.mkdir(mode=0o755, parents=True, exist_ok=True)
        handler = logging.FileHandler(path)
    except OSError as exc:
        logging.warning("session %d: no session log (%s); its records are in server.log", session,
                        exc.strerror or exc)
        return None
    handler.setLevel(settings.file_level)
    handler.setFormatter(_formatter(settings))
    logging.getLogger().addHandler(handler)
    return path
