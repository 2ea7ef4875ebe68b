"""What `orion-shm` does, without the printing: create, list, inspect and remove Orion regions.

Every failure is a `ShmError` whose message is the one line the user sees (Orion's exact wording where
Orion had one), so the CLI stays a thin shell and the host agent can reuse these functions. Creation is
Orion's `orion-shm` done safely: O_EXCL (no race with a second creator), a half-made file is removed, the
region is formatted at once (so `inspect` shows a valid header before any agent ran), and it is handed
to the user QEMU runs as (server.conf [server-shm]) so a libvirt guest can open it.
"""
from __future__ import annotations

import dataclasses
import grp
import os
import pwd
import stat
from dataclasses import dataclass

from . import layout, liveness
from .channel import Ctrl, HostChannel, HostStatus
from .errors import RegionFormatError, RegionNotFormatted, WireError
from .layout import DEFAULT_CHANNELS, MIB, Geometry
from .orion_conf import ShmSettings
from .region import SHM_DIR, SHM_PREFIX, Region, list_region_files, region_path

INDEX_RANGE = (0, 9999)
SIZE_RANGE_MIB = (16, 1024 * 1024)
AGENT_STATES = {layout.AGENT_NEVER: "never", layout.AGENT_SERVING: "serving", layout.AGENT_STOPPED: "stopped"}

Users = list[tuple[int, str]]


class ShmError(Exception):
    """A failure with the exact line to show the user."""


@dataclass(frozen=True)
class CreatedRegion:
    path: str
    size: int
    owner: str
    group: str
    mode: int
    channels: int = DEFAULT_CHANNELS
    note: str = ""  # something the user should know although creation succeeded


# --- validation (Orion's messages) ------------------------------------------------------------------------
def check_index(index: int) -> None:
    if not INDEX_RANGE[0] <= index <= INDEX_RANGE[1]:
        raise ShmError("Error. Invalid SHM file index. It should be in [0, 9999]")


def check_size(size_mib: int) -> None:
    if not SIZE_RANGE_MIB[0] <= size_mib <= SIZE_RANGE_MIB[1]:
        raise ShmError("Error. Invalid SHM file size. It should be in [16, 1024*1024]")


# --- create ------------------------------------------------------------------------------------------------
def create(index: int, size_mib: int, directory: str = SHM_DIR, channels: int = DEFAULT_CHANNELS,
           settings: ShmSettings = ShmSettings(), mode: int | None = None) -> CreatedRegion:  # noqa: B008
    """Create, size, format and hand over `directory`/orionsock<index>; nothing is left behind on failure."""
    check_index(index)
    check_size(size_mib)
    if not os.path.exists(directory):
        raise ShmError(f"Error. {directory} dose not exist in the system.")  # sic: Orion's wording
    path = region_path(index, directory)
    if os.path.lexists(path):
        raise ShmError(f"{path} has already exists.")  # sic
    if mode is not None and not 0 <= mode <= 0o7777:
        raise ShmError(f"Error. Invalid mode {mode:o}; give an octal mode such as 0660.")
    size = size_mib * MIB
    try:  # pure arithmetic: a bad channel count is refused before any file exists
        geometry = Geometry.build(size, channels, name=f"{SHM_PREFIX}{index}")
    except (ValueError, RegionFormatError) as exc:
        raise ShmError(f"Error. Cannot lay out {path}: {exc}.") from None
    owner = _owner_ids(settings)
    fd = _create_exclusive(path, directory)
    try:
        try:
            os.ftruncate(fd, size)
        except OSError:
            raise ShmError(f"Error. Fail to create {path} with size {size_mib} MiB.") from None
        _format(path, fd, geometry, size_mib)
        note = ""
        if owner is not None:
            try:
                os.fchown(fd, *owner)
            except OSError as exc:
                owner = None
                note = (f"could not give {path} to {settings.user}:{settings.group} ({exc.strerror}); "
                        "it is readable and writable by everyone instead. Run as root so that only QEMU can "
                        "open it")
        final_mode = mode if mode is not None else (0o660 if owner is not None else 0o666)
        os.fchmod(fd, final_mode)
        st = os.fstat(fd)
    except BaseException:
        _unlink_if_ours(path, fd)
        raise
    finally:
        os.close(fd)
    return CreatedRegion(path=path, size=st.st_size, owner=_user_name(st.st_uid), group=_group_name(st.st_gid),
                         mode=stat.S_IMODE(st.st_mode), channels=geometry.channel_count, note=note)


def _owner_ids(settings: ShmSettings) -> tuple[int, int] | None:
    """(uid, gid) of the configured QEMU user and group, or None unless both exist on this host."""
    try:
        return pwd.getpwnam(settings.user).pw_uid, grp.getgrnam(settings.group).gr_gid
    except (KeyError, ValueError):
        return None


def _is_shm_dir(directory: str) -> bool:
    return os.path.realpath(directory) == os.path.realpath(SHM_DIR)


