"""server.conf and oriond's flag values, parsed: every Orion key takes only what Orion means by it, and a wrong
value is a ConfigError (ValueError for a flag) whose one line names the file or flag, the value and what to
write (issue 11). The same cases, through a real oriond process, are in test_oriond_flags.py."""
from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from host_agent.daemon.config import (
    ServerConfig,
    flag_count,
    flag_devices,
    flag_host,
    flag_port,
    flag_seconds,
)
from host_agent.server_conf import ShmSettings
from ivshmem.shared.ini import ConfigError, host_port, load_ini, whole_number

ORION_TEMPLATE = """\
; this is an example of orion configuration
[server]
    listen_port = 9960
    bind_addr = 127.0.0.1
    enable_kvm = "false"
    enable_shm = "true"
    enable_rdma = "false"
    vgpu_count = 4

[server-nccl]
    comm_id = "127.0.0.1:9970"

[server-log]
    log_with_time = 1
    log_to_screen = 0
    log_to_file = 1
    log_level = INFO
    file_log_level = INFO

[server-shm]
    shm_path_base = "/dev/shm/"
    shm_group_name = "kvm"
    shm_user_name = "libvirt-qemu"
    shm_buffer_size = 128

[controller]
\tcontroller_addr = 127.0.0.1:9123
"""


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "server.conf"
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_orions_template_loads_as_its_defaults_with_no_unknown_keys(tmp_path: Path) -> None:
    config = ServerConfig.load(write(tmp_path, ORION_TEMPLATE), environ={})
    assert (config.listen_port, config.bind_addr, config.vgpu_count, config.log_level) == (9960, "127.0.0.1", 4, "INFO")
    assert (config.enable_shm, config.enable_rdma, config.enable_kvm) == (True, False, False)
    assert (config.controller_addr, config.controller_configured) == ("127.0.0.1:9123", True)
    assert config.shm == ShmSettings() and config.unknown_keys == ()


def test_load_ini_reads_orions_template(tmp_path: Path) -> None:
    path = write(tmp_path, ORION_TEMPLATE)
    data = load_ini(path)
    assert data["server"] == {"listen_port": "9960", "bind_addr": "127.0.0.1", "enable_kvm": "false",
                              "enable_shm": "true", "enable_rdma": "false", "vgpu_count": "4"}
    assert data["server-nccl"]["comm_id"] == "127.0.0.1:9970"
    assert data["controller"]["controller_addr"] == "127.0.0.1:9123"
    assert ShmSettings.load(path) == ShmSettings()


def test_a_missing_file_is_orions_defaults(tmp_path: Path) -> None:
    config = ServerConfig.load(str(tmp_path / "none.conf"), environ={})
    assert config.path is None and config.vgpu_count == 4 and not config.controller_configured


@pytest.mark.parametrize(("line", "wording"), [
    ("vgpu_count = \u00b2", "Invalid parameter vgpu_count in session [server]. A positive interger"),
    ("vgpu_count = \u0663", "Invalid parameter vgpu_count in session [server]"),
    ("vgpu_count = 0", "Invalid parameter vgpu_count"),
    ("vgpu_count = 101", "expected in [1, 100]"),
    ("vgpu_count = +4", "Invalid parameter vgpu_count"),
    ("vgpu_count = 4_0", "Invalid parameter vgpu_count"),
    ("listen_port = \u00b3", "Invalid parameter listen_port in session [server]"),
    ("listen_port = 65534", "expected in [1, 65533]"),
    ("listen_port = " + "9" * 5000, "Invalid parameter listen_port"),
    ('enable_shm = "tru', "has an unterminated quote"),
    ('enable_shm = true"', "has an unterminated quote"),
    ('enable_kvm = "True"', 'write "true" or "false"'),
    ('enable_ibverbs = "on"', 'write "true" or "false"'),
    ('ibverbs_device = ""', "ibverbs_device is empty"),
    ('bind_addr = ""', "bind_addr = '' is not a valid value"),
    ("bind_addr = 10.0.0.1:9960", "bind_addr = '10.0.0.1:9960'"),
    ("bind_addr = 999.1.1.1", "bind_addr = '999.1.1.1'"),
])
def test_a_bad_server_value_names_the_file_and_key(line: str, wording: str, tmp_path: Path) -> None:
    path = write(tmp_path, f"[server]\n    {line}\n")
    with pytest.raises(ConfigError, match=re.escape(wording)) as caught:
        ServerConfig.load(path, environ={})
    assert str(caught.value).startswith(path) and "\n" not in str(caught.value)


