"""HELLO names the forwarded-call table a client speaks: a guest and an agent built from different tables
refuse each other in one line (the guest's cuInit answers CUDA_ERROR_NO_DEVICE), never mis-decode each other's
records. Against the fake-driver agent of tests/forwarding_rig.py."""
from __future__ import annotations

import pytest

from guest_runtime import activate
from guest_runtime.forward import Forwarder
from ivshmem.channel import ClientChannel
from ivshmem.cuda_status import NO_DEVICE, SUCCESS
from ivshmem.driver_api import table_digest
from ivshmem.errors import ChannelError
from ivshmem.region import Region
from tests.forwarding_rig import Rig, bounded, rig, start  # noqa: F401 (fixtures)

OTHER_TABLE = "0123456789abcdef"


def test_the_agent_accepts_its_own_table_and_the_wire_alone(rig: Rig) -> None:  # noqa: F811
    channel = ClientChannel.claim(Region.open(rig.path))
    try:
        assert channel.hello(table_digest())[0] == "orion-vgpu host agent"
        channel.hello("")  # orion-guest probe: the wire alone
        with pytest.raises(ChannelError, match=f"call table '{OTHER_TABLE}'; this agent serves table "
                                               f"{table_digest()}: install the orion-guest of the same release"):
            channel.hello(OTHER_TABLE)
    finally:
        channel.close()


def test_a_guest_of_another_table_gets_no_device_and_one_line(rig: Rig, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
                                                              capfd: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("ORION_SHM", rig.path)
    monkeypatch.delenv("ORION_VGPU", raising=False)
    monkeypatch.setattr(activate, "table_digest", lambda: OTHER_TABLE)
    refused = Forwarder(activate._connect).implementations()
    assert refused["cuInit"](0) == NO_DEVICE
    err = capfd.readouterr().err
    assert err.count("\n") == 1 and "call table" in err and "install the orion-guest" in err, err
    monkeypatch.undo()
    monkeypatch.setenv("ORION_SHM", rig.path)
    accepted = Forwarder(activate._connect)  # the same agent, the same table: served (the refused one let go)
    assert accepted.implementations()["cuInit"](0) == SUCCESS
    accepted.close()
