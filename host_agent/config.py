"""oriond's configuration: Orion's /etc/orion/server.conf (same keys, syntax and defaults), loaded once.

Command-line flags override the file; the frozen result is passed to whoever needs it, never read from
globals. Keys this release does not use yet (RDMA, NCCL) are still parsed and
validated so a wrong value is reported now, not when the feature arrives.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from ivshmem.orion_conf import ConfigError, ShmSettings, load_ini

DEFAULT_PATH = "/etc/orion/server.conf"
LOG_LEVELS = ("ERROR", "WARNING", "INFO", "DEBUG")


@dataclass(frozen=True)
class ServerConfig:
    path: str | None  # the file read, or None when it was missing
    listen_port: int = 9960
    bind_addr: str = "127.0.0.1"
    enable_shm: bool = True
    enable_rdma: bool = False
    enable_kvm: bool = False
    vgpu_count: int = 4
    log_level: str = "INFO"
    controller_addr: str = "127.0.0.1:9123"
    controller_configured: bool = False  # ORION_CONTROLLER or [controller] controller_addr given: oriond registers
    shm: ShmSettings = ShmSettings()

    @classmethod
    def load(cls, path: str = DEFAULT_PATH) -> ServerConfig:
        sections = load_ini(path)
        server = sections.get("server", {})
        where = f"{path}: [server]"

        def boolean(key: str, default: bool) -> bool:
            raw = server.get(key)
            if raw is None:
                return default
            if raw not in ("true", "false"):
                raise ConfigError(f'{where} {key} = {raw!r} is not a valid value; write "true" or "false"')
            return raw == "true"

        def unsigned(section: dict[str, str], key: str, default: int, low: int, high: int, name: str) -> int:
            raw = section.get(key)
            if raw is None:
                return default
            if not raw.isdigit() or not low <= int(raw) <= high:
                raise ConfigError(f"{path}: Invalid parameter {key} in session [{name}]. "
                                  f"A positive interger is expected in [{low}, {high}].")  # sic: Orion's words
            return int(raw)

        controller = os.environ.get("ORION_CONTROLLER") or sections.get("controller", {}).get("controller_addr")
        level = sections.get("server-log", {}).get("log_level", "INFO").upper()
        if level not in LOG_LEVELS:
            raise ConfigError(f"{path}: Invalid [server-log] log_level: {level} (one of {', '.join(LOG_LEVELS)})")
        config = cls(
            path=path if os.path.exists(path) else None,
            listen_port=unsigned(server, "listen_port", 9960, 1, 65533, "server"),
            bind_addr=server.get("bind_addr", "127.0.0.1"),
            enable_shm=boolean("enable_shm", True),
            enable_rdma=boolean("enable_rdma", False),
            enable_kvm=boolean("enable_kvm", False),
            vgpu_count=unsigned(server, "vgpu_count", 4, 1, 100, "server"),
            log_level=level,
            controller_addr=controller or "127.0.0.1:9123",
            controller_configured=bool(controller),
            shm=ShmSettings.load(path),
        )
        if config.enable_shm and config.enable_rdma:
            raise ConfigError(f"{path}: RDMA can not be enabled with SHM support.")
        return config
