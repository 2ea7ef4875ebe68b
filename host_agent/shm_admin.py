"""What `orion-shm` does, without the printing: create, list, inspect and remove Orion regions.

Every failure is a `ShmError` whose message is the one line the user sees (Orion's exact wording where
Orion had one), so the CLI stays a thin shell and the host agent can reuse these functions. Creation is
Orion's `orion-shm` done safely: O_EXCL (no race with a second creator), a half-made file is removed, the
region is formatted at once (so `inspect` shows a valid header before any agent ran), and it is given to
its tenant and no one else.

A region is one tenant's: every client of a region shares its file, so whoever can open it can read and
write every session in it. The tenant is a libvirt guest's QEMU (the user and group of server.conf
[server-shm], mode 0660), or one container's or local user's uid (`--owner`, mode 0600, 0660 with a group);
without either the region stays its creator's (root's), mode 0600. A mode that lets others in is allowed
but always comes with a warning, and `list`/`inspect` say who can reach each region (docs/containers.md).
"""
from __future__ import annotations

import dataclasses
import grp
import os
import pwd
import re
import shlex
import stat
from dataclasses import dataclass

from ivshmem import layout, liveness
from ivshmem.channel import Ctrl, HostChannel, HostStatus
from ivshmem.errors import RegionFormatError, RegionNotFormatted, WireError
from ivshmem.layout import (
    DEFAULT_CHANNELS,
    MIB,
    REGION_SIZE_RANGE_MIB,
    Geometry,
    region_index_allowed,
    region_size_allowed,
)
from ivshmem.region import SHM_DIR, SHM_PREFIX, Region, list_region_files, region_path

from .errors import HostAgentError
from .region_file import TENANT_MARK, sealed_directory
from .server_conf import ShmSettings

AGENT_STATES = {layout.AGENT_NEVER: "never", layout.AGENT_SERVING: "serving", layout.AGENT_STOPPED: "stopped"}
# Who can reach a region besides its tenant (owner, and group when the mode gives it access) and root.
TENANT_ONLY, OTHERS_READ, OTHERS_WRITE = "tenant only", "others can read", "others can write"
_ID = re.compile(r"\d+")
_MAX_ID = 2**32 - 2  # (uid_t)-1 means "no change" to chown

Users = list[tuple[int, str]]


class ShmError(HostAgentError):
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
    warning: str = ""  # set when others than the tenant can reach the region


@dataclass(frozen=True)
class Tenant:
    """The uid and gid a region is given to; `shared_group`: the group was named, so it gets access (0660)."""

    uid: int
    gid: int
    shared_group: bool


# --- validation (Orion's messages) ------------------------------------------------------------------------

def remove_command(index: int, path: str, force: bool = False) -> str:
    """The `orion-shm remove` line that deletes region `index` at `path`: with its directory where that is not the
    default, so that following the hint acts on the region it is about, never on /dev/shm's of the same index."""
    directory = os.path.dirname(os.path.abspath(path))
    where = "" if directory == SHM_DIR else f" -d {shlex.quote(directory)}"
    return f"orion-shm remove {index}{where}" + (" --force" if force else "")

def check_index(index: int) -> None:
    if not region_index_allowed(index):
        raise ShmError("Error. Invalid SHM file index. It should be in [0, 9999]")


def check_size(size_mib: int) -> None:
    """Orion's range, then QEMU's rule: ivshmem-plain maps the whole region as a PCI BAR, whose size must be a
    power of two (QEMU 7.2 aborts on another size, libvirt refuses to start the domain), so such a region
    could never be attached; refuse it now rather than at the first `virsh start`."""
    if region_size_allowed(size_mib):
        return
    if not REGION_SIZE_RANGE_MIB[0] <= size_mib <= REGION_SIZE_RANGE_MIB[1]:
        raise ShmError("Error. Invalid SHM file size. It should be in [16, 1024*1024]")
    if size_mib & (size_mib - 1):
        lower = 1 << (size_mib.bit_length() - 1)
        raise ShmError(f"Error. Invalid SHM file size {size_mib} MiB: it must be a power of two (QEMU maps the "
                       f"region as a PCI BAR); use {lower} or {lower * 2}.")


