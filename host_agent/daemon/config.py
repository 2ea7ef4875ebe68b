"""oriond's configuration: Orion's /etc/orion/server.conf (same keys, syntax and defaults), loaded once.

Command-line flags override the file; the frozen result is passed to whoever needs it, never read from
globals. Every key Orion's server.conf knows is validated here, including those this release accepts without using
(docs/configuration.md says which: the NCCL switch), so a wrong value is reported now, not when the
feature arrives; a key
Orion does not know is listed in `unknown_keys` for oriond to warn about (a typo must not pass silently).
The parsers of oriond's flag values live here too, so that a flag and its server.conf key accept the same
values. Errors are ConfigError (or ValueError for a flag value) with one line that names the file, key or
flag, the bad value and what to write instead; Orion's own wording where it had one (its server.conf messages).
"""
from __future__ import annotations

import math
import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ivshmem.shared.ini import SERVER_CONF, ConfigError, host_name_or_ip, load_ini, normal_address, whole_number

from ..server_conf import DEFAULT_KEY_FILE, ShmSettings, cluster_key_file
from ..server_log import DEFAULT_LOG_DIR, LogSettings
from ..session.image_cache import CacheSettings
from .mps import DEFAULT_MPS_DIR, MpsSettings

DEFAULT_PATH = SERVER_CONF
DEFAULT_CONTROLLER = "127.0.0.1:9123"
LOG_LEVELS = ("ERROR", "WARNING", "INFO", "DEBUG")
PORT_RANGE = (1, 65533)  # Orion's: the server uses listen_port and the two ports after it
VGPU_RANGE = (1, 100)
# Orion's server.conf keys; [dev] is an internal section of Orion's binary, accepted as it is.
KNOWN_KEYS = {
    "server": {"listen_port", "bind_addr", "enable_shm", "enable_rdma", "enable_kvm", "vgpu_count",
               "enable_ibverbs", "ibverbs_device"},
    "server-nccl": {"comm_id"},
    "server-log": {"log_with_time", "log_to_screen", "log_to_file", "log_level", "file_log_level",
                   "log_dir"},  # log_dir: Orion vGPU's own (Orion's was fixed: /var/log/orion)
    "server-shm": {"shm_path_base", "shm_group_name", "shm_user_name", "shm_buffer_size"},
    "controller": {"controller_addr"},
    "dev": {f"dev_{n}" for n in range(1, 6)},
    "server-image-cache": {"image_cache_dir", "image_cache_mib"},  # Orion vGPU's own: module images by digest
    "server-relay": {"remote_addr"},  # Orion vGPU's own: relay every session to one GPU host (docs/remote.md)
    "cluster": {"key_file"},  # Orion vGPU's own: the cluster key (docs/security.md)
    "server-mps": {"enable_mps", "mps_dir"},  # Orion vGPU's own: session workers under NVIDIA MPS (daemon/mps.py)
    "server-metrics": {"metrics_addr"},  # Orion vGPU's own: oriond's Prometheus /metrics (daemon/metrics_server.py)
}
# The per-host cache of module images (host_agent/session/image_cache.py): FHS's place for data that can be made again.
DEFAULT_IMAGE_CACHE_DIR = "/var/cache/orion/images"
DEFAULT_IMAGE_CACHE_MIB = 2048
IMAGE_CACHE_MIB_RANGE = (0, 1 << 20)  # 0 turns the cache off


