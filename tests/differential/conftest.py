"""The paths every differential test runs its program on: a region served locally by a real agent over the fake
driver, and the same relayed across tests/relay_net.py's network namespaces (skipped where those cannot be made)."""
from __future__ import annotations

from collections.abc import Callable

import pytest

from tests import relay_net
from tests.forwarding_rig import Rig

PATHS = ["local", "relayed-tcp"]


@pytest.fixture(params=PATHS)
def served(request: pytest.FixtureRequest, start: Callable[..., Rig]) -> Rig:
    relayed = request.param == "relayed-tcp"
    if relayed and relay_net.why_not():
        pytest.skip(relay_net.why_not())
    return start(relayed=relayed)


@pytest.fixture
def relayed(start: Callable[..., Rig]) -> Rig:
    if relay_net.why_not():
        pytest.skip(relay_net.why_not())
    return start(relayed=True)


@pytest.fixture
def local(start: Callable[..., Rig]) -> Rig:
    return start(relayed=False)