def parse_owner(spec: str) -> Tenant:
    """`USER[:GROUP]`, names or numeric ids. A numeric uid need not exist here (a container's own user);
    without GROUP the group is the user's primary group, else the uid's number (mode 0600 gives it nothing)."""
    user, sep, group = spec.partition(":")
    if not user or (sep and not group):
        raise ShmError(f"Error. Invalid --owner '{spec}'; give USER or USER:GROUP, names or numeric ids "
                       "(e.g. --owner 1000 or --owner alice:alice).")
    uid = _numeric_id(user, "uid")
    if uid is None:
        try:
            entry = pwd.getpwnam(user)
        except KeyError:
            raise ShmError(f"Error. No user '{user}' on this host (--owner); give an existing user name or a "
                           "numeric uid, such as the container's.") from None
        uid, primary = entry.pw_uid, entry.pw_gid
    else:
        try:
            primary = pwd.getpwuid(uid).pw_gid
        except KeyError:
            primary = uid
    if not group:
        return Tenant(uid, primary, shared_group=False)
    gid = _numeric_id(group, "gid")
    if gid is None:
        try:
            gid = grp.getgrnam(group).gr_gid
        except KeyError:
            raise ShmError(f"Error. No group '{group}' on this host (--owner); give an existing group name or a "
                           "numeric gid.") from None
    return Tenant(uid, gid, shared_group=True)


def _numeric_id(text: str, what: str) -> int | None:
    if not _ID.fullmatch(text):
        return None
    value = int(text)
    if value > _MAX_ID:
        raise ShmError(f"Error. Invalid {what} {text} for --owner; it must be at most {_MAX_ID}.")
    return value


# --- who can reach a region ---------------------------------------------------------------------------------
def access_of(mode: int, path: str) -> str:
    """TENANT_ONLY, OTHERS_READ or OTHERS_WRITE: what the mode gives users who are neither owner nor group,
    unless the file lies in a sealed directory (region_file.sealed_directory), which they cannot enter."""
    if mode & (stat.S_IROTH | stat.S_IWOTH) and sealed_directory(path) is not None:
        return TENANT_ONLY
    if mode & stat.S_IWOTH:
        return OTHERS_WRITE
    if mode & stat.S_IROTH:
        return OTHERS_READ
    return TENANT_ONLY


def access_warning(path: str, mode: int) -> str:
    """One line for a region others than its tenant can reach, or "" when only the tenant can."""
    access = access_of(mode, path)
    if access == TENANT_ONLY:
        return ""
    what = {(True, True): "read and write", (False, True): "write into", (True, False): "read"}[
        (bool(mode & stat.S_IROTH), bool(mode & stat.S_IWOTH))]
    return (f"every local user can {what} the sessions of {path} (mode {mode:04o}, {access}); a region is one "
            f"tenant's: run 'chmod o-rw {path}', or create it with --owner USER[:GROUP]")


# --- create ------------------------------------------------------------------------------------------------
def create(index: int, size_mib: int, directory: str = SHM_DIR, channels: int = DEFAULT_CHANNELS,
           settings: ShmSettings = ShmSettings(), mode: int | None = None,  # noqa: B008
           owner: str | None = None) -> CreatedRegion:
    """Create, size, format and give `directory`/orionsock<index> to its tenant; nothing is left behind on
    failure. The tenant is `owner` (USER[:GROUP], see parse_owner), else QEMU's user and group of `settings`
    when they exist here, else the caller; `mode` overrides the mode that follows from that."""
    check_index(index)
    check_size(size_mib)
    if not os.path.exists(directory):
        raise ShmError(f"Error. {directory} dose not exist in the system.")  # sic: Orion's wording
    path = region_path(index, directory)
    if os.path.lexists(path):
        raise ShmError(f"{path} has already exists.")  # sic
    if mode is not None and not 0 <= mode <= 0o7777:
        raise ShmError(f"Error. Invalid mode {mode:o}; give an octal mode such as 0660.")
    tenant = parse_owner(owner) if owner is not None else None
    size = size_mib * MIB
    try:  # pure arithmetic: a bad channel count is refused before any file exists
        geometry = Geometry.build(size, channels, name=f"{SHM_PREFIX}{index}")
    except (ValueError, RegionFormatError) as exc:
        raise ShmError(f"Error. Cannot lay out {path}: {exc}.") from None
    fd = _create_exclusive(path)
    try:
        try:
            os.ftruncate(fd, size)
        except OSError:
            raise ShmError(f"Error. Fail to create {path} with size {size_mib} MiB.") from None
        _format(path, fd, geometry, size_mib)
        default_mode, note = _hand_over(fd, path, index, tenant, settings)
        final_mode = mode if mode is not None else default_mode
        os.fchmod(fd, final_mode)
        st = os.fstat(fd)
    except BaseException:
        _unlink_if_ours(path, fd)
        raise
    finally:
        os.close(fd)
    warning = ""
    if mode is not None and access_of(final_mode, path) != TENANT_ONLY:
        warning = access_warning(path, final_mode)
    return CreatedRegion(path=path, size=st.st_size, owner=user_name(st.st_uid), group=_group_name(st.st_gid),
                         mode=stat.S_IMODE(st.st_mode), channels=geometry.channel_count, note=note,
                         warning=warning)


