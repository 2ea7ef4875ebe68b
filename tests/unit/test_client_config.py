"""Where the guest runtime and orion-check find the controller: ORION_CONTROLLER, then ~/.orion/client.conf,
then /etc/orion/client.conf (Orion's client's order), read from real files in a temporary directory."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from guest_runtime.allocation import AllocationError, wanted_request
from guest_runtime.client_config import ClientConfigError, config_file, controller_setting, read_conf
from ivshmem.shared.ini import load_ini


def conf(path: Path, address: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"; Orion client\n[client-shm]\n    shm_path_base = /dev/shm\n[controller]\n"
                    f"    controller_addr = {address}\n")
    return path


def test_env_beats_the_users_file_which_beats_the_systems(tmp_path: Path) -> None:
    user, system = conf(tmp_path / "home/.orion/client.conf", "10.0.0.2:9123"), conf(tmp_path / "etc", "10.0.0.3:9123")
    files = (user, system)
    env = controller_setting({"ORION_CONTROLLER": "10.0.0.1:9123"}, files)
    assert env is not None and env.address == "10.0.0.1:9123" and env.from_env
    setting = controller_setting({}, files)
    assert setting is not None and (setting.address, setting.source) == ("10.0.0.2:9123", str(user))
    fallback = controller_setting({}, (tmp_path / "missing", system))
    assert fallback is not None and fallback.address == "10.0.0.3:9123"
    assert controller_setting({}, (tmp_path / "missing",)) is None
    assert config_file({}, files) == user and config_file({}, (tmp_path / "missing", system)) == system


def test_home_locates_the_users_file(tmp_path: Path) -> None:
    conf(tmp_path / ".orion/client.conf", "10.0.0.9:9123")
    setting = controller_setting({"HOME": str(tmp_path)})
    assert setting is not None and setting.address == "10.0.0.9:9123"


def test_quotes_and_indentation_are_orions_syntax(tmp_path: Path) -> None:
    path = tmp_path / "c.conf"
    path.write_text('[controller]\n\tcontroller_addr = "1.2.3.4:9123"\n# controller_addr = 9.9.9.9:1\n')
    assert read_conf(path)["controller"] == {"controller_addr": "1.2.3.4:9123"}


@pytest.mark.parametrize("bad", ["nowhere", "1.2.3.4", "1.2.3.4:port"])
def test_a_malformed_address_is_named_not_skipped(tmp_path: Path, bad: str) -> None:
    with pytest.raises(ClientConfigError, match="ORION_CONTROLLER is .*expected HOST:PORT"):
        controller_setting({"ORION_CONTROLLER": bad}, ())
    path = conf(tmp_path / "c.conf", bad)
    with pytest.raises(ClientConfigError, match=f"controller_addr in {path}"):
        controller_setting({}, (path, conf(tmp_path / "ok.conf", "1.2.3.4:9123")))


def test_orion_vgpu_and_gmem() -> None:
    assert wanted_request({}) is None
    assert wanted_request({"ORION_GMEM": "4000"}) is None  # ORION_VGPU has no default
    assert wanted_request({"ORION_VGPU": "2"}) == (2, None)
    assert wanted_request({"ORION_VGPU": "2", "ORION_GMEM": "12000"}) == (2, 12000)
    for env in ({"ORION_VGPU": "0"}, {"ORION_VGPU": "x"}, {"ORION_VGPU": "1", "ORION_GMEM": "-5"}):
        with pytest.raises(AllocationError, match="is not a positive whole number"):
            wanted_request(env)


@pytest.mark.parametrize(("bad", "why"), [
    ("1.2.3.4:\u0669\u0661\u0662\u0663", "is not a number from 1 to 65535"),  # \d took Arabic-Indic digits
    ("1.2.3.4:0", "the port '0' is not a number from 1 to 65535"),
    ("1.2.3.4:65536", "the port '65536'"),
    ("1.2.3.4:99999", "the port '99999'"),
    ("1.2.3.4:", "the port is missing"),
    ("1.2.3.4", "the port is missing"),
    (":9123", "the host is missing"),  # the host's wording: one address check (ivshmem/shared/ini.py)
    ("...:9123", "'...' is not a host name"),
    ("-host:9123", "'-host' is not a host name"),
    ("999.1.1.1:9123", "'999.1.1.1' is not a host name or IP address"),
    ("[host]:9123", "only an IPv6 address is written in brackets"),
    ("::1:9123", "[ADDRESS]:PORT"),
])
def test_a_wrong_port_or_host_says_what_is_wrong(tmp_path: Path, bad: str, why: str) -> None:
    with pytest.raises(ClientConfigError, match=f"ORION_CONTROLLER is .*{re.escape(why)}.*expected HOST:PORT"):
        controller_setting({"ORION_CONTROLLER": bad}, ())
    path = conf(tmp_path / "c.conf", bad)
    with pytest.raises(ClientConfigError, match=re.escape(why)):
        controller_setting({}, (path,))


def test_good_addresses_are_kept(tmp_path: Path) -> None:
    for good in ("gpu-host.example:9123", "10.0.0.1:1", "[fe80::1]:65535", "localhost:9123"):
        setting = controller_setting({"ORION_CONTROLLER": good}, ())
        assert setting is not None and setting.address == good
    setting = controller_setting({"ORION_CONTROLLER": "http://10.0.0.1:9123/"}, ())
    assert setting is not None and setting.address == "10.0.0.1:9123"


def test_a_lone_quote_is_an_error_not_stripped(tmp_path: Path) -> None:
    path = tmp_path / "c.conf"
    path.write_text('[controller]\n    controller_addr = "1.2.3.4:9123\n')
    assert read_conf(path)["controller"]["controller_addr"] == '"1.2.3.4:9123'
    with pytest.raises(ClientConfigError, match=f"controller_addr in {re.escape(str(path))} .*unterminated quote"):
        controller_setting({}, (path,))
    path.write_text("[controller]\n    controller_addr = '1.2.3.4:9123'\n")
    setting = controller_setting({}, (path,))
    assert setting is not None and setting.address == "1.2.3.4:9123"


def test_a_users_file_that_cannot_be_read_is_named_not_skipped(tmp_path: Path) -> None:
    """~/.orion/client.conf made a directory by mistake must not silently hand over to /etc/orion/client.conf."""
    user = tmp_path / "home/.orion/client.conf"
    user.mkdir(parents=True)
    system = conf(tmp_path / "etc/client.conf", "10.0.0.3:9123")
    with pytest.raises(ClientConfigError, match=f"cannot read {re.escape(str(user))}: it is a directory"):
        controller_setting({}, (user, system))


def test_the_client_reads_its_file_with_the_servers_reader(tmp_path: Path) -> None:
    """One INI reader (ivshmem/shared/ini.py): a comment after the value, a spaced header and an upper-case key
    mean for client.conf what they mean for server.conf (the client's own reader kept the comment in the address,
    missed the section and the key)."""
    path = tmp_path / "client.conf"
    path.write_text("[ controller ]\n    Controller_Addr = 10.0.0.7:9123   ; the lab's controller\n")
    setting = controller_setting({}, (path,))
    assert setting is not None and setting.address == "10.0.0.7:9123"
    orion = tmp_path / "orion.conf"
    orion.write_text('[server]\n    enable_shm = "true"\n[controller]\n\tcontroller_addr = 127.0.0.1:9123\n')
    assert read_conf(orion) == load_ini(str(orion))


def test_lines_the_client_does_not_understand_are_skipped_not_fatal(tmp_path: Path) -> None:
    """The lenient reading Orion's client had: a stray line or a key before any header costs nothing."""
    path = tmp_path / "client.conf"
    path.write_text("stray = 1\n[controller]\nnot a key\ncontroller_addr = 10.0.0.8:9123\n")
    setting = controller_setting({}, (path,))
    assert setting is not None and setting.address == "10.0.0.8:9123"
