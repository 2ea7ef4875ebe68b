"""A real oriond registers this host's GPUs with a real controller (on a real etcd) and keeps them alive.

The inventory is made up (ORION_TEST_GPU_INVENTORY; no GPU in CI). What is checked is behaviour a deployment
relies on: the pool shows exactly the GPUs oriond reported, with server.conf's vgpu_count and port; its
heartbeats outlive several host-lease TTLs without a re-registration; a SIGKILLed oriond leaves the pool once
its lease runs out, a cleanly stopped one at once; an unreachable controller costs one warning line and
oriond registers when it comes up; without a configured controller oriond does not talk to one.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ivshmem.shared.controller_client import ControllerClient
from tests.controller.oriond_proc import Oriond
from tests.controller.rig import ControllerProcess, free_port, wait_until

GPUS = [{"uuid": "GPU-0a0a0a0a-1111-2222-3333-444444444444", "name": "Tesla P100-PCIE-16GB", "memory_mib": 16280},
        {"uuid": "GPU-0b0b0b0b-1111-2222-3333-444444444444", "name": "Tesla V100-SXM2-32GB", "memory_mib": 32510}]
HOST_TTL_S = 2


def hosts(ctl: ControllerProcess) -> dict[str, dict[str, Any]]:
    with ControllerClient(ctl.address, timeout_s=10) as client:
        return {h["host"]: h for h in client.pool()["hosts"]}


@pytest.fixture
def oriond(tmp_path: Path) -> Iterator[Callable[..., Oriond]]:
    started: list[Oriond] = []

    def start(bind_addr: str, controller: str | None, gpus: list[dict[str, object]] | None = None,
              **kw: Any) -> Oriond:
        proc = Oriond(tmp_path / f"oriond-{len(started)}", bind_addr, controller, gpus, **kw)
        started.append(proc)
        return proc.start()

    yield start
    for proc in started:
        code = proc.stop()
        assert code in (None, 0, -9), f"oriond exited with {code}:\n{proc.log()[-4000:]}"


def test_oriond_registers_its_gpus_heartbeats_and_a_killed_one_leaves_after_the_lease(
        controllers: Callable[..., ControllerProcess], oriond: Callable[..., Oriond]) -> None:
    ctl = controllers(extra=["--host-ttl", str(HOST_TTL_S)])
    agent = oriond("127.0.0.21", ctl.address, GPUS, vgpu_count=2, listen_port=9970)
    wait_until("oriond did not register", lambda: "127.0.0.21" in hosts(ctl), log=agent.log)
    host = hosts(ctl)["127.0.0.21"]
    assert (host["address"], host["port"], host["vgpus_total"]) == ("127.0.0.21", 9970, 4)
    assert [(g["index"], g["uuid"], g["name"], g["memory_mib"], g["vgpu_count"]) for g in host["gpus"]] == [
        (i, g["uuid"], g["name"], g["memory_mib"], 2) for i, g in enumerate(GPUS)]
    wait_until("no report line", lambda: "is reported to Orion Controller" in agent.log(), log=agent.log)
    assert f"{GPUS[1]['name']} (ID: {GPUS[1]['uuid']}) is reported to Orion Controller." in agent.log()

    time.sleep(3 * HOST_TTL_S)  # three lease lifetimes: only heartbeats can have kept the host
    assert "127.0.0.21" in hosts(ctl), agent.log()
    assert agent.log().count("Successfully connect to Orion Controller.") == 1, "the lease lapsed: re-registered"

    agent.kill()
    wait_until("a killed oriond's host stayed in the pool", lambda: "127.0.0.21" not in hosts(ctl), log=ctl.log)
    assert "Unregister" not in agent.log()


def test_a_killed_oriond_process_takes_its_controller_link_along(
        controllers: Callable[..., ControllerProcess], oriond: Callable[..., Oriond]) -> None:
    """The link runs in a child of oriond (so that oriond has no thread when it forks region supervisors); it
    must not outlive oriond and keep heartbeating for a host that serves nothing: it unregisters at once."""
    ctl = controllers(extra=["--host-ttl", "600"])
    agent = oriond("127.0.0.24", ctl.address, GPUS)
    wait_until("oriond did not register", lambda: "127.0.0.24" in hosts(ctl), log=agent.log)
    agent.kill(whole_host=False)
    # The link logs the line once the controller has answered, so the log may trail the pool by a moment.
    wait_until("the link outlived oriond", lambda: "127.0.0.24" not in hosts(ctl)
               and "Unregister Orion Server from Orion Controller" in agent.log(), log=agent.log)


def test_a_cleanly_stopped_oriond_unregisters_at_once(controllers: Callable[..., ControllerProcess],
                                                      oriond: Callable[..., Oriond]) -> None:
    ctl = controllers(extra=["--host-ttl", "600"])  # only the unregister can remove it during this test
    agent = oriond("127.0.0.22", ctl.address, GPUS[:1])
    wait_until("oriond did not register", lambda: "127.0.0.22" in hosts(ctl), log=agent.log)
    assert agent.stop() == 0, agent.log()
    assert "127.0.0.22" not in hosts(ctl)
    assert "Unregister Orion Server from Orion Controller" in agent.log()


def test_an_unreachable_controller_costs_one_warning_and_oriond_registers_when_it_starts(
        controllers: Callable[..., ControllerProcess], oriond: Callable[..., Oriond]) -> None:
    port = free_port()
    agent = oriond("127.0.0.23", f"127.0.0.1:{port}", GPUS[:1])
    wait_until("no warning about the controller", lambda: "cannot reach the Orion Controller" in agent.log(),
               log=agent.log)
    ctl = controllers(port=port, extra=["--host-ttl", "600"])
    back = f"Orion Controller 127.0.0.1:{port} answers again"  # logged after the registration's heartbeat
    wait_until("oriond did not register once the controller started",
               lambda: "127.0.0.23" in hosts(ctl) and back in agent.log(), log=agent.log)
    assert agent.alive()
    log = agent.log()
    assert log.count("cannot reach the Orion Controller") == 1, log
    assert log.count("Connecting to Orion Controller") == 1, log
    assert "Traceback" not in log


def test_without_a_configured_controller_oriond_talks_to_none(oriond: Callable[..., Oriond]) -> None:
    agent = oriond("127.0.0.24", None, GPUS)
    wait_until("oriond did not start", lambda: "serving SHM regions" in agent.log(), log=agent.log)
    assert agent.stop() == 0
    assert "Controller" not in agent.log()


def test_a_host_without_gpus_registers_nothing_and_says_so_once(
        controllers: Callable[..., ControllerProcess], oriond: Callable[..., Oriond]) -> None:
    from host_agent.session.gpu_inventory import read

    if read()[0]:
        pytest.skip("this host has a GPU")
    ctl = controllers()
    agent = oriond("127.0.0.25", ctl.address, None)
    wait_until("no line about the missing GPU", lambda: "no GPU to register" in agent.log(), log=agent.log)
    assert agent.alive()
    assert agent.stop() == 0
    assert agent.log().count("no GPU to register") == 1
    assert hosts(ctl) == {}


def test_a_malformed_test_inventory_is_one_error_line_and_oriond_keeps_serving(
        controllers: Callable[..., ControllerProcess], oriond: Callable[..., Oriond]) -> None:
    ctl = controllers()
    agent = oriond("127.0.0.26", ctl.address, [{"uuid": "GPU-x", "name": "no memory"}])
    wait_until("no error about the inventory", lambda: "needs uuid, name and memory_mib" in agent.log(), log=agent.log)
    assert agent.alive()
    assert agent.stop() == 0
    assert "Traceback" not in agent.log() and hosts(ctl) == {}
