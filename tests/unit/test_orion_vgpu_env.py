"""ORION_VGPU and ORION_GMEM are whole numbers of ASCII digits, as Orion's C client reads them: Python's int()
also takes other scripts' digits and underscores, which no Orion setting means."""
from __future__ import annotations

import pytest

from guest_runtime.allocation import AllocationError, wanted_request


@pytest.mark.parametrize("text", ["١", "٣", "1_0", "１", "+2", "2.0", "0x2", "0", "-1", "9" * 40])
def test_a_vgpu_count_that_is_not_ascii_digits_is_one_line(text: str) -> None:
    with pytest.raises(AllocationError) as caught:
        wanted_request({"ORION_VGPU": text})
    assert str(caught.value) == f"ORION_VGPU={text!r} is not a positive whole number of vGPUs"


@pytest.mark.parametrize("text", ["٤٠٩٦", "4_096"])
def test_a_memory_that_is_not_ascii_digits_is_one_line(text: str) -> None:
    with pytest.raises(AllocationError, match=r"^ORION_GMEM=.* is not a positive whole number of MiB$"):
        wanted_request({"ORION_VGPU": "1", "ORION_GMEM": text})


def test_ascii_digits_with_spaces_around_are_numbers() -> None:
    assert wanted_request({"ORION_VGPU": " 2 ", "ORION_GMEM": "04096"}) == (2, 4096)
