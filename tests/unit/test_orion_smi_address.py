"""orion-smi's controller address, read by the rule every Orion program uses (ivshmem.shared.ini.host_port): a port
it cannot use, or none, is one line naming where the address came from, never a silent :9123 or a raw parse
error (a word as the port). No controller is
needed: each case ends before any connection."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from host_agent.admin.orion_smi import AddressError, checked_address

REPO = Path(__file__).resolve().parents[2]


def smi(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("ORION_")}
    return subprocess.run([sys.executable, "-m", "host_agent.admin.orion_smi", *args], capture_output=True, text=True,
                          cwd=REPO, env={**base, "PYTHONPATH": str(REPO), **env}, timeout=60)


@pytest.mark.parametrize(("address", "words"), [
    ("127.0.0.1:0", "is not a number from 1 to 65535"),
    ("127.0.0.1:65536", "is not a number from 1 to 65535"),
    ("127.0.0.1:abc", "is not a number from 1 to 65535"),
    (":9123", "the host is missing"),
    ("127.0.0.1:", "the port is missing"),
    ("ctl.example", "the port is missing"),
    ("ftp://somewhere:9123", "only http:// may be written before HOST:PORT"),
    ("somewhere:9123/path", "is not a number from 1 to 65535"),
    ("a b:1", "'a b' is not a host name or IP address"),
])
def test_a_bad_controller_option_is_one_line(address: str, words: str) -> None:
    out = smi("--controller", address)
    assert (out.returncode, out.stdout) == (2, ""), out.stderr
    assert len(out.stderr.splitlines()) == 1 and "Traceback" not in out.stderr
    assert out.stderr.startswith(f"orion-smi: --controller is '{address}'") and words in out.stderr, out.stderr
    assert "HOST:PORT" in out.stderr


def test_a_bad_controller_addr_in_server_conf_names_the_file(tmp_path: Path) -> None:
    conf = tmp_path / "server.conf"
    conf.write_text("[controller]\n    controller_addr = 127.0.0.1:0\n")
    out = smi("--config", str(conf))
    assert out.returncode == 2 and len(out.stderr.splitlines()) == 1, out.stderr
    assert str(conf) in out.stderr and "1 to 65535" in out.stderr


def test_a_bad_option_is_one_line() -> None:
    out = smi("--bogus")
    assert out.returncode == 2 and len(out.stderr.splitlines()) == 1 and "orion-smi -h" in out.stderr, out.stderr


@pytest.mark.parametrize(("text", "address"), [
    ("10.0.0.1:9124", "10.0.0.1:9124"), ("http://10.0.0.1:9124/", "10.0.0.1:9124"),
    ("ctl.example:9125", "ctl.example:9125"), ("[::1]:9124", "[::1]:9124"),
])
def test_good_addresses(text: str, address: str) -> None:
    assert checked_address(text, "--controller") == address


def test_address_error_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="--controller is 'x:0'"):
        checked_address("x:0", "--controller")
    assert issubclass(AddressError, ValueError)