@dataclass(frozen=True)
class ServerConfig:
    path: str | None  # the file read, or None when it was missing
    listen_port: int = 9960
    bind_addr: str = "127.0.0.1"
    enable_shm: bool = True
    enable_rdma: bool = False  # relay connections over RDMA where both hosts can (also Orion's enable_ibverbs)
    ibverbs_device: str = ""  # the RDMA device relay connections use; "": the one with the connection's address
    enable_kvm: bool = False
    vgpu_count: int = 4
    log_level: str = "INFO"
    log: LogSettings = LogSettings()  # [server-log]: where and how oriond logs (server_log.py)
    controller_addr: str = DEFAULT_CONTROLLER
    controller_configured: bool = False  # ORION_CONTROLLER or [controller] controller_addr given: oriond registers
    shm: ShmSettings = ShmSettings()
    image_cache: CacheSettings = CacheSettings(DEFAULT_IMAGE_CACHE_DIR, DEFAULT_IMAGE_CACHE_MIB << 20)
    unknown_keys: tuple[str, ...] = ()  # "[section] key" of keys Orion does not know: ignored, worth a warning
    relay: bool = False  # a [server-relay] section: this oriond relays sessions to GPU hosts (docs/remote.md)
    relay_addr: str = ""  # [server-relay] remote_addr: the one GPU host (HOST:PORT) every session is relayed to
    listen_port_set: bool = False  # listen_port is in the file: the relay listener is on (docs/remote.md)
    cluster_key_file: Path = DEFAULT_KEY_FILE  # [cluster] key_file: the cluster key (docs/security.md)
    mps: MpsSettings = MpsSettings()  # [server-mps]: session workers under NVIDIA MPS (daemon/mps.py)
    metrics_addr: str = ""  # [server-metrics] metrics_addr: where oriond serves /metrics ("": nowhere)

    @classmethod
    def load(cls, path: str = DEFAULT_PATH, environ: Mapping[str, str] = os.environ) -> ServerConfig:
        """`path` (a missing file means Orion's defaults) with ORION_CONTROLLER from `environ` over it."""
        sections = load_ini(path)
        server = sections.get("server", {})
        log = sections.get("server-log", {})

        def boolean(key: str, default: bool) -> bool:
            raw = server.get(key)
            if raw is None:
                return default
            if raw not in ("true", "false"):
                raise ConfigError(f'{path}: [server] {key} = {raw!r} is not a valid value; write "true" or "false"')
            return raw == "true"

        def unsigned(key: str, default: int, low: int, high: int) -> int:
            raw = server.get(key)
            if raw is None:
                return default
            number = whole_number(raw)
            if number is None or not low <= number <= high:
                raise ConfigError(f"{path}: Invalid parameter {key} in session [server]. "
                                  f"A positive interger is expected in [{low}, {high}].")  # sic: Orion's words
            return number

        def level(key: str) -> str:
            raw = log.get(key, "INFO")
            if raw.upper() not in LOG_LEVELS or not raw.isascii():
                raise ConfigError(f"{path}: Invalid [server-log] {key}: {raw} (one of {', '.join(LOG_LEVELS)})")
            return raw.upper()

        for key in ("log_with_time", "log_to_screen", "log_to_file"):
            if log.get(key, "0") not in ("0", "1"):
                raise ConfigError(f"{path}: [server-log] {key} = {log[key]!r} is not a valid value; write 0 or 1")
        log_dir = log.get("log_dir", DEFAULT_LOG_DIR).strip()
        if not log_dir.startswith("/"):
            raise ConfigError(f"{path}: [server-log] log_dir = {log_dir!r} is not a valid value; write an absolute "
                              f"path, e.g. {DEFAULT_LOG_DIR}")
        logging = LogSettings(with_time=log.get("log_with_time", "1") == "1",
                              to_screen=log.get("log_to_screen", "1") == "1",
                              to_file=log.get("log_to_file", "1") == "1", level=level("log_level"),
                              file_level=level("file_log_level"), directory=log_dir)
        if "ibverbs_device" in server and not server["ibverbs_device"].strip():
            raise ConfigError(f"{path}: [server] ibverbs_device is empty; name an RDMA device (e.g. mlx5_0) or "
                              "remove the key")
        comm_id = sections.get("server-nccl", {}).get("comm_id")
        if comm_id is not None:
            _address(comm_id, f"{path}: [server-nccl] comm_id", "127.0.0.1:9970")
        bind_addr = server.get("bind_addr", "127.0.0.1")
        if not host_name_or_ip(bind_addr):
            raise ConfigError(f"{path}: [server] bind_addr = {bind_addr!r} is not a valid value; write this host's "
                              "IP address (or host name), e.g. 127.0.0.1")
        controller = _controller(path, sections, environ)
        relay = sections.get("server-relay")
        remote = (relay or {}).get("remote_addr", "").strip()
        config = cls(
            path=path if os.path.exists(path) else None,
            listen_port=unsigned("listen_port", 9960, *PORT_RANGE),
            bind_addr=bind_addr,
            enable_shm=boolean("enable_shm", True),
            enable_rdma=boolean("enable_rdma", False) or boolean("enable_ibverbs", False),
            ibverbs_device=server.get("ibverbs_device", "").strip(),
            enable_kvm=boolean("enable_kvm", False),
            vgpu_count=unsigned("vgpu_count", 4, *VGPU_RANGE),
            log_level=level("log_level"),
            log=logging,
            controller_addr=controller or DEFAULT_CONTROLLER,
            controller_configured=bool(controller),
            shm=ShmSettings.load(path),
            image_cache=_image_cache(path, sections.get("server-image-cache", {})),
            unknown_keys=_unknown(sections),
            relay=relay is not None,
            relay_addr=_address(remote, f"{path}: [server-relay] remote_addr", "192.168.1.20:9960") if remote else "",
            listen_port_set="listen_port" in server,
            cluster_key_file=cluster_key_file(sections.get("cluster", {}), path),
            mps=_mps(path, sections.get("server-mps", {})),
            metrics_addr=_metrics_addr(path, sections.get("server-metrics", {})),
        )
        # Orion refused enable_shm with enable_rdma ("RDMA can not be enabled with SHM support."): its client spoke
        # SHM locally or RDMA remotely. Here every oriond may do both, SHM towards its own guests and RDMA between
        # hosts for relayed sessions (docs/remote.md), so the pair is accepted (docs/architecture.md).
        return config

    def check_region_dir(self) -> None:
        """Refuse a shm_path_base that is not an existing, readable directory (oriond serves its regions).

        It is never created here: a typo in the path would otherwise give an agent that silently serves an
        empty directory nobody writes regions to."""
        where = (f"{self.path}: [server-shm] shm_path_base = {self.shm.path_base!r}" if self.path is not None
                 else f"shm_path_base (default {self.shm.path_base!r}, no server.conf)")
        directory = self.shm.path_base.rstrip("/") or "/"
        try:
            mode = os.stat(directory).st_mode
        except FileNotFoundError:
            raise ConfigError(f"{where}: no such directory; create it (mkdir -p {directory}) or set "
                              "shm_path_base to the directory of the region files") from None
        except OSError as exc:
            raise ConfigError(f"{where}: cannot be used ({exc.strerror}); set shm_path_base to the directory "
                              "of the region files") from None
        if not stat.S_ISDIR(mode):
            raise ConfigError(f"{where} is not a directory; set shm_path_base to the directory of the region "
                              "files, e.g. /dev/shm/")
        if not os.access(directory, os.R_OK | os.X_OK):
            raise ConfigError(f"{where}: this user cannot list it; run oriond as a user who can (root), or fix "
                              "the directory's permissions")


