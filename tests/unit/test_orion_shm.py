"""orion-shm: Orion's exact CLI (help, validation, messages, exit codes), the list/inspect/remove commands,
and the tenant rules (a region is one tenant's: owner and mode at create, who can reach it in list/inspect).

The CLI is run as a real process (`python -m host_agent.admin.shm_cli`) so exit codes and streams are what a user
sees. Regions go to a tmp dir through -d, except the /dev/shm (posix_ipc) cases, which use a random high
index and always clean up.
"""
from __future__ import annotations

import contextlib
import dataclasses
import grp
import io
import os
import pwd
import random
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from host_agent.admin import shm_cli
from host_agent.admin.shm_cli import main
from host_agent.server_conf import ConfigError, ShmSettings, load_ini
from host_agent.shm_admin import ShmError, create, users_of
from ivshmem import layout
from ivshmem.layout import Geometry
from ivshmem.region import Region

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
TENANT_UID = 4242  # a container's uid: need not exist on this host
COMMAND_NAMES = ("create", "list", "inspect", "remove", "attach", "detach", "help")


def shm(*args: str, preexec_fn=None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "host_agent.admin.shm_cli", *args], cwd=REPO, capture_output=True,
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
def regions(open_shm_dir: Path) -> Path:
    return open_shm_dir


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
@pytest.mark.parametrize("flag", ["-h", "--help"])
def test_help_is_orions_text_then_the_commands(flag: str) -> None:
    result = shm(flag)
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout.startswith(HELP)  # Orion's exact text first: scripts may compare it
    for command in COMMAND_NAMES:
        assert f"orion-shm {command}" in result.stdout[len(HELP):], command
    assert "--owner" in result.stdout


@pytest.mark.parametrize("args", [["-x"], ["--bogus"], ["-i"], ["-i", "1", "-q"]])
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
    assert (result.returncode, result.stdout) == (0, f"{path} is successfully created.\n")
    assert path.stat().st_size == 128 * MIB
    assert result.stderr == "" if qemu_user_exists() else result.stderr.startswith("Note: only")
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


def qemu_user_exists() -> bool:
    settings = ShmSettings()
    try:
        pwd.getpwnam(settings.user)
        grp.getgrnam(settings.group)
    except KeyError:
        return False
    return True


@pytest.mark.parametrize(("size", "nearest"), [("100", "use 64 or 128"), ("17", "use 16 or 32"),
                                               ("1048575", "use 524288 or 1048576")])
@pytest.mark.parametrize("form", [[], ["create"]])
def test_a_size_qemu_cannot_map_is_refused_naming_the_nearest(size: str, nearest: str, form: list[str],
                                                                regions: Path) -> None:
    result = shm(*form, "-i", "1", "-s", size, "-d", str(regions))
    assert_clean_failure(result)
    assert f"size {size} MiB" in result.stderr and "power of two" in result.stderr and nearest in result.stderr
    assert not list(regions.iterdir())


# --- create: format, ownership, mode -------------------------------------------------------------------------
def test_create_keeps_the_region_private_when_the_qemu_user_is_missing(regions: Path, nobody_conf: str) -> None:
    result = shm("create", "-i", "4", "-s", "16", "-d", str(regions), "--config", nobody_conf)
    assert result.returncode == 0, result.stderr
    path = regions / "orionsock4"
    lines = result.stdout.splitlines()
    assert lines[0] == f"{path} is successfully created."
    assert "mode 0600 (tenant only)" in lines[1] and "8 channels" in lines[1]
    note = result.stderr.strip()
    assert len(note.splitlines()) == 1 and note.startswith("Note: only") and "--owner" in note, note
    info = path.stat()
    assert info.st_size == 16 * MIB
    assert info.st_mode & 0o7777 == 0o600
    assert info.st_uid == os.geteuid()
    with Region.open(path) as region:
        g = region.geometry
        assert (g.region_size, g.channel_count, g.name) == (16 * MIB, 8, "orionsock4")
        assert region.agent_words() == (0, 0, layout.AGENT_NEVER)


def test_legacy_form_keeps_the_region_private_too(regions: Path, nobody_conf: str,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shm_cli, "SERVER_CONF", nobody_conf)  # Orion's form has no --config
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        assert main(["-i", "2", "-s", "16", "-d", str(regions)]) == 0
    assert out.getvalue() == f"{regions}/orionsock2 is successfully created.\n"
    assert err.getvalue().startswith("Note: only") and "--owner" in err.getvalue()
    assert (regions / "orionsock2").stat().st_mode & 0o7777 == 0o600