def _create_exclusive(path: str, directory: str) -> int:
    """A new file, mode 0600 until it is formatted (nobody can open a half-made region)."""
    old = os.umask(0)
    try:
        if _is_shm_dir(directory):
            import posix_ipc  # host-only dependency

            try:
                shm = posix_ipc.SharedMemory("/" + os.path.basename(path), posix_ipc.O_CREX, mode=0o600, size=0)
            except posix_ipc.ExistentialError:
                raise ShmError(f"{path} has already exists.") from None
            except (posix_ipc.Error, OSError) as exc:
                raise ShmError(f"Error. Fail to create {path}. {_strerror(exc)}") from None
            return shm.fd  # posix_ipc never closes it behind our back
        try:
            return os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        except FileExistsError:
            raise ShmError(f"{path} has already exists.") from None
        except OSError as exc:
            raise ShmError(f"Error. Fail to create {path}. {exc.strerror}") from None
    finally:
        os.umask(old)


def _strerror(exc: BaseException) -> str:
    return exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)


def _format(path: str, fd: int, geometry: Geometry, size_mib: int) -> None:
    """Write the header. The pages it touches are allocated first: a full tmpfs then gives ENOSPC here
    instead of a SIGBUS while writing through the mapping."""
    try:
        for offset in [0] + [geometry.channel_base(i) for i in range(geometry.channel_count)]:
            os.posix_fallocate(fd, offset, layout.PAGE)
    except OSError as exc:
        raise ShmError(f"Error. Fail to create {path} with size {size_mib} MiB. {exc.strerror}; free memory "
                       "in that file system or choose a smaller size.") from None
    try:
        with Region.open(path) as region:
            region.format(geometry)
    except WireError as exc:
        raise ShmError(f"Error. Fail to format {path}: {exc}") from None


def _unlink_if_ours(path: str, fd: int) -> None:
    """Remove the half-made file, unless someone replaced it meanwhile."""
    try:
        mine, there = os.fstat(fd), os.lstat(path)
        if (mine.st_dev, mine.st_ino) == (there.st_dev, there.st_ino):
            os.unlink(path)
    except OSError:
        pass


# --- who uses a region --------------------------------------------------------------------------------------
def users_of(path: str) -> Users:
    """(pid, command) of every other process that has `path` mapped or open, from /proc."""
    return _scan_users([path])[path]


def _scan_users(paths: list[str]) -> dict[str, Users]:
    """One pass over /proc for several files; matched by device and inode (bind mounts, containers), and by
    name as a fallback for file systems whose maps show another device number. Unreadable pids are skipped."""
    by_id: dict[tuple[int, int], str] = {}
    for path in paths:
        try:
            st = os.stat(path)
            by_id[(st.st_dev, st.st_ino)] = path
        except OSError:
            pass
    found: dict[str, set[int]] = {path: set() for path in paths}
    if not by_id:
        return {path: [] for path in paths}
    by_name = {os.path.abspath(p): p for p in by_id.values()}
    me = os.getpid()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        pid = int(entry.name)
        for hit in _mapped(pid, by_id, by_name) | _opened(pid, by_id):
            found[hit].add(pid)
    return {path: [(pid, command_of(pid)) for pid in sorted(pids)] for path, pids in found.items()}


def _mapped(pid: int, by_id: dict[tuple[int, int], str], by_name: dict[str, str]) -> set[str]:
    hits: set[str] = set()
    try:
        with open(f"/proc/{pid}/maps") as f:
            for line in f:
                fields = line.split(maxsplit=5)
                if len(fields) < 6 or fields[4] == "0":
                    continue
                major, minor = fields[3].split(":")
                key = (os.makedev(int(major, 16), int(minor, 16)), int(fields[4]))
                name = fields[5].rstrip("\n").removesuffix(" (deleted)")
                hit = by_id.get(key) or by_name.get(name)
                if hit:
                    hits.add(hit)
    except (OSError, ValueError):
        pass  # gone, or not ours to read
    return hits


def _opened(pid: int, by_id: dict[tuple[int, int], str]) -> set[str]:
    hits: set[str] = set()
    try:
        fds = list(os.scandir(f"/proc/{pid}/fd"))
    except OSError:
        return hits
    for fd in fds:
        try:
            if not os.readlink(fd.path).startswith("/"):
                continue  # sockets, pipes, anonymous inodes
            st = os.stat(fd.path)
        except OSError:
            continue
        hit = by_id.get((st.st_dev, st.st_ino))
        if hit:
            hits.add(hit)
    return hits