def _image_cache(path: str, section: Mapping[str, str]) -> CacheSettings:
    """[server-image-cache]: an absolute directory and a size bound in MiB (0: no cache)."""
    directory = section.get("image_cache_dir", DEFAULT_IMAGE_CACHE_DIR).strip()
    if not directory.startswith("/"):
        raise ConfigError(f"{path}: [server-image-cache] image_cache_dir = {directory!r} is not a valid value; "
                          f"write an absolute path, e.g. {DEFAULT_IMAGE_CACHE_DIR}")
    raw = section.get("image_cache_mib")
    mib = DEFAULT_IMAGE_CACHE_MIB if raw is None else whole_number(raw)
    low, high = IMAGE_CACHE_MIB_RANGE
    if mib is None or not low <= mib <= high:
        raise ConfigError(f"{path}: [server-image-cache] image_cache_mib = {raw!r} is not a valid value; write a "
                          f"whole number of MiB from {low} (no cache) to {high}, e.g. {DEFAULT_IMAGE_CACHE_MIB}")
    return CacheSettings(directory, mib << 20)


def _metrics_addr(path: str, section: Mapping[str, str]) -> str:
    """[server-metrics] metrics_addr: HOST:PORT, or "" (no /metrics)."""
    raw = section.get("metrics_addr", "").strip()
    return _address(raw, f"{path}: [server-metrics] metrics_addr", "127.0.0.1:9966") if raw else ""


