"""orion-shm: Orion's exact CLI (help, validation, messages, exit codes) and the list/inspect/remove commands.

The CLI is run as a real process (`python -m ivshmem.shm_cli`) so exit codes and streams are what a user
sees. Regions go to a tmp dir through -d, except the /dev/shm (posix_ipc) cases, which use a random high
index and always clean up.
"""
from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import pwd
import random
import re
import resource
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ivshmem import layout
from ivshmem.layout import Geometry
from ivshmem.orion_conf import ConfigError, ShmSettings, load_ini
from ivshmem.region import Region
from ivshmem.shm_admin import ShmError, create, users_of
from ivshmem.shm_cli import main

REPO = Path(__file__).resolve().parents[2]
MIB = 1 << 20
HELP = (
    "Name    : Orion SHM creator\n"
    "Version : 0.1\n"
    "Options :\n"
    "\t-i : Index of created SHM file.   Default 0\n"
    "\t-s : Size of SHM (MiB).           Default 128\n"
    "\t-d : System default shm path.     Default /dev/shm\n"
    "\t-h : Print this message.\n"
)
INDEX_ERROR = "Error. Invalid SHM file index. It should be in [0, 9999]"
SIZE_ERROR = "Error. Invalid SHM file size. It should be in [16, 1024*1024]"
NOBODY = "orion-test-no-such-user"
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another owner needs root")