@as_root
@pytest.mark.parametrize(("owner", "ids", "mode"), [
    (str(TENANT_UID), (TENANT_UID, TENANT_UID), 0o600),
    (f"{TENANT_UID}:{TENANT_UID + 1}", (TENANT_UID, TENANT_UID + 1), 0o660),
    ("nobody", (pwd.getpwnam("nobody").pw_uid, pwd.getpwnam("nobody").pw_gid), 0o600),
    ("nobody:root", (pwd.getpwnam("nobody").pw_uid, 0), 0o660),
])
def test_owner_gives_the_region_to_one_tenant(owner: str, ids: tuple[int, int], mode: int, regions: Path,
                                              root_conf: str) -> None:
    result = shm("create", "-i", "3", "-s", "16", "-d", str(regions), "--owner", owner, "--config", root_conf)
    assert (result.returncode, result.stderr) == (0, ""), result.stderr
    info = (regions / "orionsock3").stat()
    assert (info.st_uid, info.st_gid, info.st_mode & 0o7777) == (*ids, mode)
    assert f"mode {mode:04o} (tenant only)" in result.stdout


@pytest.mark.parametrize(("owner", "words"), [
    (NOBODY, f"No user '{NOBODY}'"), (f"nobody:{NOBODY}", f"No group '{NOBODY}'"), ("1:", "USER:GROUP"),
    (":1", "USER:GROUP"), ("99999999999", "at most"),
])
def test_a_bad_owner_is_one_line_and_creates_nothing(owner: str, words: str, regions: Path) -> None:
    result = shm("create", "-i", "3", "-s", "16", "-d", str(regions), "--owner", owner)
    assert_clean_failure(result)
    assert words in result.stderr and "--owner" in result.stderr
    assert not list(regions.iterdir())


@as_root
def test_owner_that_cannot_be_given_removes_the_file() -> None:
    """Not root: giving a region to another uid fails, in one line, and leaves no file behind."""
    nobody = pwd.getpwnam("nobody")

    def become_nobody() -> None:
        os.setgid(nobody.pw_gid)
        os.setuid(nobody.pw_uid)
    regions = Path(tempfile.mkdtemp(prefix="orion-test-", dir="/dev/shm"))  # reachable by nobody
    try:
        regions.chmod(0o777)
        result = shm("create", "-i", "3", "-s", "16", "-d", str(regions), "--owner", str(TENANT_UID),
                     preexec_fn=become_nobody)
        assert_clean_failure(result)
        assert f"Cannot give {regions}/orionsock3 to {TENANT_UID}:{TENANT_UID}" in result.stderr
        assert "run as root" in result.stderr
        assert not list(regions.iterdir())
    finally:
        shutil.rmtree(regions)


@pytest.mark.parametrize(("mode", "words"), [("0666", "read and write"), ("0644", "read the sessions"),
                                             ("0662", "write into")])
def test_a_mode_that_lets_others_in_warns_in_one_line(mode: str, words: str, regions: Path,
                                                      nobody_conf: str) -> None:
    result = shm("create", "-i", "1", "-s", "16", "-d", str(regions), "--mode", mode, "--config", nobody_conf,
                 "--owner", str(os.geteuid()))
    assert result.returncode == 0, result.stderr
    warning = result.stderr.strip()
    assert len(warning.splitlines()) == 1 and warning.startswith("Warning: every local user can"), warning
    assert words in warning and f"mode {mode}" in warning
    assert (regions / "orionsock1").stat().st_mode & 0o7777 == int(mode, 8)


def test_in_a_sealed_directory_an_open_mode_reaches_nobody_else(regions: Path, nobody_conf: str) -> None:
    """orion-k8s-plugin's regions: 0666 files in a directory that only its owner may enter."""
    sealed = regions / "k8s"
    sealed.mkdir(mode=0o700)
    result = shm("create", "-i", "1", "-s", "16", "-d", str(sealed), "--mode", "0666", "--config", nobody_conf,
                 "--owner", str(os.geteuid()))
    assert (result.returncode, result.stderr) == (0, ""), result.stderr
    assert "mode 0666 (tenant only)" in result.stdout, result.stdout
    listed = shm("list", "-d", str(sealed))
    assert "tenant only" in listed.stdout and "Warning" not in listed.stdout + listed.stderr, listed


