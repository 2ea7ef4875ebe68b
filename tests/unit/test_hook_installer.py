"""`orion-hooks install/uninstall/status` into a temporary root (never the real /etc/libvirt/hooks).

Chaining is checked by running the installed files the way libvirt 9.0's virHookCall does (`run_like_libvirt`
below): hooks/qemu first, then each executable regular file directly in hooks/qemu.d/ in strcmp order, every
one with the same arguments and the same stdin. A user's existing hook is a real script that records both.
"""
from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from libvirt_hooks import cli, installer

HOOKS = "etc/libvirt/hooks"
RECORDER = """#!/bin/sh
# a user's own qemu hook: records what libvirt gave it
printf '%s\\n' "$@" > {rec}/args
cat > {rec}/stdin
"""
DOMAIN = """<domain type='qemu'><name>g1</name><devices>
<shmem name='orionsock9201'><model type='ivshmem-plain'/><size unit='M'>32</size>
<alias name='ua-orion-orionsock9201'/></shmem>
</devices></domain>
"""


def run_like_libvirt(root: Path, args: list[str], stdin: bytes) -> int:
    """virHookCall for the qemu driver, in Python: the worst (lowest) status of all hooks, 0 if all succeed."""
    hooks = root / HOOKS
    scripts = [hooks / "qemu"] if (hooks / "qemu").is_file() and os.access(hooks / "qemu", os.X_OK) else []
    if (hooks / "qemu.d").is_dir():
        scripts += sorted((p for p in (hooks / "qemu.d").iterdir() if p.is_file() and os.access(p, os.X_OK)),
                          key=lambda p: os.fsencode(p.name))
    status = 0
    for script in scripts:  # all run, even after a failure, as in libvirt
        result = subprocess.run([str(script), *args], input=stdin, capture_output=True, timeout=60, cwd="/",
                                env={"PATH": "/usr/bin:/bin", "LC_ALL": "C"})
        if result.returncode:
            print(f"{script} failed with {result.returncode}: {result.stderr.decode()}")
            status = result.returncode
    return status


def snapshot(root: Path, mtimes: bool = True) -> dict[str, tuple[int, bytes | None, int]]:
    """Every path under `root`: mode, content (files) and file mtimes: equal snapshots mean nothing changed
    (without mtimes: everything is as it was)."""
    out = {}
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        content = path.read_bytes() if path.is_file() and not path.is_symlink() else None
        mtime = st.st_mtime_ns if content is not None and mtimes else 0
        out[str(path.relative_to(root))] = (st.st_mode, content, mtime)
    return out