def _hand_over(fd: int, path: str, index: int, tenant: Tenant | None, settings: ShmSettings) -> tuple[int, str]:
    """chown the new region to its tenant, marked as made for them by root (region_file.TENANT_MARK, which oriond
    asks of another user's region); returns the mode that follows and a note for the user."""
    if tenant is not None:
        note = ""
        try:
            os.setxattr(fd, TENANT_MARK, str(tenant.uid).encode())
        except OSError as exc:
            note = (f"could not mark {path} as made by root for uid {tenant.uid} ({exc.strerror}): an oriond "
                    "running as another user (root) will not serve it; create it as root")
        try:
            os.fchown(fd, tenant.uid, tenant.gid)
        except OSError as exc:
            raise ShmError(f"Error. Cannot give {path} to {tenant.uid}:{tenant.gid} ({exc.strerror}); run as "
                           "root to give a region to another user.") from None
        return (0o660 if tenant.shared_group else 0o600), note
    me = user_name(os.geteuid())
    advice = (f"to give it to a container or local user, create it with --owner USER[:GROUP] "
              f"('{remove_command(index, path)}' first; oriond serves another user's region only when root made it "
              "for them)")
    qemu = qemu_owner_ids(settings)
    if qemu is None:
        return 0o600, (f"only {me} can open {path} (mode 0600): QEMU's user {settings.user}:{settings.group} "
                       f"of server.conf [server-shm] does not exist here; {advice}")
    try:
        os.fchown(fd, *qemu)
    except OSError as exc:
        return 0o600, (f"could not give {path} to QEMU's user {settings.user}:{settings.group} ({exc.strerror}), "
                       f"so only {me} can open it (mode 0600); run as root so that QEMU can, or {advice}")
    return 0o660, ""


def qemu_owner_ids(settings: ShmSettings) -> tuple[int, int] | None:
    """(uid, gid) of the configured QEMU user and group, or None unless both exist on this host."""
    try:
        return pwd.getpwnam(settings.user).pw_uid, grp.getgrnam(settings.group).gr_gid
    except (KeyError, ValueError):
        return None


def _create_exclusive(path: str) -> int:
    """A new file, mode 0600 until it is formatted and handed over (nobody can open a half-made region).

    In /dev/shm too this is a plain open(O_CREAT | O_EXCL): that is all shm_open does on Linux, and it needs
    no posix_ipc (whose absence once read as a permission problem). O_EXCL also refuses a planted link. The
    umask is left alone (it can only take bits from 0600, and create() sets the final mode with fchmod): it
    is the whole process's, and threads making regions at once (orion-k8s-plugin's Allocate) would leave it 0."""
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        raise ShmError(f"{path} has already exists.") from None
    except OSError as exc:
        raise ShmError(f"Error. Fail to create {path}. {exc.strerror}") from None


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
    found = []
    for path in paths:
        try:
            found.append(_examine(path, users[path], detail=False))
        except FileNotFoundError:  # removed since the listing (anyone may remove their own file in /dev/shm)
            continue
    return found


