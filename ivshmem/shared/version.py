"""The release every command names with --version: one number for both distributions (orion-vgpu, orion-guest).

tests/unit/test_versions.py holds both pyproject.toml files to it and runs every console script with --version.
"""
from __future__ import annotations

VERSION = "0.1.0"


def version_line(command: str) -> str:
    """What `COMMAND --version` prints: the command, the release, the product."""
    return f"{command} {VERSION} (Orion vGPU)"
