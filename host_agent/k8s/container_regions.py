"""A region of its own for every container kubelet admits with vGPUs, in a directory only root may enter.

Why this shape (docs/kubernetes.md, docs/security.md): a region belongs to one tenant (docs/containers.md),
and a container is one; but kubelet's Allocate names only device ids, never the pod or the uid its processes
will run as, so the region cannot be given to that uid the way `orion-shm create --owner` does. Instead:

* the regions live in a *sealed* directory (owned by the plugin's user, root; no search permission for group
  or others), which no other local user can enter, so no host user can open a region there by any path;
  and no other user can change where its path leads either (open_sealed_directory: a directory under one
  another user could rename would let that user swap in a directory of their own);
* each region is mode 0666, so whatever uid the container runs as can open the one file kubelet bind-mounts
  into it; the container sees no other region (only that file is mounted);
* a container's region is named after its first device (``orionsock<gpu*100+slot>``): kubelet gives a
  device to one container at a time, so two live containers never share a region, and the count of regions
  is bounded by the node's vGPUs. When kubelet gives the device to a new container, the region is made anew:
  the old container has ended, and the new one must not see anything of its sessions.

oriond (shm_path_base set to the same directory) serves the regions; host_agent/region_file.py accepts a
0666 file only because its directory is sealed. What does not belong here: the region's layout and creation
(shm_admin.create), kubelet's wire (service.py).
"""
from __future__ import annotations

import contextlib
import errno
import logging
import os
import secrets
import shutil
import stat

from ivshmem.region import region_path

from .. import shm_admin
from ..daemon import pidfile
from ..errors import ServiceError

log = logging.getLogger(__name__)
DIRECTORY_MODE = 0o700
REGION_MODE = 0o666  # see the module doc: reachable only through the container's bind mount
STAGING_PREFIX = ".orion-new-"  # a region being made, in a directory of its own; no region's name
_DIR_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class RegionDirError(ServiceError):
    """The region directory cannot be used; the message says what to do."""


def open_sealed_directory(directory: str) -> int:
    """`directory` opened (O_PATH), made 0700 if missing, once no user but root and this one can change what its
    path leads to; RegionDirError, in one line that says what to fix, otherwise.

    Whoever can rename or remove an entry of a directory on the way (from /) can put a directory of their own
    in the entry's place, and then reads and writes the next container's region. That is:
    * the owner of any directory on the way (it may chmod it, then do anything in it): each must be root's or
      this user's;
    * anyone its mode lets write into it (group or other w; an ACL that grants write shows in the group bits),
      unless the sticky bit is set: then only an entry's owner (besides the directory's owner and root) may
      rename or remove the entry. So a sticky directory that everyone may write (/dev/shm, /tmp) is fine to
      pass through when the next directory on the way is root's or ours, which the rule above asks of it;
    * whoever may change a symbolic link on the way: none is accepted (each step is opened with O_NOFOLLOW), the
      path must be the directory's real one.
    The region directory itself must be this user's and closed to group and others (sealed). Each step is opened
    relative to the one checked before it, so what was checked is what is opened: nothing can be swapped in
    between the two.
    """
    where = f"{directory} (the containers' region directory)"
    if not os.path.isabs(directory) or any(part in (".", "..") for part in directory.split("/")):
        raise RegionDirError(f"{where}: give the directory's absolute path, without '.' or '..'")
    parts = [part for part in directory.split("/") if part]
    here, fd = "/", os.open("/", _DIR_FLAGS)
    try:
        for step, name in enumerate(parts):
            _check_parent(where, here, os.fstat(fd), os.path.join(here, name))
            if step == len(parts) - 1:
                _make(where, directory, name, fd)
            child = _open_step(where, directory, os.path.join(here, name), name, fd)
            os.close(fd)
            here, fd = os.path.join(here, name), child
        st = os.fstat(fd)
        if st.st_uid != os.geteuid():
            raise RegionDirError(f"{where} belongs to uid {st.st_uid}, not to this plugin's user ({os.geteuid()}): "
                                 "its owner could reach every container's region. Remove it and start the "
                                 "plugin again, which creates it")
        if stat.S_IMODE(st.st_mode) & 0o077:
            raise RegionDirError(f"{where} has mode {stat.S_IMODE(st.st_mode):04o}: other users could enter it "
                                 f"and open the containers' regions. Run 'chmod 0700 {directory}'")
        return fd
    except BaseException:
        os.close(fd)
        raise


