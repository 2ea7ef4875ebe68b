"""Choosing a relay connection's transport (host_agent/relay/transport.py, rdma_stream.find_port / check_offer).

The verbs path itself runs on Soft-RoCE in the test guest (tests/guest/test_guest_rdma.py): this machine's kernel
has no RDMA. Here: which device port carries an address, read from an RDMA sysfs tree laid out as the kernel's
(/sys/class/infiniband/<device>/ports/<n>/gids/<i> and gid_attrs/types/<i>), the bounds a peer's offer is held
to, and what this host (no RDMA device) says and does.
"""
from __future__ import annotations

import socket
from pathlib import Path

import pytest

from host_agent.relay.rdma_stream import (
    MAX_INBOX,
    RDMA_OFFER,
    SYSFS,
    RdmaPort,
    RdmaUnavailable,
    check_offer,
    find_port,
    gid_of,
)
from host_agent.relay.transport import RdmaSettings, prepare

V4_LOOPBACK = "0000:0000:0000:0000:0000:ffff:7f00:0001"
V4_OTHER = "0000:0000:0000:0000:0000:ffff:c000:0201"  # 192.0.2.1
EMPTY = "0000:0000:0000:0000:0000:0000:0000:0000"


def _device(root: Path, name: str, gids: list[tuple[str, str]], port: int = 1) -> None:
    """A device as the kernel shows it: gids/<i> and gid_attrs/types/<i> (an empty entry's type cannot be read)."""
    base = root / name / "ports" / str(port)
    (base / "gids").mkdir(parents=True)
    (base / "gid_attrs" / "types").mkdir(parents=True)
    for index, (gid, kind) in enumerate(gids):
        (base / "gids" / str(index)).write_text(gid + "\n")
        if kind:
            (base / "gid_attrs" / "types" / str(index)).write_text(kind + "\n")


def test_gid_of_maps_ipv4_and_keeps_ipv6() -> None:
    assert gid_of("127.0.0.1") == bytes(10) + b"\xff\xff\x7f\x00\x00\x01"
    assert gid_of("fe80::1%eth0") == bytes.fromhex("fe800000000000000000000000000001")


def test_the_port_with_the_connections_address_is_chosen_roce_v2_first(tmp_path: Path) -> None:
    _device(tmp_path, "mlx5_0", [(EMPTY, ""), (V4_OTHER, "IB/RoCE v1"), (V4_OTHER, "RoCE v2")])
    _device(tmp_path, "rxe0", [(V4_LOOPBACK, "IB/RoCE v1"), (V4_LOOPBACK, "RoCE v2")], port=2)
    assert find_port("192.0.2.1", sysfs=tmp_path) == RdmaPort("mlx5_0", 1, 2, gid_of("192.0.2.1"))
    assert find_port("127.0.0.1", sysfs=tmp_path) == RdmaPort("rxe0", 2, 1, gid_of("127.0.0.1"))


def test_a_named_device_is_the_only_one_searched(tmp_path: Path) -> None:
    _device(tmp_path, "mlx5_0", [(V4_OTHER, "RoCE v2")])
    _device(tmp_path, "mlx5_1", [(V4_LOOPBACK, "RoCE v2")])
    assert find_port("127.0.0.1", "mlx5_1", sysfs=tmp_path).device == "mlx5_1"
    with pytest.raises(RdmaUnavailable, match=r"ibverbs_device mlx5_0 has no address 127\.0\.0\.1 .*RDMA device's "
                                              r"network"):
        find_port("127.0.0.1", "mlx5_0", sysfs=tmp_path)
    with pytest.raises(RdmaUnavailable, match=r"ibverbs_device mlx5_9 is not an RDMA device here \(there are: "
                                              r"mlx5_0, mlx5_1\)"):
        find_port("127.0.0.1", "mlx5_9", sysfs=tmp_path)


def test_no_device_and_no_address_are_each_said(tmp_path: Path) -> None:
    with pytest.raises(RdmaUnavailable, match="this host has no RDMA device"):
        find_port("127.0.0.1", sysfs=tmp_path / "missing")
    _device(tmp_path, "rxe0", [(V4_OTHER, "RoCE v2")])
    with pytest.raises(RdmaUnavailable, match=r"any of rxe0 has no address 10\.0\.0\.1"):
        find_port("10.0.0.1", sysfs=tmp_path)


def test_startup_line_says_what_relay_connections_will_use(tmp_path: Path) -> None:
    assert RdmaSettings().startup_line(tmp_path) == "relayed sessions use TCP (enable_rdma is false)"
    assert "this host has no RDMA device: relayed sessions use TCP" in RdmaSettings(True).startup_line(tmp_path)
    _device(tmp_path, "rxe0", [(V4_LOOPBACK, "RoCE v2")])
    assert RdmaSettings(True).startup_line(tmp_path) == \
        "relayed sessions use RDMA where both hosts have it (devices: rxe0)"
    assert RdmaSettings(True, "mlx5_0").startup_line(tmp_path) == \
        "ibverbs_device mlx5_0 is not an RDMA device here (there are: rxe0): relayed sessions use TCP"


def _offer(**changes: object) -> bytes:
    fields = {"gid": gid_of("127.0.0.1"), "qpn": 17, "psn": 5, "mtu": 3, "inbox": 1 << 20, "inbox_rkey": 9,
              "credit": 2 << 20, "credit_rkey": 10, "slots": 32, "piece": 256 << 10, **changes}
    return RDMA_OFFER.encode(*fields.values())


def test_a_peers_offer_is_decoded_and_held_to_bounds() -> None:
    assert check_offer(_offer())["qpn"] == 17
    for bad in ({"gid": b"\0" * 4}, {"slots": 1}, {"slots": 100000}, {"piece": 16}, {"piece": 1 << 30},
                {"mtu": 0}, {"mtu": 9}, {"slots": 256, "piece": 4 << 20}):
        with pytest.raises(RdmaUnavailable, match="out of bounds"):
            check_offer(_offer(**bad))
    assert MAX_INBOX < 256 * (4 << 20)  # the last case is refused for the outbox it would make this end stage
    with pytest.raises(RdmaUnavailable, match="malformed"):
        check_offer(_offer()[:-3])


@pytest.mark.skipif(SYSFS.is_dir(), reason="this machine has an RDMA device (the guest test covers it)")
def test_on_a_host_without_rdma_a_connection_offers_none_and_says_why() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server, socket.create_connection(server.getsockname()) as sock:
        assert prepare(sock, RdmaSettings(False)) == (None, "enable_rdma is false here")
        assert prepare(sock, RdmaSettings(True)) == (None, "this host has no RDMA device")
