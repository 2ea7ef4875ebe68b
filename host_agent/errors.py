"""The host agent's one error tree: every error host_agent raises on purpose derives from HostAgentError, and its
message is one line that says what happened and, where the user can act, what to do. The kinds below are what a
caller may want to tell apart; each module's own class (named where it is raised) derives from one of them.

* ConfigurationError: a value the user gave (a command line, server.conf, an address, a pool answer) is wrong;
* RefusedError: a peer or a request was refused (a relay route, a grant, a handshake, a kubelet call);
* UnavailableError: this host lacks something a feature needs (a compiler, RDMA, a GPU inventory);
* ServiceError: something on this host is in a state that cannot be used (libvirt, a region, a domain, a pid
  file, the Kubernetes region directory).

Foreign errors are mapped once, where they arise (libvirt's in libvirt_gateway.py, the controller client's in
controller_link.py and vgpu_grant.py, OSError where a file is opened), never passed up raw. What does not belong
here: control flow (shm_cli's internal exit) and ReplyFailed's subclasses of the wire (handler.py).
"""
from __future__ import annotations


class HostAgentError(Exception):
    """Every error host_agent raises on purpose; str() is the line for the user or the log."""


class ConfigurationError(HostAgentError):
    """A value the user gave is wrong."""


class RefusedError(HostAgentError):
    """A peer or a request was refused."""


class UnavailableError(HostAgentError):
    """This host lacks what a feature needs."""


class ServiceError(HostAgentError):
    """Something on this host is in a state that cannot be used."""