def _check_parent(where: str, here: str, st: os.stat_result, child: str) -> None:
    """Refuse `here` (a directory on the way) if another user could replace its entry `child` (see above)."""
    what = f"could replace {child} with a directory of their own and so read and write every container's region"
    if st.st_uid not in (0, os.geteuid()):
        raise RegionDirError(f"{where}: {here} belongs to uid {st.st_uid}, neither root nor this plugin's user, and "
                             f"that user {what}. Use a region directory whose every parent is root's (e.g. "
                             f"/dev/shm/orion-k8s/), or 'chown root {here}'")
    mode = st.st_mode
    if mode & (stat.S_IWGRP | stat.S_IWOTH) and not mode & stat.S_ISVTX:
        raise RegionDirError(f"{where}: {here} has mode {stat.S_IMODE(mode):04o}: other users may write into it, "
                             f"and with no sticky bit any of them {what}. Run 'chmod go-w {here}', or use another "
                             "region directory")


def _make(where: str, directory: str, name: str, parent: int) -> None:
    try:
        os.mkdir(name, DIRECTORY_MODE, dir_fd=parent)
        log.info("created %s (mode %04o) for the containers' regions", directory, DIRECTORY_MODE)
    except FileExistsError:
        pass
    except OSError as exc:
        raise RegionDirError(f"cannot create {where} ({exc.strerror}); give -region-dir (or shm_path_base) a "
                             "directory this user can create, in a file system that exists (e.g. "
                             "/dev/shm/orion-k8s/)") from None


def _open_step(where: str, directory: str, path: str, name: str, parent: int) -> int:
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent)
    except OSError as exc:
        with contextlib.suppress(OSError):
            if stat.S_ISLNK(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode):
                raise RegionDirError(f"{where}: {path} is a symbolic link, which whoever may change it could point "
                                     f"elsewhere; give the real path ({os.path.realpath(directory)})") from None
        if exc.errno == errno.ENOTDIR:
            raise RegionDirError(f"{where}: {path} is not a directory; remove it, or choose another "
                                 "-region-dir") from None
        raise RegionDirError(f"{where}: cannot open {path} ({exc.strerror})") from None


class ContainerRegions:
    def __init__(self, directory: str, size_mib: int, pid_file: str = "") -> None:
        """`pid_file`: oriond's, to wake it (SIGHUP) when a region is made; it also finds it within a second."""
        self.directory = directory.rstrip("/") or "/"
        self.size_mib = size_mib
        self.pid_file = pid_file or pidfile.default_path()
        self._fd = -1  # the directory prepare() checked, open for the plugin's life
        self._identity = (0, 0)

    def prepare(self) -> None:
        """Open the directory, making it if missing, and refuse it unless it is sealed and no other user can
        swap it (open_sealed_directory); then remove what an earlier run left of regions being made."""
        fd = open_sealed_directory(self.directory)
        st = os.fstat(fd)
        self._fd, self._identity = fd, (st.st_dev, st.st_ino)
        for name in os.listdir(self._through()):
            if name.startswith(STAGING_PREFIX):
                shutil.rmtree(os.path.join(self._through(), name), ignore_errors=True)

    def _through(self) -> str:
        """A path that leads to the very directory prepare() checked, whatever is done to its name since."""
        return f"/proc/self/fd/{self._fd}"

    def give(self, index: int) -> str:
        """A fresh, formatted region orionsock<index> for one container; its path. ShmError says why not.

        The region is made whole in a staging directory of this call's own, then renamed over the old one: the
        name always holds a whole region (the old, then the new), so calls for the same device at once all
        succeed and oriond never meets a half-made file. All of it is done through the directory's descriptor,
        so a directory swapped in under the name since prepare() is never written to; and as kubelet mounts the
        region by path, the path must still lead to that directory, before and after, or nothing is given out.
        """
        if self._fd < 0:
            raise shm_admin.ShmError(f"{self.directory} was not prepared (ContainerRegions.prepare)")
        self._still_there()
        name = os.path.basename(region_path(index))
        staging = STAGING_PREFIX + secrets.token_hex(8)
        made = os.path.join(self._through(), staging)
        try:
            os.mkdir(staging, DIRECTORY_MODE, dir_fd=self._fd)
            shm_admin.create(index, self.size_mib, made, mode=REGION_MODE, owner=str(os.geteuid()))
            os.rename(os.path.join(staging, name), name, src_dir_fd=self._fd, dst_dir_fd=self._fd)
        except shm_admin.ShmError as exc:
            raise shm_admin.ShmError(str(exc).replace(made, self.directory)) from None
        except OSError as exc:  # a directory in the region's place, the file system full or gone: say so
            raise shm_admin.ShmError(f"cannot make {os.path.join(self.directory, name)} ({exc.strerror})") from None
        finally:
            with contextlib.suppress(OSError):
                shutil.rmtree(made)
        self._still_there()
        pidfile.notify(self.pid_file)
        return os.path.join(self.directory, name)

    def _still_there(self) -> None:
        try:
            st = os.stat(self.directory)
            here = (st.st_dev, st.st_ino)
        except OSError:
            here = (-1, -1)
        if here != self._identity:
            raise shm_admin.ShmError(f"{self.directory} no longer names the directory the plugin checked at its start "
                                     "(it was removed or replaced): no region is given out through it. Put it back, "
                                     "or restart the plugin")
