"""host_agent's one error tree (host_agent/errors.py): every exception class a host_agent module defines derives from
HostAgentError, through one of its kinds, or extends the wire's own tree (ivshmem.errors.WireError: a region refused
or shrunk, a relay connection lost), so a caller can catch the agent's own errors apart from a bug's."""
from __future__ import annotations

import importlib
import inspect
import pkgutil

import host_agent
from host_agent.errors import ConfigurationError, HostAgentError, RefusedError, ServiceError, UnavailableError
from ivshmem.errors import WireError

CONTROL_FLOW = {"host_agent.admin.shm_cli._Exit"}  # an exit code carried out of nested calls, not an error


def _defined_exceptions() -> dict[str, type[BaseException]]:
    found = {}
    for info in pkgutil.walk_packages(host_agent.__path__, "host_agent."):
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if inspect.isclass(value) and issubclass(value, BaseException) and value.__module__ == info.name:
                found[f"{info.name}.{name}"] = value
    return found


def test_every_error_host_agent_defines_is_in_its_tree() -> None:
    errors = _defined_exceptions()
    assert len(errors) > 15  # the reader found them: there are that many
    outside = sorted(name for name, cls in errors.items()
                     if not issubclass(cls, (HostAgentError, WireError)) and name not in CONTROL_FLOW)
    assert not outside, f"derive these from host_agent.errors: {outside}"


def test_each_kind_is_the_one_its_callers_tell_apart() -> None:
    from host_agent.admin.orion_smi import AddressError
    from host_agent.daemon.pidfile import PidFileTaken
    from host_agent.kvm.libvirt_gateway import GatewayError
    from host_agent.relay.route import RouteRefused
    from host_agent.session.gpu_inventory import InventoryError
    assert issubclass(AddressError, ConfigurationError) and issubclass(AddressError, ValueError)
    assert issubclass(RouteRefused, RefusedError) and issubclass(InventoryError, UnavailableError)
    assert issubclass(GatewayError, ServiceError) and issubclass(PidFileTaken, OSError)
