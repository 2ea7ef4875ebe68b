"""orion-k8s-plugin's device list: read from the controller's pool answer, and the board kubelet's stream follows."""
from __future__ import annotations

import threading

import pytest

from host_agent.k8s.devices import DeviceBoard, MalformedPool, VirtualGpu, node_vgpus

POOL = {"hosts": [
    {"host": "10.0.0.2", "gpus": [{"index": 1, "vgpu_count": 1}, {"index": 0, "vgpu_count": 2}]},
    {"host": "10.0.0.3", "gpus": [{"index": 0, "vgpu_count": 4}]},
]}


def test_the_nodes_vgpus_are_its_gpus_slots_and_nothing_of_other_hosts() -> None:
    vgpus = node_vgpus(POOL, "10.0.0.2")
    assert vgpus is not None
    assert [v.id for v in vgpus] == ["vgpu-0-0", "vgpu-0-1", "vgpu-1-0"]
    assert node_vgpus(POOL, "10.0.0.9") is None  # not in the pool: oriond is not heartbeating
    assert node_vgpus({"hosts": []}, "10.0.0.2") is None


@pytest.mark.parametrize("pool", [{}, {"hosts": None}, {"hosts": [{"host": "10.0.0.2"}]},
                                  {"hosts": [{"host": "10.0.0.2", "gpus": [{"index": "x", "vgpu_count": 1}]}]}])
def test_a_malformed_pool_answer_is_one_error(pool: dict) -> None:
    with pytest.raises(MalformedPool, match="malformed"):
        node_vgpus(pool, "10.0.0.2")


def test_region_indices_never_collide_between_devices() -> None:
    indices = {VirtualGpu(gpu, slot).region_index for gpu in range(64) for slot in range(100)}
    assert len(indices) == 64 * 100


def test_the_board_keeps_the_last_devices_when_they_go_unhealthy() -> None:
    board = DeviceBoard()
    devices = [VirtualGpu(0, 0), VirtualGpu(0, 1)]
    assert board.show(None, "not asked yet") and board.snapshot().devices == ()
    assert board.show(devices)
    healthy = board.snapshot()
    assert (healthy.devices, healthy.healthy, healthy.why) == (tuple(devices), True, "")
    assert not board.show(list(devices))  # the same news is no change: kubelet gets no new list
    assert board.show(None, "oriond stopped")
    down = board.snapshot()
    assert (down.devices, down.healthy, down.why) == (tuple(devices), False, "oriond stopped")
    assert not board.show(None, "oriond stopped")
    assert board.show(None, "the controller is down") and board.snapshot().why == "the controller is down"
    assert board.show(devices[:1]) and board.snapshot().devices == (devices[0],)
    assert board.snapshot().generation == down.generation + 2


def test_a_waiter_wakes_on_a_change_and_not_before() -> None:
    board = DeviceBoard()
    start = board.snapshot().generation
    assert board.wait_newer(start, 0.2).generation == start  # nothing changed: back after the timeout
    threading.Timer(0.1, board.show, args=([VirtualGpu(0, 0)],)).start()
    woke = board.wait_newer(start, 10)
    assert woke.generation == start + 1 and woke.healthy