def _mps(path: str, section: Mapping[str, str]) -> MpsSettings:
    """[server-mps]: enable_mps true or false, and an absolute mps_dir."""
    raw = section.get("enable_mps", "false")
    if raw not in ("true", "false"):
        raise ConfigError(f'{path}: [server-mps] enable_mps = {raw!r} is not a valid value; write "true" or "false"')
    directory = section.get("mps_dir", DEFAULT_MPS_DIR).strip()
    if not directory.startswith("/"):
        raise ConfigError(f"{path}: [server-mps] mps_dir = {directory!r} is not a valid value; write an absolute "
                          f"path, e.g. {DEFAULT_MPS_DIR}")
    return MpsSettings(raw == "true", directory)


def _unknown(sections: dict[str, dict[str, str]]) -> tuple[str, ...]:
    """The sections and keys of `sections` that Orion's server.conf does not have, as '[section] key'."""
    found = []
    for name, keys in sections.items():
        if name not in KNOWN_KEYS:
            found.append(f"[{name}]")
        found += [f"[{name}] {key}" for key in keys if name in KNOWN_KEYS and key not in KNOWN_KEYS[name]]
    return tuple(found)


def _address(value: str, where: str, example: str = DEFAULT_CONTROLLER) -> str:
    """`value` as HOST:PORT (an http:// in front is dropped); ConfigError naming `where` otherwise."""
    try:
        return normal_address(value)
    except ValueError as exc:
        raise ConfigError(f"{where} = {value!r} is not a valid value: {exc}; write HOST:PORT, "
                          f"e.g. {example}") from None


def _controller(path: str, sections: dict[str, dict[str, str]], environ: Mapping[str, str]) -> str | None:
    """ORION_CONTROLLER, else [controller] controller_addr (Orion's priority), validated; None when neither is set.

    An empty or blank variable counts as unset, as an empty key does."""
    env = environ.get("ORION_CONTROLLER", "").strip()
    if env:
        return _address(env, "ORION_CONTROLLER")
    value = sections.get("controller", {}).get("controller_addr", "").strip()
    return _address(value, f"{path}: [controller] controller_addr") if value else None


# --- oriond's flag values: each raises ValueError with the line to show after the flag's name ------------------
def flag_count(text: str, what: str, high: int = 0xFFFFFFFF) -> int:
    """A whole number from 1 to `high` (ASCII digits only)."""
    number = whole_number(text)
    if number is None or not 1 <= number <= high:
        raise ValueError(f"{text!r} is not {what}: expected a whole number from 1 to {high}")
    return number


def flag_port(text: str) -> int:
    number = whole_number(text)
    if number is None or not PORT_RANGE[0] <= number <= PORT_RANGE[1]:
        raise ValueError(f"{text!r} is not a listen port: expected a number from {PORT_RANGE[0]} to {PORT_RANGE[1]} "
                         "(the server also uses the two ports after it)")
    return number


def flag_host(text: str) -> str:
    if not host_name_or_ip(text):
        raise ValueError(f"{text!r} is not an IP address or host name: expected e.g. 127.0.0.1")
    return text


def flag_devices(text: str) -> tuple[int, ...]:
    """Comma-separated physical GPU ordinals, each once: '0,2' -> (0, 2)."""
    items = [item.strip() for item in text.split(",")]
    if not text.strip() or "" in items:
        raise ValueError(f"{text!r} has an empty item: expected GPU ordinals separated by commas, e.g. 0,2")
    devices = []
    for item in items:
        number = whole_number(item)
        if number is None or number > 0x7FFFFFFF:
            within = f" in {text!r}" if len(items) > 1 else ""
            raise ValueError(f"{item!r}{within} is not a GPU ordinal: expected numbers from 0 separated by commas, "
                             "e.g. 0,2")
        if number in devices:
            raise ValueError(f"GPU {number} is given twice in {text!r}: name each GPU once")
        devices.append(number)
    return tuple(devices)


_SECONDS = re.compile(r"^(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?$")


def flag_seconds(text: str) -> float:
    """A finite number of seconds above zero (ASCII digits; no nan, inf or sign)."""
    value = float(text) if text.isascii() and _SECONDS.match(text) else math.nan
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{text!r} is not a duration: expected seconds above 0, e.g. 1 or 0.5")
    return value