def command_of(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = " ".join(f.read().replace(b"\0", b" ").decode("utf-8", "replace").split())
        if cmd:
            return cmd
        with open(f"/proc/{pid}/comm") as f:
            return f"[{f.read().strip()}]"
    except OSError:
        return "?"


def pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# --- list and inspect ---------------------------------------------------------------------------------------
def list_regions(directory: str = SHM_DIR) -> list[dict]:
    """A summary of every orionsock<N> in `directory`, by index (see `_examine` for the keys)."""
    if not os.path.isdir(directory):
        raise ShmError(f"Error. {directory} does not exist or is not a directory.")
    paths = list_region_files(directory)
    users = _scan_users(paths)
    return [_examine(path, users[path], detail=False) for path in paths]


def inspect(index: int, directory: str = SHM_DIR) -> dict:
    """Everything known about one region: file facts, every header field, agent words, each channel, users."""
    check_index(index)
    path = region_path(index, directory)
    if not os.path.lexists(path):
        raise ShmError(f"Error. {path} does not exist.")
    return _examine(path, users_of(path), detail=True)


def _examine(path: str, users: Users, detail: bool) -> dict:
    """Keys: index, path, type, size, owner, group, mode, status ('formatted', 'not formatted', 'invalid',
    'unreadable'), reason, geometry, agent, channel_count, channels_in_use, channels (detail only), users."""
    st = os.lstat(path)
    kind = "file" if stat.S_ISREG(st.st_mode) else "directory" if stat.S_ISDIR(st.st_mode) else "other"
    info: dict = {
        "index": int(os.path.basename(path)[len(SHM_PREFIX):]), "path": path, "type": kind,
        "size": st.st_size, "owner": _user_name(st.st_uid), "group": _group_name(st.st_gid),
        "mode": stat.S_IMODE(st.st_mode), "status": "invalid", "reason": None, "geometry": None, "agent": None,
        "channel_count": None, "channels_in_use": None, "channels": [], "users": users,
    }
    if kind != "file":
        info["reason"] = (f"{path} is a {kind}, not a region file (Docker makes a directory when a missing "
                          f"file is bind-mounted); remove it with 'orion-shm remove {info['index']}' and create "
                          "the region again")
        return info
    try:
        region = Region.open(path)
    except RegionFormatError as exc:
        info["reason"] = _without_path(str(exc), path)
        return info
    except WireError as exc:
        info["status"], info["reason"] = "unreadable", _without_path(str(exc), path)
        return info
    with region:
        try:
            geometry = region.geometry
        except RegionFormatError as exc:
            if isinstance(exc, RegionNotFormatted):
                info["status"] = "not formatted"
            info["reason"] = _without_path(str(exc), path)
            return info
        info["status"] = "formatted"
        info["geometry"] = dataclasses.asdict(geometry)
        beat, pid, state = region.agent_words()
        info["agent"] = {"state": AGENT_STATES.get(state, f"unknown ({state})"), "state_code": state, "pid": pid,
                         "pid_alive": pid_alive(pid), "heartbeat": beat}
        channels = [HostChannel(region, i) for i in range(geometry.channel_count)]
        busy = [_channel_in_use(ch) for ch in channels]
        info["channel_count"], info["channels_in_use"] = geometry.channel_count, sum(busy)
        if detail:
            info["channels"] = [{"index": ch.index, "in_use": used, **ch.describe()}
                                for ch, used in zip(channels, busy, strict=True)]
    return info


def _channel_in_use(channel: HostChannel) -> bool:
    """A live client holds it: its lock (same kernel), or for a guest an active, served claim."""
    ctrl = channel.ctrl
    if ctrl[Ctrl.LIVENESS] == liveness.HEARTBEAT_MODE:
        return bool(ctrl[Ctrl.CLIENT_ACTIVE]) and ctrl[Ctrl.HOST_STATUS] == HostStatus.SERVING
    try:
        return liveness.is_locked(channel.region.fd, channel.base)
    except OSError:
        return False


def _without_path(message: str, path: str) -> str:
    return message[len(path) + 2:] if message.startswith(path + ": ") else message


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


# --- remove -------------------------------------------------------------------------------------------------
def remove(index: int, directory: str = SHM_DIR, force: bool = False) -> str:
    """Unlink a region nobody uses (or anyway, with `force`); returns its path."""
    check_index(index)
    path = region_path(index, directory)
    if not os.path.lexists(path):
        raise ShmError(f"Error. {path} does not exist.")
    if not force:
        users = users_of(path)
        agent = _serving_agent(path)
        why = []
        if users:
            why.append("in use by " + ", ".join(f"pid {pid} ({_short(cmd)})" for pid, cmd in users))
        if agent and agent not in {pid for pid, _ in users}:
            why.append(f"served by the host agent (pid {agent})")
        if why:
            raise ShmError(f"Error. {path} is {' and '.join(why)}; stop them first, or use --force to remove "
                           "it anyway.")
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            os.rmdir(path)  # the directory Docker leaves behind; Orion told users to delete it by hand
        else:
            os.unlink(path)
    except OSError as exc:
        raise ShmError(f"Error. Cannot remove {path}: {exc.strerror}.") from None
    return path


def _serving_agent(path: str) -> int | None:
    """The pid of a live host agent that the header says is serving the region, if any."""
    try:
        with Region.open(path) as region:
            _ = region.geometry  # refuses an unformatted or invalid header
            _beat, pid, state = region.agent_words()
    except WireError:
        return None
    return pid if state == layout.AGENT_SERVING and pid_alive(pid) else None


def _short(command: str, width: int = 60) -> str:
    return command if len(command) <= width else command[:width - 3] + "..."