def test_a_private_mode_does_not_warn(regions: Path, nobody_conf: str) -> None:
    result = shm("create", "-i", "1", "-s", "16", "-d", str(regions), "--mode", "0640", "--config", nobody_conf,
                 "--owner", str(os.geteuid()))
    assert (result.returncode, result.stderr) == (0, "")


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
    conf.write_text(f'[server-shm]\n  shm_buffer_size = 32\n  shm_user_name = "{NOBODY}"\n')
    assert shm("create", "-i", "1", "-d", str(regions), "--config", str(conf)).returncode == 0
    assert (regions / "orionsock1").stat().st_size == 32 * MIB


@pytest.mark.parametrize("channels", ["0", "257", "256"])
def test_impossible_channel_count_creates_nothing(channels: str, regions: Path, nobody_conf: str) -> None:
    result = shm("create", "-s", "16", "--channels", channels, "-d", str(regions), "--config", nobody_conf)
    assert_clean_failure(result)
    assert "Cannot lay out" in result.stderr
    assert not list(regions.iterdir())


def free_shm_index() -> int:
    return next(i for i in (random.randrange(9000, 10000) for _ in range(100))
                if not os.path.lexists(f"/dev/shm/orionsock{i}"))


def test_create_in_dev_shm(nobody_conf: str) -> None:
    index = free_shm_index()
    path = Path(f"/dev/shm/orionsock{index}")
    try:
        result = shm("create", "-i", str(index), "-s", "16", "--config", nobody_conf)
        assert result.returncode == 0, result.stderr
        assert result.stdout.splitlines()[0] == f"{path} is successfully created."
        assert path.stat().st_size == 16 * MIB and path.stat().st_mode & 0o7777 == 0o600
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


def test_create_in_dev_shm_needs_no_posix_ipc(nobody_conf: str) -> None:
    """posix_ipc missing (a guest wheel, a broken venv) once surfaced as an ImportError traceback."""
    index = free_shm_index()
    path = Path(f"/dev/shm/orionsock{index}")
    code = ("import sys; sys.modules['posix_ipc'] = None\n"  # `import posix_ipc` now raises ImportError
            "from host_agent.admin.shm_cli import main\n"
            f"sys.exit(main(['create', '-i', '{index}', '-s', '16', '--config', sys.argv[1]]))\n")
    try:
        result = subprocess.run([sys.executable, "-c", code, nobody_conf], cwd=REPO, capture_output=True, text=True,
                                timeout=60)
        assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
        with Region.open(path) as region:
            assert region.geometry.name == f"orionsock{index}"
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
    assert "16 MiB" in lines[0] and f"{user}:" in lines[0] and "0600 tenant only" in lines[0]
    assert lines[0].endswith("formatted") and "agent never" in lines[0] and "channels 0/8 in use" in lines[0]
    assert "not formatted" in lines[1] and "no header yet" in lines[1]
    assert "invalid: not an Orion region" in lines[2]


def test_list_says_who_can_reach_each_region_and_warns(regions: Path, nobody_conf: str) -> None:
    for index, mode in ((1, "0600"), (2, "0660"), (3, "0644"), (4, "0666")):
        made = shm("create", "-i", str(index), "-s", "16", "-d", str(regions), "--config", nobody_conf,
                   "--mode", mode)
        assert made.returncode == 0, made.stderr
    (regions / "orionsock5").write_bytes(b"not a region")  # mode 0644, but no region: nothing serves it
    result = shm("list", "-d", str(regions))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert [m.group(1) for line in lines[:4] if (m := re.search(r"\s0\d{3} ([a-z ]+?)  agent", line))] == [
        "tenant only", "tenant only", "others can read", "others can write"]
    warnings = result.stderr.splitlines()
    assert len(warnings) == 2, warnings
    assert f"{regions}/orionsock3" in warnings[0] and "can read the sessions" in warnings[0]
    assert f"{regions}/orionsock4" in warnings[1] and "can read and write" in warnings[1]
    assert all(w.startswith("Warning: every local user") for w in warnings)


def test_inspect_says_who_can_reach_the_region(regions: Path, nobody_conf: str) -> None:
    for index, mode in ((1, "0600"), (2, "0666")):
        assert shm("create", "-i", str(index), "-s", "16", "-d", str(regions), "--config", nobody_conf,
                   "--mode", mode).returncode == 0
    private = shm("inspect", "1", "-d", str(regions))
    assert (private.returncode, private.stderr) == (0, "")
    assert re.search(r"^  access\s+tenant only$", private.stdout, re.M)
    shared = shm("inspect", "2", "-d", str(regions))
    assert shared.returncode == 0
    assert re.search(r"^  access\s+others can write$", shared.stdout, re.M)
    assert shared.stderr.startswith("Warning: every local user can read and write") and \
        len(shared.stderr.splitlines()) == 1


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
    assert "16777216 bytes (16 MiB)" in out and "mode      0600" in out and "status    formatted" in out
    assert "access    tenant only" in out
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