@pytest.mark.parametrize(("text", "wording"), [
    ("[server-log]\n    log_level = LOUD\n", "Invalid [server-log] log_level: LOUD"),
    ("[server-log]\n    log_level = \u0131nfo\n", "Invalid [server-log] log_level"),  # dotless i upper-cases to I
    ("[server-log]\n    file_log_level = verbose\n", "Invalid [server-log] file_log_level: verbose"),
    ("[server-log]\n    log_to_screen = 2\n", "log_to_screen = '2' is not a valid value; write 0 or 1"),
    ("[server-log]\n    log_with_time = true\n", "log_with_time = 'true'"),
    ("[server-nccl]\n    comm_id = 127.0.0.1\n", "comm_id = '127.0.0.1' is not a valid value: the port is missing"),
    ("[controller]\n    controller_addr = 10.0.0.1\n", "the port is missing; write HOST:PORT"),
    ("[controller]\n    controller_addr = 10.0.0.1:\n", "the port is missing"),
    ("[controller]\n    controller_addr = 10.0.0.1:0\n", "the port '0' is not a number from 1 to 65535"),
    ("[controller]\n    controller_addr = 10.0.0.1:65536\n", "the port '65536'"),
    ("[controller]\n    controller_addr = 10.0.0.1:\u00b9\u00b2\n", "is not a number from 1 to 65535"),
    ("[controller]\n    controller_addr = :9123\n", "the host is missing"),
    ("[controller]\n    controller_addr = a b:9123\n", "'a b' is not a host name or IP address"),
    ("[controller]\n    controller_addr = ::1:9123\n", "[ADDRESS]:PORT"),
    ('[controller]\n    controller_addr = "10.0.0.1:9123\n', "unterminated quote"),
    ("[server-relay]\n    remote_addr = gpu-host\n", "[server-relay] remote_addr = 'gpu-host' is not a valid value"),
    ("[cluster]\n    key_file = cluster.key\n", "[cluster] key_file = 'cluster.key' is not a valid value; write the "
                                             "absolute path of the cluster key, e.g. /etc/orion/cluster.key"),
    ('[cluster]\n    key_file = ""\n', "[cluster] key_file = '' is not a valid value"),
])
def test_a_bad_value_of_another_section_names_the_file_and_key(text: str, wording: str, tmp_path: Path) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError, match=re.escape(wording)) as caught:
        ServerConfig.load(path, environ={})
    assert str(caught.value).startswith(path) and "\n" not in str(caught.value)


@pytest.mark.parametrize(("text", "wording"), [
    ("shm_path_base = shm/", "shm_path_base = 'shm/' is not a valid value; write the absolute path"),
    ('shm_path_base = ""', "shm_path_base = '' is not a valid value"),
    ('shm_path_base = "/dev/shm/', "unterminated quote"),
    ("shm_buffer_size = 8", "It should be in [16, 1024*1024]"),
    ("shm_buffer_size = 2097152", "It should be in [16, 1024*1024]"),
    ("shm_buffer_size = \u00b9\u2076", 'Type "unsigned int" is expected.'),
    ("shm_buffer_size = " + "1" * 5000, 'Type "unsigned int" is expected.'),
    ('shm_user_name = ""', "shm_user_name = '' is not a valid value; write a Linux user name"),
    ("shm_group_name = kvm users", "write a Linux group name, e.g. kvm"),
])
def test_a_bad_server_shm_value_is_refused_by_every_reader(text: str, wording: str, tmp_path: Path) -> None:
    """ShmSettings is what orion-shm and the qemu hook read too: they get the same line."""
    path = write(tmp_path, f"[server-shm]\n    {text}\n")
    for load in (ShmSettings.load, lambda p: ServerConfig.load(p, environ={})):
        with pytest.raises(ConfigError, match=re.escape(wording)):
            load(path)


