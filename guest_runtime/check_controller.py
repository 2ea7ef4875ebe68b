"""The "Checking Orion Controller" part of ``orion-check``, with Orion's wording (ORION-COMPAT.md §6.2, §4.6).

Like the original (``nc -zv`` then ``curl``), it talks only Orion's plain-text REST endpoints, ``/info`` and
``/devices``, so it diagnoses any Orion-compatible controller, ours included. Standard library only: it ships
in the ``orion-guest`` wheel, where ``controller`` must not be imported. The typos ("addrress",
"Infomation", "managered") are Orion's and kept, so scripts that grep its output keep working.
"""
from __future__ import annotations

import http.client
from typing import TextIO

from .client_config import ControllerSetting

HEADERS = {"data_version": "0.2", "api_version": "0.2"}
TIMEOUT_S = 5.0
DEFAULT_SOURCE = "default"  # ControllerSetting.source when nothing is configured and Orion's default is tried


def _get(address: str, path: str) -> str:
    host, _, port = address.rpartition(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=TIMEOUT_S)
    try:
        conn.request("GET", path, headers=HEADERS)
        resp = conn.getresponse()
        body = resp.read().decode(errors="replace").strip()
        if resp.status != 200:
            raise OSError(f"HTTP {resp.status}: {body[:200]}")
        return body
    finally:
        conn.close()


def check_controller(setting: ControllerSetting, out: TextIO) -> bool:
    """Print the controller section; True if the controller answered all three questions."""
    where = ("by default" if setting.source == DEFAULT_SOURCE else
             "in environment variable ORION_CONTROLLER" if setting.from_env else "in configuration file")
    address = setting.address
    print(f"Orion Controller addrress is set as {address} {where}. Using this address to diagnose Orion "
          f"Controller", file=out)
    print(f"Checking Orion Controller ({address}) status ...", file=out)
    print("[Info] Orion Controller setting may be different in different SHELL.", file=out)
    print("[Info] Environment variable ORION_CONTROLLER has the first priority.", file=out)
    print(file=out)
    try:
        version = _get(address, "/info?data_version&api_version")
    except (OSError, http.client.HTTPException, ValueError):
        print(f"[Error] Can not reach {address}. Please make sure Orion Controller is launched at the address, "
              f"and the firewall is correctly set.", file=out)
        return False
    print(f"Orion Controller Version Infomation : {version}", file=out)
    try:
        total = _get(address, "/devices?res=nvidia_cuda").rsplit("=", 1)[-1]
        free = _get(address, "/devices?res=nvidia_cuda&used=true").rsplit("=", 1)[-1]
    except (OSError, http.client.HTTPException, ValueError) as exc:
        print(f"[Error] Fail to get vGPU information from Orion Controller at {address}: {exc}", file=out)
        return False
    print(f"There are {total} vGPU under managered by Orion Controller. {free} vGPU are free now.", file=out)
    return True
