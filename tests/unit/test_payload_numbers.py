"""The controller reads numbers in query strings and JSON bodies as Orion's C parser would: ASCII digits only.
`int()` also took '1_0' (10), '١' (Arabic-Indic 1) and ' 2'; the one whole-number reader (ivshmem.shared.ini) does
not."""
from __future__ import annotations

import pytest

from controller import payloads
from controller.errors import BadRequest


@pytest.mark.parametrize("text", ["1_0", "\u0661", " 2", "+2", "2.0", "0x2", "9" * 400])
def test_a_number_that_is_not_ascii_digits_is_a_bad_request(text: str) -> None:
    with pytest.raises(BadRequest, match="nvidia_vgpu .* must be an integer from 1 to"):
        payloads.orion_service_query({"nvidia_vgpu": text}, 42)
    with pytest.raises(BadRequest, match="memory .* must be an integer"):
        payloads.orion_service_query({"nvidia_vgpu": "1", "memory": text}, 42)


def test_digits_and_json_integers_are_read() -> None:
    assert payloads.optional_integer({"n": "007"}, "n", 1, 10) == 7
    assert payloads.optional_integer({"n": 7}, "n", 1, 10) == 7
    assert payloads.optional_integer({"n": ""}, "n", 1, 10) is None
    with pytest.raises(BadRequest, match="got 11"):
        payloads.optional_integer({"n": "11"}, "n", 1, 10)
