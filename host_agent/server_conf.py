"""server.conf's settings that more than one program reads: the [server-shm] section (`ShmSettings`): where
regions live, who QEMU runs as, their size; and [cluster] key_file (`cluster_key_file`): the cluster key that makes
this host a member of the cluster (docs/security.md, "Who may talk to whom: the cluster key").

orion-shm, the qemu hook and oriond (through host_agent/daemon/config.py, which reads the rest of server.conf) all
take these settings from here, so each refuses a wrong value with the same line. The file is read by the one
INI reader, ivshmem/shared/ini.py (`load_ini`, `ConfigError`; imported from here by the host's modules). Whether
the key file itself is usable is controller/cluster_key.load_key's to say, when it is read.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from controller.cluster_key import DEFAULT_KEY_FILE
from ivshmem.layout import REGION_SIZE_RANGE_MIB
from ivshmem.shared.ini import SERVER_CONF, ConfigError, load_ini, whole_number


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


def cluster_key_file(section: Mapping[str, str], path: str) -> Path:
    """[cluster] key_file of server.conf `path` (its parsed `section`): an absolute path; DEFAULT_KEY_FILE when
    the key is absent. ConfigError naming the file and key otherwise."""
    value = section.get("key_file")
    if value is None:
        return DEFAULT_KEY_FILE
    if not value.startswith("/") or "\0" in value:
        raise ConfigError(f"{path}: [cluster] key_file = {value!r} is not a valid value; write the absolute path "
                          f"of the cluster key, e.g. {DEFAULT_KEY_FILE} (make one with `orion-controller "
                          "cluster-key PATH`)")
    return Path(value)
