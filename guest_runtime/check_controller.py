"""The "Checking Orion Controller" part of ``orion-check``, with the wording of Orion's bash tool.

Like the original (``nc -zv`` then ``curl``), it talks only Orion's plain-text REST endpoints, ``/info`` and
``/devices`` (with the headers ``data_version`` and ``api_version``; the last ``=N`` of a ``/devices`` answer
is the count), so it diagnoses any Orion-compatible controller, ours included, through the one controller
client (controller_client.py). The typos ("addrress", "Infomation", "managered") are Orion's and kept, so
scripts that grep its output keep working.
"""
from __future__ import annotations

from typing import TextIO

from ivshmem.shared.controller_client import ControllerClient, ControllerClientError

from .client_config import ControllerSetting

HEADERS = {"data_version": "0.2", "api_version": "0.2"}
TIMEOUT_S = 5.0
DEFAULT_SOURCE = "default"  # ControllerSetting.source when nothing is configured and Orion's default is tried


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
        client = ControllerClient(address, TIMEOUT_S)
    except ValueError as exc:  # not HOST:PORT (client_config checked it, so only a caller's mistake)
        print(f"[Error] {exc}", file=out)
        return False
    with client:
        try:
            version = client.text("/info?data_version&api_version", HEADERS)
        except ControllerClientError:
            print(f"[Error] Can not reach {address}. Please make sure Orion Controller is launched at the "
                  f"address, and the firewall is correctly set.", file=out)
            return False
        print(f"Orion Controller Version Infomation : {version}", file=out)
        try:
            total = client.text("/devices?res=nvidia_cuda", HEADERS).rsplit("=", 1)[-1]
            free = client.text("/devices?res=nvidia_cuda&used=true", HEADERS).rsplit("=", 1)[-1]
        except ControllerClientError as exc:
            print(f"[Error] Fail to get vGPU information from Orion Controller at {address}: {exc}", file=out)
            return False
    print(f"There are {total} vGPU under managered by Orion Controller. {free} vGPU are free now.", file=out)
    return True
