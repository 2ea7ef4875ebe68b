"""`orion-controller start --config-file controller.yaml` (issue 31): Orion's form, its installer's ExecStart line,
used to be refused. What the file says about the controller becomes its settings, flags win over it, Orion's etcd
section gives the etcd to use, an unknown key is named, and a bad file is one line (controller/config_file.py)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from controller.cli import _parser, start_config
from controller.config import ConfigError
from controller.config_file import start_flags
from tests.processes import REPO, python_path

ORIONS = """controller:
  listen_ip: 0.0.0.0
  listen_port: 9123
  log_level: info
  # log_file: if null, log will output to STDOUT
  log_file: "/var/log/orion/controller.log"
  authentication:
    client-key:
    server-key:
    administrator-key:

database:
  # config for etcd, support all configuration of etcd
  name: etcd
  data-dir: "/root/.orion/etcd"
  listen-client-urls: http://127.0.0.1:23791
  advertise-client-urls: http://127.0.0.1:23791
  listen-peer-urls: http://127.0.0.1:23801
  initial-cluster-state: new
"""


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "controller.yaml"
    path.write_text(text)
    return str(path)


def test_orions_own_file_is_read_as_it_was_shipped(tmp_path: Path) -> None:
    flags, unknown = start_flags(write(tmp_path, ORIONS))
    assert flags == {"listen": "0.0.0.0:9123", "log_level": "info", "log": "/var/log/orion/controller.log",
                     "etcd": "http://127.0.0.1:23791"}
    assert unknown == []


def test_flags_win_over_the_file_and_the_file_over_the_defaults(tmp_path: Path) -> None:
    path = write(tmp_path, ORIONS.replace("9123", "9200").replace('"/var/log/orion/controller.log"', "null"))
    config = start_config(_parser().parse_args(["start", "--config-file", path, "--etcd", "http://10.0.0.5:2379"]))
    assert (config.listen, config.etcd_url, config.log_file, config.log_level) == \
        ("0.0.0.0:9200", "http://10.0.0.5:2379", None, "info")
    config = start_config(_parser().parse_args(["start", "--config-file", path, "--listen", "127.0.0.1:9300",
                                                "--log-level", "debug"]))
    assert (config.listen, config.etcd_url, config.log_level) == ("127.0.0.1:9300", "http://127.0.0.1:23791",
                                                                    "debug")
    plain = start_config(_parser().parse_args(["start"]))
    assert (plain.listen, plain.etcd_url, plain.log_file, plain.log_level) == \
        ("0.0.0.0:9123", "http://127.0.0.1:2379", None, "info")


def test_a_key_orions_file_does_not_have_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, "controller:\n  listen_prot: 9124\nextra:\n  x: 1\n")
    start_config(_parser().parse_args(["start", "--config-file", path]))
    said = capsys.readouterr().err.splitlines()
    assert said == [f"orion-controller: {path}: [extra] is not in Orion's controller.yaml; ignored (a typo?)",
                    f"orion-controller: {path}: [controller] listen_prot is not in Orion's controller.yaml; ignored "
                    "(a typo?)"]


@pytest.mark.parametrize(("text", "words"), [
    ("controller: [1, 2\n", "is not valid YAML at line"),
    ("- a\n- b\n", "is not a YAML mapping of sections"),
    ("controller: 7\n", "'controller' is not a section of keys"),
    ("controller:\n  log_level: loud\n", "controller.log_level = 'loud' is not a valid value"),
    ("controller:\n  listen_port: [9123]\n", "controller.listen_port = [9123] is not a valid value"),
    ("controller:\n  listen_port: 99999\n", "99999"),
])
def test_a_bad_file_is_one_line_and_exit_2(tmp_path: Path, text: str, words: str) -> None:
    path = write(tmp_path, text)
    done = subprocess.run([sys.executable, "-m", "controller.cli", "start", "--config-file", path], cwd=REPO,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": python_path()}, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith("orion-controller: ") and words in done.stderr, done.stderr


def test_a_missing_file_says_what_to_name(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read it .*/etc/orion/controller.yaml"):
        start_flags(str(tmp_path / "none.yaml"))