def shm(*args: str, preexec_fn=None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ivshmem.shm_cli", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=60, preexec_fn=preexec_fn)


def assert_clean_failure(result: subprocess.CompletedProcess[str]) -> None:
    assert result.returncode == 1, result
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


@pytest.fixture
def nobody_conf(tmp_path: Path) -> str:
    conf = tmp_path / "server.conf"
    conf.write_text(f'[server-shm]\n    shm_user_name = "{NOBODY}"\n    shm_group_name = "{NOBODY}"\n')
    return str(conf)


@pytest.fixture
def root_conf(tmp_path: Path) -> str:
    conf = tmp_path / "root.conf"
    conf.write_text('[server-shm]\n\tshm_user_name = "root"\n\tshm_group_name = "root"\n')
    return str(conf)


@pytest.fixture
def regions(tmp_path: Path) -> Path:
    d = tmp_path / "regions"
    d.mkdir()
    return d


@contextlib.contextmanager
def holder(path: Path | str, how: str = "map") -> Iterator[subprocess.Popen[str]]:
    """A process that maps (then closes) or just keeps open `path`, until killed."""
    code = ("import mmap, sys, time\n"
            "f = open(sys.argv[1], 'r+b')\n"
            "if sys.argv[2] == 'map':\n"
            "    m = mmap.mmap(f.fileno(), 0)\n"
            "    f.close()\n"
            "print('ready', flush=True)\n"
            "time.sleep(120)\n")
    proc = subprocess.Popen([sys.executable, "-c", code, str(path), how], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        yield proc
    finally:
        proc.kill()
        proc.wait()


# --- Orion's form: help, options, validation ------------------------------------------------------------------
def test_help_is_orions_exact_text() -> None:
    result = shm("-h")
    assert (result.returncode, result.stdout, result.stderr) == (0, HELP, "")


@pytest.mark.parametrize("args", [["-x"], ["--help"], ["-i"], ["-i", "1", "-q"]])
def test_unknown_option_or_missing_value_prints_help_and_exits_1(args: list[str], regions: Path) -> None:
    result = shm("-d", str(regions), *args)
    assert result.returncode == 1
    assert result.stdout == HELP
    assert "Traceback" not in result.stderr
    assert not list(regions.iterdir())


@pytest.mark.parametrize(("args", "message"), [
    (["-i", "-1"], INDEX_ERROR),
    (["-i", "10000"], INDEX_ERROR),
    (["-i", "99999999999999999999"], INDEX_ERROR),
    (["-i", "-1", "-s", "1"], INDEX_ERROR),  # index is checked first, as in Orion
    (["-s", "15"], SIZE_ERROR),
    (["-s", "1048577"], SIZE_ERROR),
    (["-s", "0"], SIZE_ERROR),
])
def test_validation_messages(args: list[str], message: str, regions: Path) -> None:
    result = shm(*args, "-d", str(regions))
    assert_clean_failure(result)
    assert result.stderr.strip() == message
    assert not list(regions.iterdir())


def test_missing_directory_keeps_orions_wording(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    result = shm("-d", str(missing))
    assert_clean_failure(result)
    assert result.stderr.strip() == f"Error. {missing} dose not exist in the system."


@pytest.mark.parametrize(("args", "option"), [
    (["-i", "abc"], "-i"), (["-s", "12abc"], "-s"), (["-s", ""], "-s"), (["-i", "0x10"], "-i"), (["-i", "1.5"], "-i"),
])
def test_non_numeric_values_are_refused_not_read_as_zero(args: list[str], option: str, regions: Path) -> None:
    result = shm(*args, "-d", str(regions))
    assert_clean_failure(result)
    assert f"for {option}" in result.stderr and "integer" in result.stderr
    assert not list(regions.iterdir())


def test_stray_argument_is_refused(regions: Path) -> None:
    result = shm("lst", "-d", str(regions))
    assert_clean_failure(result)
    assert "'lst'" in result.stderr and "orion-shm help" in result.stderr


def test_legacy_create_defaults(regions: Path) -> None:
    result = shm("-d", str(regions))
    path = regions / "orionsock0"
    assert (result.returncode, result.stdout, result.stderr) == (0, f"{path} is successfully created.\n", "")
    assert path.stat().st_size == 128 * MIB
    with Region.open(path) as region:
        assert region.geometry.region_size == 128 * MIB
        assert region.geometry.name == "orionsock0"


def test_legacy_create_index_and_size(regions: Path) -> None:
    result = shm("-i", "7", "-s", "16", "-d", str(regions))
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{regions}/orionsock7 is successfully created.\n"
    assert (regions / "orionsock7").stat().st_size == 16 * MIB


@pytest.mark.parametrize("form", [[], ["create"]])
def test_existing_region_is_refused_and_left_alone(form: list[str], regions: Path, nobody_conf: str) -> None:
    path = regions / "orionsock3"
    path.write_bytes(b"precious")
    result = shm(*form, "-i", "3", "-s", "16", "-d", str(regions))
    assert_clean_failure(result)
    assert result.stderr.strip() == f"{path} has already exists."
    assert path.read_bytes() == b"precious"


def test_existing_directory_is_refused(regions: Path) -> None:
    (regions / "orionsock0").mkdir()  # what Docker leaves behind
    result = shm("-d", str(regions))
    assert_clean_failure(result)
    assert result.stderr.strip() == f"{regions}/orionsock0 has already exists."


def test_failed_sizing_removes_the_half_made_file(regions: Path) -> None:
    def small_files() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (MIB, MIB))
    result = shm("-i", "2", "-s", "16", "-d", str(regions), preexec_fn=small_files)
    assert_clean_failure(result)
    assert result.stderr.strip() == f"Error. Fail to create {regions}/orionsock2 with size 16 MiB."
    assert not list(regions.iterdir())


# --- create: format, ownership, mode -------------------------------------------------------------------------
def test_create_formats_and_keeps_0666_when_the_qemu_user_is_missing(regions: Path, nobody_conf: str) -> None:
    result = shm("create", "-i", "4", "-s", "16", "-d", str(regions), "--config", nobody_conf)
    assert result.returncode == 0, result.stderr
    path = regions / "orionsock4"
    lines = result.stdout.splitlines()
    assert lines[0] == f"{path} is successfully created."
    assert "mode 0666" in lines[1] and "8 channels" in lines[1]
    info = path.stat()
    assert info.st_size == 16 * MIB
    assert info.st_mode & 0o7777 == 0o666
    assert info.st_uid == os.geteuid()
    with Region.open(path) as region:
        g = region.geometry
        assert (g.region_size, g.channel_count, g.name) == (16 * MIB, 8, "orionsock4")
        assert region.agent_words() == (0, 0, layout.AGENT_NEVER)


@as_root
def test_create_hands_the_region_to_the_configured_user(regions: Path, root_conf: str) -> None:
    result = shm("create", "-i", "5", "-s", "16", "-d", str(regions), "--config", root_conf)
    assert result.returncode == 0, result.stderr
    assert "owner root:root, mode 0660" in result.stdout
    info = (regions / "orionsock5").stat()
    assert (info.st_uid, info.st_gid, info.st_mode & 0o7777) == (0, 0, 0o660)


def test_mode_and_channels_options(regions: Path, nobody_conf: str) -> None:
    result = shm("create", "-i", "6", "-s", "32", "--channels", "2", "--mode", "0600", "-d", str(regions),
                 "--config", nobody_conf)
    assert result.returncode == 0, result.stderr
    path = regions / "orionsock6"
    assert path.stat().st_mode & 0o7777 == 0o600
    with Region.open(path) as region:
        assert region.geometry.channel_count == 2


def test_size_default_comes_from_the_config(regions: Path, tmp_path: Path) -> None:
    conf = tmp_path / "sized.conf"
    conf.write_text(f'[server-shm]\n  shm_buffer_size = 20\n  shm_user_name = "{NOBODY}"\n')
    assert shm("create", "-i", "1", "-d", str(regions), "--config", str(conf)).returncode == 0
    assert (regions / "orionsock1").stat().st_size == 20 * MIB


@pytest.mark.parametrize("channels", ["0", "257", "256"])
def test_impossible_channel_count_creates_nothing(channels: str, regions: Path, nobody_conf: str) -> None:
    result = shm("create", "-s", "16", "--channels", channels, "-d", str(regions), "--config", nobody_conf)
    assert_clean_failure(result)
    assert "Cannot lay out" in result.stderr
    assert not list(regions.iterdir())


def test_create_in_dev_shm_through_posix_ipc(nobody_conf: str) -> None:
    index = next(i for i in (random.randrange(9000, 10000) for _ in range(100))
                 if not os.path.lexists(f"/dev/shm/orionsock{i}"))
    path = Path(f"/dev/shm/orionsock{index}")
    try:
        result = shm("create", "-i", str(index), "-s", "16", "--config", nobody_conf)
        assert result.returncode == 0, result.stderr
        assert result.stdout.splitlines()[0] == f"{path} is successfully created."
        assert path.stat().st_size == 16 * MIB and path.stat().st_mode & 0o7777 == 0o666
        with Region.open(path) as region:
            assert region.geometry.name == f"orionsock{index}"
        listing = shm("list", "--config", nobody_conf)
        assert listing.returncode == 0
        assert any(line.split()[0] == str(index) and "formatted" in line for line in listing.stdout.splitlines())
        again = shm("-i", str(index), "-s", "16")
        assert again.stderr.strip() == f"{path} has already exists."
        removed = shm("remove", str(index))
        assert removed.returncode == 0, removed.stderr
        assert not path.exists()
    finally:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def test_create_restores_the_umask(regions: Path) -> None:
    old = os.umask(0o022)
    try:
        create(0, 16, str(regions), settings=ShmSettings(user=NOBODY))
        assert os.umask(0o022) == 0o022
    finally:
        os.umask(old)


# --- subcommand argument errors and help --------------------------------------------------------------------
@pytest.mark.parametrize("args", [
    ["remove"], ["inspect", "x"], ["list", "--bogus"], ["create", "--mode", "999"], ["create", "-i", "abc"],
    ["create", "--channels"], ["remove", "1", "2"],
])
def test_bad_subcommand_arguments_exit_1_in_one_line(args: list[str]) -> None:
    result = shm(*args)
    assert_clean_failure(result)
    assert f"orion-shm {args[0]}" in result.stderr and "-h" in result.stderr
    assert "usage:" not in result.stderr


def test_help_commands() -> None:
    overview = shm("help")
    assert overview.returncode == 0
    for command in ("create", "list", "inspect", "remove"):
        assert f"orion-shm {command}" in overview.stdout
    sub = shm("help", "remove")
    assert sub.returncode == 0 and "--force" in sub.stdout
    assert shm("create", "-h").returncode == 0
    assert_clean_failure(shm("help", "bogus"))


# --- list and inspect ----------------------------------------------------------------------------------------
def make_mixed(regions: Path, conf: str) -> None:
    assert shm("create", "-i", "1", "-s", "16", "-d", str(regions), "--config", conf).returncode == 0
    subprocess.run(["truncate", "-s", "16M", str(regions / "orionsock2")], check=True)
    (regions / "orionsock3").write_bytes(random.Random(3).randbytes(65536))
    (regions / "orionsockX").write_bytes(b"not a region name")


def test_list(regions: Path, nobody_conf: str) -> None:
    make_mixed(regions, nobody_conf)
    result = shm("list", "-d", str(regions))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert [line.split()[0] for line in lines] == ["1", "2", "3"]
    user = pwd.getpwuid(os.geteuid()).pw_name
    assert "16 MiB" in lines[0] and f"{user}:" in lines[0] and "0666" in lines[0]
    assert lines[0].endswith("formatted") and "agent never" in lines[0] and "channels 0/8 in use" in lines[0]
    assert "not formatted" in lines[1] and "no header yet" in lines[1]
    assert "invalid: not an Orion region" in lines[2]


def test_list_shows_users(regions: Path, nobody_conf: str) -> None:
    make_mixed(regions, nobody_conf)
    with holder(regions / "orionsock1") as proc:
        line = shm("list", "-d", str(regions)).stdout.splitlines()[0]
        assert f"users {proc.pid}" in line


def test_list_empty_and_missing_directory(regions: Path, tmp_path: Path) -> None:
    result = shm("list", "-d", str(regions))
    assert (result.returncode, result.stdout) == (0, f"No Orion regions (orionsock<N>) in {regions}.\n")
    assert_clean_failure(shm("list", "-d", str(tmp_path / "nowhere")))


def test_inspect_formatted(regions: Path, nobody_conf: str) -> None:
    make_mixed(regions, nobody_conf)
    with holder(regions / "orionsock1") as proc:
        result = shm("inspect", "1", "-d", str(regions))
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "16777216 bytes (16 MiB)" in out and "mode      0666" in out and "status    formatted" in out
    for field in dataclasses.fields(Geometry):
        assert re.search(rf"^  {field.name}\s+\S", out, re.M), field.name
    assert re.search(r"^  state\s+never \(0\)", out, re.M)
    assert re.search(r"^  heartbeat\s+0", out, re.M)
    channel_lines = [line for line in out.splitlines() if re.match(r"^\s+\d+ free\s+never claimed$", line)]
    assert len(channel_lines) == 8  # a fresh region: every channel free and never claimed
    assert re.search(rf"^\s+{proc.pid}\s+\S*python", out, re.M)


@pytest.mark.parametrize(("index", "reason"), [(2, "no header yet"), (3, "not an Orion region")])
def test_inspect_unformatted_or_invalid_fails_but_shows_the_file(index: int, reason: str, regions: Path,
                                                                 nobody_conf: str) -> None:
    make_mixed(regions, nobody_conf)
    result = shm("inspect", str(index), "-d", str(regions))
    assert_clean_failure(result)
    assert reason in result.stderr
    assert "mode      0644" in result.stdout and "owner" in result.stdout and "size" in result.stdout


def test_inspect_missing(regions: Path) -> None:
    result = shm("inspect", "9", "-d", str(regions))
    assert_clean_failure(result)
    assert result.stderr.strip() == f"Error. {regions}/orionsock9 does not exist."


# --- remove --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("how", ["map", "fd"])
def test_remove_refuses_while_used_then_forces(how: str, regions: Path, nobody_conf: str) -> None:
    assert shm("create", "-i", "1", "-s", "16", "-d", str(regions), "--config", nobody_conf).returncode == 0
    path = regions / "orionsock1"
    with holder(path, how) as proc:
        assert users_of(str(path))[0][0] == proc.pid
        refused = shm("remove", "1", "-d", str(regions))
        assert_clean_failure(refused)
        assert f"pid {proc.pid}" in refused.stderr and "--force" in refused.stderr
        assert path.exists()
        forced = shm("remove", "1", "-d", str(regions), "--force")
        assert (forced.returncode, forced.stdout) == (0, f"{path} is removed.\n")
        assert not path.exists()


def test_remove_refuses_while_a_live_agent_serves(regions: Path, nobody_conf: str) -> None:
    assert shm("create", "-i", "1", "-s", "16", "-d", str(regions), "--config", nobody_conf).returncode == 0
    path = regions / "orionsock1"
    agent = subprocess.Popen(["sleep", "120"])
    try:
        with Region.open(path) as region:
            region.set_agent(pid=agent.pid, state=layout.AGENT_SERVING)
        refused = shm("remove", "1", "-d", str(regions))
        assert_clean_failure(refused)
        assert f"host agent (pid {agent.pid})" in refused.stderr
    finally:
        agent.kill()
        agent.wait()
    assert shm("remove", "1", "-d", str(regions)).returncode == 0  # the agent's pid is gone: stale state
    assert not path.exists()


def test_remove_unused_and_missing(regions: Path, nobody_conf: str) -> None:
    make_mixed(regions, nobody_conf)
    for index in (1, 2, 3):
        assert shm("remove", str(index), "-d", str(regions)).returncode == 0
    assert sorted(p.name for p in regions.iterdir()) == ["orionsockX"]
    missing = shm("remove", "1", "-d", str(regions))
    assert_clean_failure(missing)
    assert missing.stderr.strip() == f"Error. {regions}/orionsock1 does not exist."


def test_remove_the_directory_docker_leaves(regions: Path) -> None:
    (regions / "orionsock0").mkdir()
    listing = shm("list", "-d", str(regions)).stdout
    assert "is a directory" in listing and "orion-shm remove 0" in listing
    assert shm("remove", "0", "-d", str(regions)).returncode == 0
    assert not (regions / "orionsock0").exists()


def test_users_of_skips_this_process(regions: Path) -> None:
    create(0, 16, str(regions), settings=ShmSettings(user=NOBODY))
    with Region.open(regions / "orionsock0"):
        assert users_of(str(regions / "orionsock0")) == []
    assert users_of(str(regions / "missing")) == []


# --- configuration -------------------------------------------------------------------------------------------
ORION_TEMPLATE = """\
; this is an example of orion configuration
[server]
    listen_port = 9960
    bind_addr = 127.0.0.1
    enable_kvm = "false"
    enable_shm = "true"

[server-nccl]
    comm_id = "127.0.0.1:9970"

[server-shm]
    shm_path_base = "/dev/shm/"
    shm_group_name = "kvm"
    shm_user_name = "libvirt-qemu"
    shm_buffer_size = 128

[controller]
\tcontroller_addr = 127.0.0.1:9123
"""


def test_load_ini_reads_orions_template(tmp_path: Path) -> None:
    conf = tmp_path / "server.conf"
    conf.write_text(ORION_TEMPLATE)
    data = load_ini(str(conf))
    assert data["server"] == {"listen_port": "9960", "bind_addr": "127.0.0.1", "enable_kvm": "false",
                              "enable_shm": "true"}
    assert data["server-nccl"]["comm_id"] == "127.0.0.1:9970"
    assert data["controller"]["controller_addr"] == "127.0.0.1:9123"
    assert ShmSettings.load(str(conf)) == ShmSettings()


def test_load_ini_uneven_indentation_is_not_a_continuation(tmp_path: Path) -> None:
    conf = tmp_path / "c.conf"
    conf.write_text('[server-shm]\n  shm_user_name = "qemu"\n      shm_group_name = qemu   ; comment\n')
    assert ShmSettings.load(str(conf)) == ShmSettings(user="qemu", group="qemu")


def test_load_ini_missing_file_means_defaults(tmp_path: Path) -> None:
    assert load_ini(str(tmp_path / "none.conf")) == {}
    assert ShmSettings.load(str(tmp_path / "none.conf")) == ShmSettings()


@pytest.mark.parametrize(("text", "line"), [
    ("[server]\n  listen_port = 1\n  garbage line\n", 3),
    ("listen_port = 1\n[server]\n", 1),
])
def test_load_ini_malformed_names_file_and_line(text: str, line: int, tmp_path: Path) -> None:
    conf = tmp_path / "bad.conf"
    conf.write_text(text)
    with pytest.raises(ConfigError, match=rf"{re.escape(str(conf))}, line {line}:"):
        load_ini(str(conf))


def test_load_ini_unreadable(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_ini(str(tmp_path))


@pytest.mark.parametrize("value", ["abc", "-1", "1.5", "4294967296", '""'])
def test_buffer_size_must_be_unsigned(value: str, tmp_path: Path, regions: Path) -> None:
    conf = tmp_path / "s.conf"
    conf.write_text(f"[server-shm]\nshm_buffer_size = {value}\n")
    wording = 'Invalid parameter shm_buffer_size [server-shm]. Type "unsigned int" is expected.'
    with pytest.raises(ConfigError, match=re.escape(wording)):
        ShmSettings.load(str(conf))
    result = shm("create", "-d", str(regions), "--config", str(conf))
    assert_clean_failure(result)
    assert wording in result.stderr and str(conf) in result.stderr
    assert not list(regions.iterdir())


def test_create_api_raises_orions_messages(regions: Path) -> None:
    with pytest.raises(ShmError, match=re.escape(INDEX_ERROR)):
        create(10000, 16, str(regions))


# --- property: no argument text crashes Orion's form ----------------------------------------------------------
@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("orion-shm-prop")


@settings(max_examples=60, deadline=None)
@given(text=st.text(max_size=12).filter(lambda s: re.fullmatch(r"\s*[+-]?\d+\s*", s) is None and "\0" not in s))
def test_any_non_integer_index_is_a_clean_error(scratch: Path, text: str) -> None:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(["-i", text, "-d", str(scratch)])
    assert status == 1
    assert "for -i" in err.getvalue()
    assert list(scratch.iterdir()) == []