def test_quotes_are_orions_syntax_and_only_a_pair_is_removed(tmp_path: Path) -> None:
    path = write(tmp_path, '[server-shm]\n    shm_path_base = "/srv/orion/"\n    shm_user_name = qemu\n')
    assert load_ini(path)["server-shm"] == {"shm_path_base": "/srv/orion/", "shm_user_name": "qemu"}
    with pytest.raises(ConfigError, match=re.escape(f"{path}: [server] bind_addr = '\"' has an unterminated")):
        load_ini(write(tmp_path, '[server]\n    bind_addr = "\n'))


def test_orion_controller_beats_the_file_and_is_checked_as_strictly(tmp_path: Path) -> None:
    path = write(tmp_path, "[controller]\n    controller_addr = 10.0.0.1:9123\n")
    assert ServerConfig.load(path, environ={"ORION_CONTROLLER": "10.0.0.2:9124"}).controller_addr == "10.0.0.2:9124"
    assert ServerConfig.load(path, environ={"ORION_CONTROLLER": " "}).controller_addr == "10.0.0.1:9123"
    assert ServerConfig.load(path, environ={"ORION_CONTROLLER": "http://ctl.example:80/"}).controller_addr == \
        "ctl.example:80"
    assert ServerConfig.load(path, environ={"ORION_CONTROLLER": "[::1]:9123"}).controller_addr == "[::1]:9123"
    for bad, why in (("ctl", "the port is missing"), ("ctl:99999", "'99999'"), ("ctl:\u0669", "'\u0669'"),
                     ("ctl:-1", "'-1'"), ("[ctl]:9123", "only an IPv6 address")):
        with pytest.raises(ConfigError, match=re.escape(f"ORION_CONTROLLER = {bad!r} is not a valid value")) as caught:
            ServerConfig.load(path, environ={"ORION_CONTROLLER": bad})
        assert why in str(caught.value)


def test_keys_orion_does_not_know_are_listed_for_a_warning(tmp_path: Path) -> None:
    path = write(tmp_path, ORION_TEMPLATE + "[server]\n    vgpu_cont = 2\n[dev]\n    dev_1 = 3\n[extra]\n    a = 1\n")
    assert ServerConfig.load(path, environ={}).unknown_keys == ("[server] vgpu_cont", "[extra]")


def test_the_region_directory_must_exist_and_is_never_created(tmp_path: Path) -> None:
    regions = tmp_path / "regions"
    config = ServerConfig.load(write(tmp_path, f"[server-shm]\n    shm_path_base = {regions}/\n"), environ={})
    with pytest.raises(ConfigError, match=re.escape(f"no such directory; create it (mkdir -p {regions})")):
        config.check_region_dir()
    assert not regions.exists()
    regions.write_text("")
    with pytest.raises(ConfigError, match="is not a directory"):
        config.check_region_dir()
    regions.unlink()
    regions.mkdir()
    config.check_region_dir()
    nested = ServerConfig.load(write(tmp_path, f"[server-shm]\n    shm_path_base = {regions}/x/y\n"), environ={})
    with pytest.raises(ConfigError, match="no such directory"):
        nested.check_region_dir()


# --- flag values ----------------------------------------------------------------------------------------------
def test_whole_numbers_are_ascii_digits_only() -> None:
    assert whole_number("0009960") == 9960 and whole_number("0") == 0
    for bad in ("", "\u00b2", "\u0663", "+1", "-1", " 1", "1_0", "1.0", "9" * 5000):
        assert whole_number(bad) is None, bad


def test_host_port() -> None:
    assert host_port("10.0.0.1:9123") == ("10.0.0.1", 9123)
    assert host_port("gpu-host.example:1") == ("gpu-host.example", 1)
    assert host_port("[fe80::1]:65535") == ("fe80::1", 65535)
    for bad in ("10.0.0.1", "10.0.0.1:", "10.0.0.1:0", "10.0.0.1:65536", "host:port", "-host:1", "a_b:1", "[::1]",
                "::1:9123", "1.2.3:9123"):
        with pytest.raises(ValueError):
            host_port(bad)


