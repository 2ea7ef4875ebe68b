"""argparse as the host's daemons use it (oriond, orion-k8s-plugin): one-line errors, flag types from parsers.

A parser of config.py (``flag_port`` …) raises ValueError with the line to show; ``flag_type`` turns it into
argparse's type, so the error reads ``oriond: argument -p: '0' is not a listen port: …``, with no usage block.
"""
from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import NoReturn, TypeVar

T = TypeVar("T")


class OneLineParser(argparse.ArgumentParser):
    """argparse whose errors are one line (no usage block), with a pointer to --help for an unknown flag."""

    def error(self, message: str) -> NoReturn:
        hint = f" ({self.prog} --help lists the flags)" if message.startswith("unrecognized arguments") else ""
        self.exit(2, f"{self.prog}: {message}{hint}\n")


def flag_type(parse: Callable[[str], T], name: str) -> Callable[[str], T]:
    """`parse` as an argparse type: its ValueError becomes argparse's one line naming the flag."""
    def convert(text: str) -> T:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    convert.__name__ = name
    return convert
