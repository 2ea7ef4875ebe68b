"""ControllerConfig: the one frozen settings object of ``orion-controller``, built once from its command line.

Orion's controller took ``-i``/``-p``/``--kv``/``--log`` (June 2019) and later a YAML file; ours takes
``--listen HOST:PORT``, ``--etcd URL`` and ``--log FILE`` (the issue's spelling) plus the lease and key knobs
below. Defaults: listen 0.0.0.0:9123, etcd http://127.0.0.1:2379, log to stdout, the cluster key
/etc/orion/cluster.key (``--key-file``: what proves a request to a member-only endpoint, docs/security.md; the
file itself is read at start, service.py) and the registration limits of docs/controller.md, Limits. Parsing and
validation live here; nothing deeper reads arguments or the environment.
"""
from __future__ import annotations

from dataclasses import dataclass

from controller.cluster_key import DEFAULT_KEY_FILE
from controller.keys import DEFAULT_ROOT
from controller.payloads import DEFAULT_MAX_GPUS_PER_HOST, MAX_GPU_INDEX, MAX_VGPU_COUNT, Limits
from controller.pool import DEFAULT_HOST_TTL_S, DEFAULT_LEASE_TTL_S, ETCD_DEFAULT_MAX_TXN_OPS, MIN_TXN_OPS
from controller.store import parse_endpoints

DEFAULT_LISTEN = "0.0.0.0:9123"
DEFAULT_ETCD = "http://127.0.0.1:2379"
MAX_TXN_OPS = 100_000
DEFAULT_MAX_BODY_KIB = 1024
MAX_BODY_KIB = (4, 64 << 10)  # a body of 4 KiB holds any request but a registration; 64 MiB is far past any


class ConfigError(ValueError):
    """A setting that cannot be used; the message says which and what to write instead."""


def parse_listen(value: str) -> tuple[str, int]:
    """``HOST:PORT`` (or ``:PORT``, or ``[v6]:PORT``) → (host, port)."""
    host, sep, port_s = value.rpartition(":")
    if not sep or not port_s.isascii() or not port_s.isdigit() or not 0 < int(port_s) < 65536:
        raise ConfigError(f"--listen {value!r}: expected HOST:PORT with a port from 1 to 65535, "
                          f"e.g. 0.0.0.0:9123")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port_s)


@dataclass(frozen=True)
class ControllerConfig:
    listen_host: str = "0.0.0.0"
    listen_port: int = 9123
    etcd_url: str = DEFAULT_ETCD
    etcd_timeout_s: float = 3.0
    log_file: str | None = None
    log_level: str = "info"
    lease_ttl_s: int = DEFAULT_LEASE_TTL_S
    host_ttl_s: int = DEFAULT_HOST_TTL_S
    key_root: str = DEFAULT_ROOT
    workers: int = 16
    etcd_max_txn_ops: int = ETCD_DEFAULT_MAX_TXN_OPS  # etcd's --max-txn-ops: bounds vGPUs per allocation
    key_file: str = str(DEFAULT_KEY_FILE)  # the cluster key: members sign their requests with it
    max_gpus_per_host: int = DEFAULT_MAX_GPUS_PER_HOST
    max_vgpus_per_gpu: int = MAX_VGPU_COUNT
    max_body_kib: int = DEFAULT_MAX_BODY_KIB

    @property
    def listen(self) -> str:
        return f"{self.listen_host}:{self.listen_port}"

    @property
    def limits(self) -> Limits:
        return Limits(self.max_gpus_per_host, self.max_vgpus_per_gpu)

    @classmethod
    def build(cls, listen: str = DEFAULT_LISTEN, etcd: str = DEFAULT_ETCD, log_file: str | None = None,
              log_level: str = "info", lease_ttl_s: int = DEFAULT_LEASE_TTL_S,
              host_ttl_s: int = DEFAULT_HOST_TTL_S, key_root: str = DEFAULT_ROOT, etcd_timeout_s: float = 3.0,
              workers: int = 16, etcd_max_txn_ops: int = ETCD_DEFAULT_MAX_TXN_OPS, *,
              key_file: str = str(DEFAULT_KEY_FILE), max_gpus_per_host: int = DEFAULT_MAX_GPUS_PER_HOST,
              max_vgpus_per_gpu: int = MAX_VGPU_COUNT, max_body_kib: int = DEFAULT_MAX_BODY_KIB) -> ControllerConfig:
        host, port = parse_listen(listen)
        try:
            parse_endpoints(etcd)
        except ValueError as exc:
            raise ConfigError(f"--etcd: {exc}") from None
        if log_level not in ("debug", "info", "warn", "error"):
            raise ConfigError(f"--log-level {log_level!r}: use debug, info, warn or error")
        for flag, ttl in (("--lease-ttl", lease_ttl_s), ("--host-ttl", host_ttl_s)):
            if not 1 <= ttl <= 3600:
                raise ConfigError(f"{flag} {ttl}: a lease TTL is 1 to 3600 seconds")
        if not key_root.startswith("/") or not key_root.endswith("/"):
            raise ConfigError(f"--key-root {key_root!r}: it must start and end with '/', e.g. /orion/")
        if not 0 < etcd_timeout_s <= 60:
            raise ConfigError(f"--etcd-timeout {etcd_timeout_s}: use 0 < seconds <= 60")
        if not 1 <= workers <= 256:
            raise ConfigError(f"--workers {workers}: use 1 to 256")
        if not MIN_TXN_OPS <= etcd_max_txn_ops <= MAX_TXN_OPS:
            raise ConfigError(f"--etcd-max-txn-ops {etcd_max_txn_ops}: use {MIN_TXN_OPS} to {MAX_TXN_OPS}, the "
                              f"value of etcd's --max-txn-ops (default {ETCD_DEFAULT_MAX_TXN_OPS})")
        if not key_file.strip():
            raise ConfigError(f"--key-file {key_file!r}: give the path of the cluster key, e.g. {DEFAULT_KEY_FILE}")
        for flag, value, most in (("--max-gpus-per-host", max_gpus_per_host, MAX_GPU_INDEX + 1),
                                  ("--max-vgpus-per-gpu", max_vgpus_per_gpu, MAX_VGPU_COUNT)):
            if not 1 <= value <= most:
                raise ConfigError(f"{flag} {value}: use 1 to {most}")
        if not MAX_BODY_KIB[0] <= max_body_kib <= MAX_BODY_KIB[1]:
            raise ConfigError(f"--max-body-kib {max_body_kib}: use {MAX_BODY_KIB[0]} to {MAX_BODY_KIB[1]} "
                              f"(default {DEFAULT_MAX_BODY_KIB})")
        return cls(host, port, etcd, etcd_timeout_s, log_file, log_level, lease_ttl_s, host_ttl_s, key_root,
                   workers, etcd_max_txn_ops, key_file, max_gpus_per_host, max_vgpus_per_gpu, max_body_kib)
