"""host_agent/pidfile.read_pid on what a local user can put in a file ORION_PID_FILE or -pid-file names
(docs/security.md: no file's contents end a process of ours), and the controller's --listen on odd digits."""
from __future__ import annotations

from pathlib import Path

import pytest

from controller.config import ConfigError, parse_listen
from host_agent.daemon.pidfile import read_pid


@pytest.mark.parametrize("content", [b"\xc2\xb2", "\u0663".encode(), b"\xff\xfe12", b"-5", b"0", b"12 34",
                                     b"99999999999999999999", b"", b"\n"])
def test_a_pid_file_with_anything_but_a_pid_names_no_process(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "oriond.pid"
    path.write_bytes(content)
    assert read_pid(str(path)) is None


def test_a_pid_file_names_its_pid(tmp_path: Path) -> None:
    path = tmp_path / "oriond.pid"
    path.write_bytes(b"4242\n")
    assert read_pid(str(path)) == 4242
    assert read_pid(str(tmp_path / "missing")) is None


@pytest.mark.parametrize("port", ["9\u00b2", "\u0669\u0661\u0662\u0663", "+80", " 80"])
def test_a_listen_port_in_other_digits_is_one_line(port: str) -> None:
    with pytest.raises(ConfigError, match="HOST:PORT"):
        parse_listen(f"0.0.0.0:{port}")