def inspect(index: int, directory: str = SHM_DIR) -> dict:
    """Everything known about one region: file facts, every header field, agent words, each channel, users."""
    check_index(index)
    path = region_path(index, directory)
    if not os.path.lexists(path):
        raise ShmError(f"Error. {path} does not exist.")
    return _examine(path, users_of(path), detail=True)


def _examine(path: str, users: Users, detail: bool) -> dict:
    """Keys: index, path, type, size, owner, group, mode, access (TENANT_ONLY, OTHERS_READ, OTHERS_WRITE),
    status ('formatted', 'not formatted', 'invalid', 'unreadable'), reason, geometry, agent, channel_count,
    channels_in_use, channels (detail only), users."""
    st = os.lstat(path)
    kind = "file" if stat.S_ISREG(st.st_mode) else "directory" if stat.S_ISDIR(st.st_mode) else "other"
    info: dict = {
        "index": int(os.path.basename(path)[len(SHM_PREFIX):]), "path": path, "type": kind,
        "size": st.st_size, "owner": user_name(st.st_uid), "group": _group_name(st.st_gid),
        "mode": stat.S_IMODE(st.st_mode), "access": access_of(st.st_mode, path), "status": "invalid", "reason": None,
        "geometry": None, "agent": None, "channel_count": None, "channels_in_use": None, "channels": [], "users": users,
    }
    if kind != "file":
        info["reason"] = (f"{path} is a {kind}, not a region file (Docker makes a directory when a missing "
                          f"file is bind-mounted); remove it with '{remove_command(info['index'], path)}' and create "
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


def user_name(uid: int) -> str:
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
        why = in_use(path)
        if why:
            raise ShmError(f"Error. {path} is {why}")
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            os.rmdir(path)  # the directory Docker leaves behind; Orion told users to delete it by hand
        else:
            os.unlink(path)
    except OSError as exc:
        raise ShmError(f"Error. Cannot remove {path}: {exc.strerror}.") from None
    return path


def in_use(path: str) -> str:
    """Why `path` must not be removed now, with how to end that, in words ending a sentence; "" when unused.

    The host agent's own processes (the one the header names, its parents and its session workers) map every
    region they serve; they are reported as the agent, which lets go of a removed region by itself."""
    users = users_of(path)
    agent = serving_agent(path)
    family = _process_family(agent) if agent else set()
    clients = [(pid, cmd) for pid, cmd in users if pid not in family]
    if clients:
        names = ", ".join(f"pid {pid} ({_short(cmd)})" for pid, cmd in clients)
        served = f", and served by the host agent (pid {agent})" if agent else ""
        return (f"in use by {names}{served}; stop them first (a guest's QEMU: shut its domain down, and the qemu "
                "hook removes the region), or use --force to remove it anyway.")
    if agent:
        return (f"served by the host agent (pid {agent}); stop oriond, or run it with --region naming only the "
                "other regions, or use --force: oriond lets go of a removed region within a second, ending its "
                "sessions.")
    return ""


def serving_agent(path: str) -> int | None:
    """The pid of a live host agent that the header says is serving the region, if any."""
    try:
        with Region.open(path) as region:
            _ = region.geometry  # refuses an unformatted or invalid header
            _beat, pid, state = region.agent_words()
    except WireError:
        return None
    return pid if state == layout.AGENT_SERVING and pid_alive(pid) else None


def _process_family(pid: int) -> set[int]:
    """`pid`, its ancestors below init, and every process descended from it (oriond's region supervisors and
    session workers are forks of it, or it is one of them)."""
    family = set()
    ancestor = pid
    while ancestor > 1 and ancestor not in family:
        family.add(ancestor)
        ancestor = _parent_of(ancestor)
    parents = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            parents[int(entry.name)] = _parent_of(int(entry.name))
    descendants = {pid}
    grown = True
    while grown:
        grown = False
        for child, parent in parents.items():
            if parent in descendants and child not in descendants:
                descendants.add(child)
                grown = True
    return family | descendants


def _parent_of(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def _short(command: str, width: int = 60) -> str:
    return command if len(command) <= width else command[:width - 3] + "..."