def orion_hooks(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = cli.main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture
def root(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    (root / "etc/libvirt").mkdir(parents=True)
    return root


@pytest.fixture
def conf(tmp_path: Path) -> Path:
    shm = tmp_path / "shm"
    shm.mkdir()
    conf = tmp_path / "server.conf"
    conf.write_text(f'[server-shm]\n    shm_path_base = "{shm}/"\n    shm_user_name = "nobody"\n'
                    '    shm_group_name = "nogroup"\n')
    return conf


def install_args(root: Path, conf: Path) -> list[str]:
    return ["install", "--root", str(root), "--config", str(conf), "--pid-file", str(conf.parent / "oriond.pid")]


def test_install_chains_an_existing_hook_which_still_gets_the_same_args_and_stdin(
        root: Path, conf: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rec = tmp_path / "rec"
    rec.mkdir()
    existing = root / HOOKS / "qemu"
    existing.parent.mkdir(parents=True)
    existing.write_text(RECORDER.format(rec=rec))
    existing.chmod(0o755)
    before = existing.read_bytes(), existing.stat().st_mode

    code, out, _ = orion_hooks(capsys, *install_args(root, conf))
    assert code == 0
    assert "left as it is" in out
    assert installer.RESTART_FIRST not in out  # libvirtd already runs qemu hooks: it needs no restart
    assert (existing.read_bytes(), existing.stat().st_mode) == before

    args = ["g1", "prepare", "begin", "-"]
    assert run_like_libvirt(root, args, DOMAIN.encode()) == 0
    assert (rec / "args").read_text().splitlines() == args
    assert (rec / "stdin").read_bytes() == DOMAIN.encode()
    region = conf.parent / "shm" / "orionsock9201"  # and our hook ran too
    assert region.stat().st_size == 32 << 20

    assert run_like_libvirt(root, ["g1", "release", "end", "-"], DOMAIN.encode()) == 0
    assert (rec / "args").read_text().splitlines() == ["g1", "release", "end", "-"]
    assert not region.exists()


def test_install_twice_changes_nothing_and_uninstall_restores(
        root: Path, conf: Path, capsys: pytest.CaptureFixture[str]) -> None:
    existing = root / HOOKS / "qemu"
    existing.parent.mkdir(parents=True)
    existing.write_text("#!/bin/sh\nexit 0\n")
    existing.chmod(0o750)
    original = snapshot(root)

    assert orion_hooks(capsys, *install_args(root, conf))[0] == 0
    installed = snapshot(root)
    code, out, _ = orion_hooks(capsys, *install_args(root, conf))
    assert code == 0 and "nothing changed" in out
    assert snapshot(root) == installed

    hook = root / HOOKS / "qemu.d" / installer.HOOK_NAME
    assert stat.S_IMODE(hook.stat().st_mode) == 0o755
    assert orion_hooks(capsys, "uninstall", "--root", str(root))[0] == 0
    assert snapshot(root) == original


def test_first_hook_on_a_host_says_to_restart_libvirtd_and_uninstall_leaves_no_trace(
        root: Path, conf: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fake_libvirtd(root, 1_700_000_300)  # running since before any hook
    original = snapshot(root)
    code, out, _ = orion_hooks(capsys, *install_args(root, conf))
    assert code == 0
    assert installer.RESTART_FIRST in out and "pid 4242" in out
    assert "AppArmor is not active here" in out
    assert orion_hooks(capsys, "status", "--root", str(root))[0] == 1  # until libvirtd is restarted
    assert orion_hooks(capsys, "uninstall", "--root", str(root))[0] == 0
    assert snapshot(root) == original
    assert orion_hooks(capsys, "status", "--root", str(root))[0] == 1


def test_first_hook_with_libvirtd_not_running_asks_for_no_restart(
        root: Path, conf: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """setup.sh installs the hook before it starts libvirtd: no restart to ask for (issue 11's confusing line)."""
    code, out, _ = orion_hooks(capsys, *install_args(root, conf))
    assert code == 0 and installer.RESTART_FIRST not in out and "libvirtd is not running" in out, out
    assert orion_hooks(capsys, "status", "--root", str(root))[0] == 0


def test_a_foreign_file_with_our_name_is_never_overwritten(
        root: Path, conf: Path, capsys: pytest.CaptureFixture[str]) -> None:
    foreign = root / HOOKS / "qemu.d" / installer.HOOK_NAME
    foreign.parent.mkdir(parents=True)
    foreign.write_text("#!/bin/sh\necho mine\n")
    code, _, err = orion_hooks(capsys, *install_args(root, conf))
    assert code == 1 and "not ours" in err
    assert orion_hooks(capsys, "uninstall", "--root", str(root))[0] == 1
    assert foreign.read_text() == "#!/bin/sh\necho mine\n"


def test_an_interpreter_without_the_project_is_refused_before_anything_is_written(
        root: Path, conf: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\necho 'ModuleNotFoundError: No module named libvirt_hooks' >&2\nexit 1\n")
    python.chmod(0o755)
    original = snapshot(root)
    code, _, err = orion_hooks(capsys, *install_args(root, conf), "--python", str(python))
    assert code == 1 and "--python" in err and "No module named libvirt_hooks" in err
    assert snapshot(root) == original


def test_the_installed_hook_uses_the_given_interpreter(root: Path, conf: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    assert orion_hooks(capsys, *install_args(root, conf), "--python", sys.executable)[0] == 0
    text = (root / HOOKS / "qemu.d" / installer.HOOK_NAME).read_text()
    assert f"exec {sys.executable} -I -m libvirt_hooks.qemu_hook" in text
    assert f"ORION_SERVER_CONF={conf};" in text


def apparmor(root: Path, enabled: str, local_include: bool) -> tuple[Path, Path]:
    (root / "sys/module/apparmor/parameters").mkdir(parents=True)
    (root / "sys/module/apparmor/parameters/enabled").write_text(enabled + "\n")
    abstraction = root / installer.ABSTRACTION
    abstraction.parent.mkdir(parents=True)
    include = "  #include <local/abstractions/libvirt-qemu>\n" if local_include else ""
    abstraction.write_text("  /{dev,run}/shm r,\n  owner /{dev,run}/shm/spice.* rw,\n" + include)
    local = root / installer.LOCAL_ABSTRACTION
    local.parent.mkdir(parents=True)
    local.write_text("# Site-specific additions and overrides for 'abstractions/libvirt-qemu'\n")
    return abstraction, local


@pytest.mark.parametrize("local_include", [True, False], ids=["local-include", "abstraction-itself"])
def test_apparmor_rule_where_apparmor_is_active(root: Path, conf: Path, local_include: bool,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    abstraction, local = apparmor(root, "Y", local_include)
    original = snapshot(root, mtimes=False)
    assert orion_hooks(capsys, *install_args(root, conf))[0] == 0
    target, untouched = (local, abstraction) if local_include else (abstraction, local)
    rule = f"{conf.parent / 'shm'}/orionsock* rw,"
    assert target.read_text().count(rule) == 1
    assert rule not in untouched.read_text()
    installed = snapshot(root)
    assert orion_hooks(capsys, *install_args(root, conf))[0] == 0
    assert snapshot(root) == installed
    ok, lines = installer.status(str(root))
    assert ok and any("rule present" in line for line in lines)
    assert orion_hooks(capsys, "uninstall", "--root", str(root))[0] == 0
    assert snapshot(root, mtimes=False) == original


def test_no_apparmor_rule_where_apparmor_is_off(root: Path, conf: Path, capsys: pytest.CaptureFixture[str]) -> None:
    abstraction, local = apparmor(root, "N", True)
    before = abstraction.read_bytes(), local.read_bytes()
    code, out, _ = orion_hooks(capsys, *install_args(root, conf))
    assert code == 0 and "no AppArmor rule installed" in out
    assert (abstraction.read_bytes(), local.read_bytes()) == before


def fake_libvirtd(root: Path, started: float, pid: int = 4242, comm: str = "libvirtd",
                  boot: float = 1_700_000_000.0) -> None:
    """A libvirtd started at `started` (epoch seconds) on a host booted at `boot`: its pid file, written as the
    daemon starts (so with that time), and the /proc entries a kernel shows for it. As on a real host, /proc/stat's
    btime is the boot time in whole seconds and /proc/PID/stat's starttime whole clock ticks since boot."""
    ticks = int((started - boot) * os.sysconf("SC_CLK_TCK"))
    (root / "run").mkdir(exist_ok=True)
    pid_file = root / "run/libvirtd.pid"
    pid_file.write_text(f"{pid}\n")
    os.utime(pid_file, ns=(round(started * 1e9), round(started * 1e9)))
    proc = root / "proc" / str(pid)
    proc.mkdir(parents=True, exist_ok=True)
    (proc / "comm").write_text(comm + "\n")
    (proc / "stat").write_text(f"{pid} ({comm}) S 1 {pid} {pid} 0 -1 4194560 " + "0 " * 12 + f"{ticks} 0 0\n")
    (root / "proc/stat").write_text(f"cpu 1 2 3\nbtime {int(boot)}\n")
@pytest.mark.parametrize("started_after, other_hook_before, runs", [
    (True, False, True),     # started after our hook appeared
    (False, False, False),   # started before any hook: runs none until restarted
    (False, True, True),     # started before ours, but another qemu hook was already there
])
def test_status_says_whether_libvirtd_runs_the_hook(root: Path, conf: Path, capsys: pytest.CaptureFixture[str],
                                                    started_after: bool, other_hook_before: bool,
                                                    runs: bool) -> None:
    if other_hook_before:
        user_hook = root / HOOKS / "qemu"
        user_hook.parent.mkdir(parents=True, exist_ok=True)
        user_hook.write_text("#!/bin/sh\n")
        user_hook.chmod(0o755)
        os.utime(user_hook, (1_700_000_100, 1_700_000_100))
    assert orion_hooks(capsys, *install_args(root, conf))[0] == 0
    hook = root / HOOKS / "qemu.d" / installer.HOOK_NAME
    os.utime(hook, (1_700_000_500, 1_700_000_500))
    fake_libvirtd(root, 1_700_000_600 if started_after else 1_700_000_300)
    code, out, _ = orion_hooks(capsys, "status", "--root", str(root))
    assert code == (0 if runs else 1), out
    assert ("pid 4242 runs qemu hooks" in out) is runs and ("restart it" in out) is not runs, out


def test_updating_the_hook_needs_no_restart(root: Path, conf: Path, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """A libvirtd that runs hooks runs the updated file too: status must not ask for a restart after an update."""
    assert orion_hooks(capsys, *install_args(root, conf))[0] == 0
    hook = root / HOOKS / "qemu.d" / installer.HOOK_NAME
    os.utime(hook, (1_700_000_500, 1_700_000_500))
    fake_libvirtd(root, 1_700_000_600)
    other = tmp_path / "other.conf"
    other.write_text(conf.read_text())
    code, out, _ = orion_hooks(capsys, "install", "--root", str(root), "--config", str(other),
                               "--pid-file", str(conf.parent / "oriond.pid"))
    assert code == 0 and "updated" in out and str(other) in hook.read_text()
    code, out, _ = orion_hooks(capsys, "status", "--root", str(root))
    assert code == 0 and "pid 4242 runs qemu hooks" in out, out


def test_status_without_libvirtd_running(root: Path, conf: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert orion_hooks(capsys, *install_args(root, conf))[0] == 0
    fake_libvirtd(root, 1_700_000_600, comm="bash")  # a stale pid file whose pid now belongs to another program
    code, out, _ = orion_hooks(capsys, "status", "--root", str(root))
    assert code == 0 and "libvirtd: not running" in out, out


def test_a_libvirtd_started_a_moment_after_the_hook_runs_it_whatever_the_boot_time_fraction(
        root: Path, conf: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 11: setup.sh started libvirtd 0.03 s after writing the hook, on a host booted at .9 of a second.
    /proc/stat's btime says .0, so a start time computed from it is 0.9 s early, before the hook: status asked for
    a restart that had just happened. The answer must come from something exact, whatever the fraction."""
    assert orion_hooks(capsys, *install_args(root, conf))[0] == 0
    hook = root / HOOKS / "qemu.d" / installer.HOOK_NAME
    written = 1_700_000_500.5
    os.utime(hook, ns=(round(written * 1e9), round(written * 1e9)))
    fake_libvirtd(root, written + 0.03, boot=1_700_000_000.9)
    code, out, _ = orion_hooks(capsys, "status", "--root", str(root))
    assert code == 0 and "pid 4242 runs qemu hooks" in out, out

    fake_libvirtd(root, written - 0.03, boot=1_700_000_000.1)  # and 0.03 s before the hook: it runs none
    code, out, _ = orion_hooks(capsys, "status", "--root", str(root))
    assert code == 1 and "pid 4242 started before any qemu hook was installed" in out, out


@pytest.mark.parametrize("systemd", [True, False], ids=["systemd", "no-systemd"])
def test_restart_advice_names_systemctl_only_where_systemd_runs(root: Path, conf: Path, systemd: bool,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    if systemd:
        (root / "run/systemd/system").mkdir(parents=True)
    fake_libvirtd(root, 1_700_000_300)  # started before the hook: install and status must say how to restart it
    code, out, _ = orion_hooks(capsys, *install_args(root, conf))
    assert code == 0 and installer.RESTART_FIRST in out, out
    code, status, _ = orion_hooks(capsys, "status", "--root", str(root))
    assert code == 1 and "restart it" in status, status
    for text in (out, status):
        assert ("systemctl restart libvirtd" in text) is systemd, text
        assert ("libvirtd -d" in text) is not systemd, text
    assert "kill 4242" in status or systemd, status
