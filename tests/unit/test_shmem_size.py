"""xml_templates.devices.shmem_size_mib: the one reader of a `<shmem>`'s `<size unit=...>`, used by the in-place
editor (host_agent/kvm/domain_edit.py) and the qemu hook (libvirt_hooks/regions.py).

Every unit libvirt accepts (its schema's `unit` pattern, basictypes.rng, case-insensitive: b, byte, bytes, and
k/m/g/t/p/e alone, with iB or with B) is read as libvirt reads it; everything else is one line saying what to write.
"""
from __future__ import annotations

import math

import pytest
from lxml import etree

from xml_templates.devices import shmem_size_mib
from xml_templates.errors import DomainXmlError

MIB = 1 << 20


def shmem(size: str | None, unit: str | None = None) -> etree._Element:
    element = etree.Element("shmem", name="orionsock3")
    if size is not None:
        etree.SubElement(element, "size", **({} if unit is None else {"unit": unit})).text = size
    return element


BINARY = {"k": 1, "m": 2, "g": 3, "t": 4, "p": 5, "e": 6}


@pytest.mark.parametrize(("unit", "factor"), [
    *[(u, 1) for u in ("b", "B", "byte", "bytes", "Bytes", "")],
    *[(spelled, 1024**power) for letter, power in BINARY.items()
      for spelled in (letter, letter.upper(), f"{letter.upper()}iB", f"{letter}ib", f"{letter.upper()}IB")],
    *[(spelled, 1000**power) for letter, power in BINARY.items() for spelled in (f"{letter.upper()}B", f"{letter}b")],
])
def test_every_unit_libvirt_accepts(unit: str, factor: int) -> None:
    """The smallest count of the unit that is a whole number of MiB reads back as exactly that many MiB."""
    count = MIB // math.gcd(MIB, factor)
    assert shmem_size_mib(shmem(str(count), unit)) == count * factor // MIB


@pytest.mark.parametrize(("size", "unit", "mib"), [
    ("16", "M", 16), ("1", "G", 1024), ("33554432", None, 32), ("65536", "KiB", 64), (" 128 ", "M", 128),
    ("16", "MiB", 16), ("1048576", "KB", 1000),
])
def test_common_sizes(size: str, unit: str | None, mib: int) -> None:
    assert shmem_size_mib(shmem(size, unit)) == mib


@pytest.mark.parametrize(("size", "unit", "words"), [
    (None, None, "has no <size>"),
    ("", "M", "has no <size>"),
    ("   ", "M", "has no <size>"),
    ("x", "M", "whole number in decimal digits"),
    ("-16", "M", "whole number in decimal digits"),
    ("+16", "M", "whole number in decimal digits"),
    ("1.5", "G", "whole number in decimal digits"),
    ("0x10", "M", "whole number in decimal digits"),
    ("1e3", "M", "whole number in decimal digits"),
    ("\u00b2", "M", "whole number in decimal digits"),  # '²'.isdigit() is True; int() refuses it
    ("\u0661\u0666", "M", "whole number in decimal digits"),  # Arabic-Indic 16: not libvirt's digits
    ("16", "parsec", "not one of libvirt's"),
    ("16", "Mi", "not one of libvirt's"),
    ("16", "MBi", "not one of libvirt's"),
    ("16", "kbytes", "not one of libvirt's"),
    ("16", "Z", "not one of libvirt's"),
    ("16", " M", "not one of libvirt's"),
    ("16", "M\nB", "not one of libvirt's"),
    ("16", "EiB", "more than libvirt can hold"),
    ("18446744073709551616", "b", "more than libvirt can hold"),
    ("1000", "b", "not a whole number of MiB"),
    ("1500", "KiB", "not a whole number of MiB"),
    ("16", "MB", "not a whole number of MiB"),
])
def test_bad_sizes_are_one_line_saying_what_to_write(size: str | None, unit: str | None, words: str) -> None:
    with pytest.raises(DomainXmlError) as refused:
        shmem_size_mib(shmem(size, unit))
    message = str(refused.value)
    assert "\n" not in message and words in message, message
    assert message.startswith("<shmem name='orionsock3'> ")
    if "no <size>" not in words:
        assert "<size unit='M'>128</size>" in message  # what to write instead


def test_odd_text_is_shown_escaped_and_bounded() -> None:
    message = str(pytest.raises(DomainXmlError, shmem_size_mib, shmem("1\n2" + "9" * 200, "M")).value)
    assert "\n" not in message and "1\\n2" in message and len(message) < 300