def test_flag_values() -> None:
    assert flag_devices("0,2") == (0, 2) and flag_devices(" 3 , 1 ") == (3, 1)
    assert flag_count("8", "clients") == 8 and flag_port("9960") == 9960 and flag_host("::1") == "::1"
    assert flag_seconds("0.5") == 0.5 and flag_seconds("3600") == 3600.0 and flag_seconds("1e-3") == 0.001
    for text, wording in (("x", "'x' is not a GPU ordinal"), ("0,,1", "has an empty item"), ("0,", "empty item"),
                          ("", "empty item"), ("1,0,1", "GPU 1 is given twice"), ("-1", "'-1' is not a GPU ordinal"),
                          ("\u00b9", "is not a GPU ordinal"), ("0,y", "'y' in '0,y'")):
        with pytest.raises(ValueError, match=re.escape(wording)):
            flag_devices(text)
    for bad in ("-5", "0", "1.5", "\u0661", "4294967296"):
        with pytest.raises(ValueError, match="expected a whole number from 1 to 4294967295"):
            flag_count(bad, "MiB of memory")
    for bad in ("nan", "inf", "-inf", "-1", "0", "0.0", "1e999", "\u0661", "1_0", "", "+1"):
        with pytest.raises(ValueError, match="expected seconds above 0"):
            flag_seconds(bad)
    for bad in ("0", "65534", "\u00b3"):
        with pytest.raises(ValueError, match="from 1 to 65533"):
            flag_port(bad)
    with pytest.raises(ValueError, match="not an IP address or host name"):
        flag_host("10.0.0.1 10.0.0.2")
    assert math.isfinite(flag_seconds("1e308"))


def test_a_spaced_section_header_is_the_section(tmp_path: Path) -> None:
    """`[ server-shm ]` is [server-shm] (configparser kept the blanks: the section was unknown, its keys ignored)."""
    path = write(tmp_path, '[ server-shm ]\n    shm_user_name = "qemu"\n')
    assert ShmSettings.load(path).user == "qemu"
    assert ServerConfig.load(path, environ={}).unknown_keys == ()


def test_a_line_that_is_not_ini_is_named_once_quoted(tmp_path: Path) -> None:
    path = write(tmp_path, "[server]\n    listen_port 9960\n")
    with pytest.raises(ConfigError) as caught:
        load_ini(path)
    assert str(caught.value) == (f"{path}, line 2: cannot parse 'listen_port 9960'; expected 'key = value', "
                                 "'[section]' or a '; comment'")


def test_a_relay_section_and_shm_with_rdma_are_accepted(tmp_path: Path) -> None:
    """Orion refused enable_shm with enable_rdma; here an oriond serves its guests by SHM and relays by RDMA."""
    path = write(tmp_path, '[server]\n    enable_shm = "true"\n    enable_rdma = "true"\n'
                           "[server-relay]\n    remote_addr = 10.0.0.2:9960\n")
    config = ServerConfig.load(path, environ={})
    assert (config.enable_shm, config.enable_rdma, config.relay, config.relay_addr) == (True, True, True,
                                                                                         "10.0.0.2:9960")
    assert not config.unknown_keys


def test_the_cluster_key_file_and_whether_listen_port_was_set(tmp_path: Path) -> None:
    """[cluster] key_file (docs/security.md) defaults to /etc/orion/cluster.key and is no key Orion lacks a warning
    for; the relay listener is on only where listen_port is written (docs/remote.md), Orion's template included."""
    default = ServerConfig.load(write(tmp_path, "[server]\n    vgpu_count = 2\n"), environ={})
    assert (default.cluster_key_file, default.listen_port, default.listen_port_set) == \
        (Path("/etc/orion/cluster.key"), 9960, False)
    path = write(tmp_path, ORION_TEMPLATE + '[cluster]\n    key_file = "/srv/orion/cluster.key"\n')
    config = ServerConfig.load(path, environ={})
    assert (config.cluster_key_file, config.listen_port_set, config.unknown_keys) == \
        (Path("/srv/orion/cluster.key"), True, ())