@contextlib.contextmanager
def serving_agent(path: Path) -> Iterator[tuple[int, int]]:
    """A stand-in for oriond: a process that maps `path`, marks it SERVING under its pid, and forks a session
    worker that maps it too; yields (agent pid, worker pid)."""
    code = ("import mmap, os, sys, time\n"
            "from ivshmem import layout\n"
            "from ivshmem.region import Region\n"
            "region = Region.open(sys.argv[1])\n"
            "region.set_agent(pid=os.getpid(), state=layout.AGENT_SERVING)\n"
            "worker = os.fork()\n"
            "if worker == 0:\n"
            "    time.sleep(120)\n"
            "    os._exit(0)\n"
            "print(worker, flush=True)\n"
            "time.sleep(120)\n")
    proc = subprocess.Popen([sys.executable, "-c", code, str(path)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    worker = 0
    try:
        assert proc.stdout is not None
        worker = int(proc.stdout.readline())
        yield proc.pid, worker
    finally:
        proc.kill()
        proc.wait()
        if worker:
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker, signal.SIGKILL)


def test_remove_while_the_agent_serves_says_how_to_stop_it(regions: Path, nobody_conf: str) -> None:
    """oriond and its session workers map the region: that is 'served', not a client to stop, and the advice
    says how to stop serving it or that --force is safe (oriond lets go of a removed region)."""
    assert shm("create", "-i", "1", "-s", "16", "-d", str(regions), "--config", nobody_conf).returncode == 0
    path = regions / "orionsock1"
    with serving_agent(path) as (agent, worker):
        assert {pid for pid, _ in users_of(str(path))} >= {agent, worker}
        refused = shm("remove", "1", "-d", str(regions))
        assert_clean_failure(refused)
        line = refused.stderr.strip()
        assert f"served by the host agent (pid {agent})" in line and "in use by" not in line, line
        assert "stop oriond" in line and "--region" in line and "--force" in line and "lets go" in line
        with holder(path) as client:
            both = shm("remove", "1", "-d", str(regions))
            assert_clean_failure(both)
            assert f"in use by pid {client.pid} " in both.stderr and f"host agent (pid {agent})" in both.stderr
            assert f"pid {worker}" not in both.stderr
        assert shm("remove", "1", "-d", str(regions), "--force").returncode == 0
    assert not path.exists()


def test_detach_says_how_to_remove_a_region_the_agent_still_serves(regions: Path, nobody_conf: str,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """detach keeps the file and used to advise a plain 'orion-shm remove N', which oriond's serving refuses."""
    gw = pytest.importorskip("host_agent.kvm.region_attach")
    assert shm("create", "-i", "1", "-s", "16", "-d", str(regions), "--config", nobody_conf).returncode == 0
    path = regions / "orionsock1"
    done = gw.Outcome(domain="g1", index=1, size_mib=16, path=str(path), scopes=("config",), changed=True)
    monkeypatch.setattr(gw, "detach_region", lambda *args, **kwargs: done)  # no libvirt: only the last line

    def detach() -> str:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert main(["detach", "g1", "-i", "1"]) == 0
        return out.getvalue().splitlines()[-1]
    with serving_agent(path) as (agent, _worker):
        line = detach()
        # the directory kept (issue 31: the hint used to drop it, so following it acted on /dev/shm's region 1)
        assert f"host agent (pid {agent}) still serves it" in line
        assert f"'orion-shm remove 1 -d {regions} --force'" in line
    assert detach() == (f"The region file {path} is kept; remove it with 'orion-shm remove 1 -d {regions}' when no "
                        "longer needed.")


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
    assert "is a directory" in listing and f"'orion-shm remove 0 -d {regions}'" in listing  # its directory kept
    assert shm("remove", "0", "-d", str(regions)).returncode == 0
    assert not (regions / "orionsock0").exists()


def test_users_of_skips_this_process(regions: Path) -> None:
    create(0, 16, str(regions), settings=ShmSettings(user=NOBODY))
    with Region.open(regions / "orionsock0"):
        assert users_of(str(regions / "orionsock0")) == []
    assert users_of(str(regions / "missing")) == []


# --- configuration -------------------------------------------------------------------------------------------
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
