"""A region of its own for every container kubelet admits with vGPUs, in a directory only root may enter.

Why this shape (docs/kubernetes.md, docs/security.md): a region belongs to one tenant (docs/containers.md),
and a container is one; but kubelet's Allocate names only device ids, never the pod or the uid its processes
will run as, so the region cannot be given to that uid the way `orion-shm create --owner` does. Instead:

* the regions live in a *sealed* directory (owned by the plugin's user, root; no search permission for group
  or others), which no other local user can enter, so no host user can open a region there by any path;
* each region is mode 0666, so whatever uid the container runs as can open the one file kubelet bind-mounts
  into it; the container sees no other region (only that file is mounted);
* a container's region is named after its first device (``orionsock<gpu*100+slot>``): kubelet gives a
  device to one container at a time, so two live containers never share a region, and the count of regions
  is bounded by the node's vGPUs. When kubelet gives the device to a new container, the region is made anew:
  the old container has ended, and the new one must not see anything of its sessions.

oriond (shm_path_base set to the same directory) serves the regions; host_agent/region_file.py accepts a
0666 file only because its directory is sealed.
"""
from __future__ import annotations

import logging
import os
import stat

from ivshmem.region import region_path

from .. import pidfile, shm_admin

log = logging.getLogger(__name__)
DIRECTORY_MODE = 0o700
REGION_MODE = 0o666  # see the module doc: reachable only through the container's bind mount


class RegionDirError(Exception):
    """The region directory cannot be used; the message says what to do."""


class ContainerRegions:
    def __init__(self, directory: str, size_mib: int, pid_file: str = "") -> None:
        """`pid_file`: oriond's, to wake it (SIGHUP) when a region is made; it also finds it within a second."""
        self.directory = directory.rstrip("/") or "/"
        self.size_mib = size_mib
        self.pid_file = pid_file or pidfile.default_path()

    def prepare(self) -> None:
        """Make the directory if it is missing; refuse one that others could enter or that is not ours (in a
        /dev/shm that every user may write to, someone could have made it first to reach our regions)."""
        try:
            os.mkdir(self.directory, DIRECTORY_MODE)
            log.info("created %s (mode %04o) for the containers' regions", self.directory, DIRECTORY_MODE)
        except FileExistsError:
            pass
        except OSError as exc:
            raise RegionDirError(f"cannot create {self.directory} ({exc.strerror}); give -region-dir (or "
                                 "shm_path_base) a directory this user can create, in a file system that "
                                 "exists (e.g. /dev/shm/orion-k8s/)") from None
        st = os.lstat(self.directory)
        where = f"{self.directory} (the containers' region directory)"
        if not stat.S_ISDIR(st.st_mode):
            raise RegionDirError(f"{where} is not a directory; remove it, or choose another -region-dir")
        if st.st_uid != os.geteuid():
            raise RegionDirError(f"{where} belongs to uid {st.st_uid}, not to this plugin's user ({os.geteuid()}): "
                                 "its owner could reach every container's region. Remove it and start the "
                                 "plugin again, which creates it")
        if stat.S_IMODE(st.st_mode) & 0o077:
            raise RegionDirError(f"{where} has mode {stat.S_IMODE(st.st_mode):04o}: other users could enter it "
                                 f"and open the containers' regions. Run 'chmod 0700 {self.directory}'")

    def give(self, index: int) -> str:
        """A fresh, formatted region orionsock<index> for one container; its path. ShmError says why not."""
        path = region_path(index, self.directory)
        try:
            os.unlink(path)  # the region of the container that had this device before: it has ended
            log.info("%s: made anew for the next container of its device", path)
        except FileNotFoundError:
            pass
        except OSError as exc:  # a directory in its place, or the file system gone: say so, make nothing
            raise shm_admin.ShmError(f"cannot remove the old {path} ({exc.strerror}); remove it by hand") from None
        created = shm_admin.create(index, self.size_mib, self.directory, mode=REGION_MODE,
                                   owner=str(os.geteuid()))
        pidfile.notify(self.pid_file)
        return created.path
